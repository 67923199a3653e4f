"""1-D convolutions as 2-D ones over a unit height.

The CPU's convolution library call (and the channels-last layout it prefers) takes 2-D
convolutions; 1-D ones (wav2vec2's feature extractor, Whisper's stem, ONNX ``Conv`` on
``[N, C, W]``) would otherwise leave the native program. A non-transposed

    convolution(x: [N, C, W], w: [O, I, K])

becomes ``reshape(convolution(reshape(x, [N, C, 1, W]), reshape(w, [O, I, 1, K])), [N, O, W'])``
with stride, padding and dilation 1 / 0 / 1 along the unit height. The same sums, in the same
library. The reshapes only insert or drop a unit dim: no copy in the program.
"""

from __future__ import annotations

from disc.ir.graph import Graph, Node
from disc.passes.rewrite import New, Replacement, Rewriter, graph_pass, rebuild


def _with_unit_height(rw: Rewriter, v: Node) -> Node:
    """``v`` ([A, B, L]) as [A, B, 1, L]."""
    a, b, length = (rw.add("dim", (v,), {"axis": i}) for i in range(3))
    return rw.add("reshape", (v, a, b, rw.add("index_const", (), {"value": 1}), length))


def _rule(rw: Rewriter, n: Node, cand: Node) -> Replacement | None:
    a = cand.attrs
    if cand.op != "convolution" or a["transposed"] or a["channels_last"] or len(cand.shape) != 3:
        return None
    x, w = cand.inputs
    (stride,), (padding,), (dilation,) = a["stride"], a["padding"], a["dilation"]
    attrs = {**a, "stride": (1, stride), "padding": (0, padding), "dilation": (1, dilation), "output_padding": ()}
    y = rw.add("convolution", (_with_unit_height(rw, x), _with_unit_height(rw, w)), attrs)
    return New("reshape", (y, *(rw.add("dim", (y,), {"axis": i}) for i in (0, 1, 3))))


@graph_pass("conv1d_as_2d")
def conv1d_as_2d(graph: Graph) -> Graph:
    """1-D convolutions become 2-D ones over a unit height (the library's and the layout pass's form)."""
    return rebuild(graph, _rule, strict=False)
