"""Layout assignment: 2-D convolutions run on channels-last activations.

oneDNN's AVX-512 convolutions (and cuDNN's tensor-core ones) want NHWC; given
the frontend's NCHW they reorder the input and the result on every call (on
ResNet-18 at 2x224x224 that was 40 reorders, 3.2 ms of a 30 ms call). This
pass rewrites each 2-D, non-transposed ``convolution(x, w)`` into

    transpose(convolution(transpose(x, [0, 2, 3, 1]), w, channels_last=true), [0, 3, 1, 2])

which computes the same values; the two gradients of a convolution (training's
backward graphs) switch alike, their gy and x read NHWC. The transposes are not meant to survive:
``sink_transposes`` moves each result transpose below the BatchNorm, ReLU,
residual-add and pooling ops that follow, until it meets the next
convolution's input transpose and the pair cancels. What remains is one
transpose of the model's input and one where channels-first values leave the
conv stack (a flatten, a graph output), each a cheap copy kernel.
"""

from __future__ import annotations

from disc.ir.graph import Graph, Node
from disc.passes.rewrite import New, Replacement, Rewriter, graph_pass, rebuild

CONV_OPS = ("convolution", "convolution_backward_input", "convolution_backward_weight")
TO_CHANNELS_LAST = (0, 2, 3, 1)
TO_CHANNELS_FIRST = (0, 3, 1, 2)


def _rule(rw: Rewriter, n: Node, cand: Node) -> Replacement | None:
    a = cand.attrs
    if cand.op not in CONV_OPS or a["channels_last"] or a.get("transposed") or len(cand.shape) != 4:
        return None

    def last(v: Node) -> Node:
        return rw.add("transpose", (v,), {"perm": TO_CHANNELS_LAST})

    attrs = {**a, "channels_last": True}
    if cand.op == "convolution":
        x, w = cand.inputs
        return New("transpose", (rw.add("convolution", (last(x), w), attrs),), {"perm": TO_CHANNELS_FIRST})
    if cand.op == "convolution_backward_input":
        gy, w, *sizes = cand.inputs
        sizes_last = [sizes[i] for i in TO_CHANNELS_LAST]
        gx = rw.add("convolution_backward_input", (last(gy), w, *sizes_last), attrs)
        return New("transpose", (gx,), {"perm": TO_CHANNELS_FIRST})
    x, gy = cand.inputs  # convolution_backward_weight: the weight keeps its layout
    return New("convolution_backward_weight", (last(x), last(gy)), attrs)


@graph_pass("channels_last")
def channels_last(graph: Graph) -> Graph:
    """2-D convolutions read and write NHWC; transposes around them are left for ``sink_transposes``."""
    return rebuild(graph, _rule, strict=False)
