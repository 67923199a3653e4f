"""Layout assignment: 2-D convolutions run on channels-last activations.

oneDNN's AVX-512 convolutions (and cuDNN's tensor-core ones) want NHWC; given
the frontend's NCHW they reorder the input and the result on every call (on
ResNet-18 at 2x224x224 that was 40 reorders, 3.2 ms of a 30 ms call). This
pass rewrites each 2-D, non-transposed ``convolution(x, w)`` into

    transpose(convolution(transpose(x, [0, 2, 3, 1]), w, channels_last=true), [0, 3, 1, 2])

which computes the same values. The transposes are not meant to survive:
``sink_transposes`` moves each result transpose below the BatchNorm, ReLU,
residual-add and pooling ops that follow, until it meets the next
convolution's input transpose and the pair cancels. What remains is one
transpose of the model's input and one where channels-first values leave the
conv stack (a flatten, a graph output), each a cheap copy kernel.
"""

from __future__ import annotations

from disc.ir.graph import Graph, Node
from disc.passes.rewrite import New, Replacement, Rewriter, graph_pass, rebuild

TO_CHANNELS_LAST = (0, 2, 3, 1)
TO_CHANNELS_FIRST = (0, 3, 1, 2)


def _rule(rw: Rewriter, n: Node, cand: Node) -> Replacement | None:
    a = cand.attrs
    if cand.op != "convolution" or a["channels_last"] or a["transposed"] or len(cand.shape) != 4:
        return None
    x, w = cand.inputs
    x_last = rw.add("transpose", (x,), {"perm": TO_CHANNELS_LAST})
    y_last = rw.add("convolution", (x_last, w), {**a, "channels_last": True})
    return New("transpose", (y_last,), {"perm": TO_CHANNELS_FIRST})


@graph_pass("channels_last")
def channels_last(graph: Graph) -> Graph:
    """2-D convolutions read and write NHWC; transposes around them are left for ``sink_transposes``."""
    return rebuild(graph, _rule, strict=False)
