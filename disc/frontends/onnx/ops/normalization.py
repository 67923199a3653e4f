"""Softmax, the normalisations and the losses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from disc.frontends.onnx.importer import OnnxImporter
from disc.frontends.onnx.ops import onnx_op
from disc.frontends.onnx.ops.common import require_divisible
from disc.ir.builder import (
    LoweringError,
    convert,
    elementwise,
    log_softmax,
    mean,
    normalize,
    reduce,
    reshape,
    select,
    softmax,
)
from disc.ir.graph import Node
from disc.ir.registry import normalize_axis
from disc.shape.expr import as_expr, product


@onnx_op("Softmax", "LogSoftmax")
def _softmax(imp: OnnxImporter, node: Any, x: Any, axis: int = -1) -> Node:
    x = imp.tensor(x)
    axis = normalize_axis(axis, x.tensor_type.rank, node.op_type)
    if imp.opset < 13:  # softmax over the flattened trailing dims
        raise LoweringError(f"{node.op_type} before opset 13 (coerced to 2-d)")
    return log_softmax(imp, x, axis) if node.op_type == "LogSoftmax" else softmax(imp, x, axis)


@onnx_op("BatchNormalization")
def _batch_norm(imp: OnnxImporter, node: Any, x: Any, scale: Any, bias: Any, mean_: Any, var: Any, epsilon: float = 1e-5, momentum: float = 0.9, training_mode: int = 0) -> Node | list[Node]:
    """Inference: the given statistics. Training (opset 14 on): the batch's mean and population
    variance over every dim but 1, and the running statistics moved toward them by momentum."""
    training = bool(training_mode) and imp.opset >= 14
    if (training_mode and not training) or (not training and len(node.output) > 1 and any(node.output[1:])):
        raise LoweringError(f"BatchNormalization in training mode at opset {imp.opset} (disc takes opset 14's form, whose outputs are Y and the running statistics)")
    x = imp.tensor(x)
    rank = x.tensor_type.rank

    def channel(v: Any) -> Node:
        return imp.graph.add("broadcast_in_dim", (imp.tensor(v), *imp.sizes(x.shape)), {"dims": (1,)}) if rank > 1 else imp.tensor(v)

    if training:
        others = [d for d in range(rank) if d != 1]
        batch_mean = mean(imp, x, others, False)
        centred = elementwise(imp, "sub", [x, channel(batch_mean)], x.dtype)
        variance = mean(imp, elementwise(imp, "mul", [centred, centred], x.dtype), others, False)
        moved = [elementwise(imp, "add", [elementwise(imp, "mul", [imp.tensor(old), float(momentum)], x.dtype), elementwise(imp, "mul", [new, 1.0 - float(momentum)], x.dtype)], x.dtype) for old, new in ((mean_, batch_mean), (var, variance))]
    else:
        centred, variance = elementwise(imp, "sub", [x, channel(mean_)], x.dtype), imp.tensor(var)
    inv = imp.graph.add("rsqrt", (elementwise(imp, "add", [variance, epsilon], x.dtype),))
    out = elementwise(imp, "mul", [centred, channel(elementwise(imp, "mul", [inv, imp.tensor(scale)], x.dtype))], x.dtype)
    out = elementwise(imp, "add", [out, channel(bias)], x.dtype)
    return [out, *moved] if training else out


@onnx_op("InstanceNormalization")
def _instance_norm(imp: OnnxImporter, node: Any, x: Any, scale: Any, bias: Any, epsilon: float = 1e-5) -> Node:
    x = imp.tensor(x)
    axes = list(range(2, x.tensor_type.rank))
    out = normalize(imp, x, axes, epsilon)[0]
    dims = {"dims": (1,)}
    out = elementwise(imp, "mul", [out, imp.graph.add("broadcast_in_dim", (imp.tensor(scale), *imp.sizes(x.shape)), dims)], x.dtype)
    return elementwise(imp, "add", [out, imp.graph.add("broadcast_in_dim", (imp.tensor(bias), *imp.sizes(x.shape)), dims)], x.dtype)


@onnx_op("LayerNormalization")
def _layer_norm(imp: OnnxImporter, node: Any, x: Any, scale: Any, bias: Any = None, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1) -> Node:
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    axes = list(range(normalize_axis(axis, rank, "LayerNormalization"), rank))
    normed, mu, inv = normalize(imp, x, axes, epsilon)
    out = elementwise(imp, "mul", [normed, imp.tensor(scale)], x.dtype)
    out = out if bias is None else elementwise(imp, "add", [out, imp.tensor(bias)], x.dtype)
    return [out, mu, inv]  # the optional outputs: the mean and the inverse deviation (keepdim shapes)


@onnx_op("MeanVarianceNormalization")
def _mvn(imp: OnnxImporter, node: Any, x: Any, axes: Sequence[int] = (0, 2, 3)) -> Node:
    """(x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9), ONNX's function body, with the variance held
    at >= 0: the difference cancels, and where the deviations are ~0 rounding can make it
    negative and the result NaN instead of ~0."""
    x = imp.tensor(x)
    dims = sorted({normalize_axis(a, x.tensor_type.rank, "MeanVarianceNormalization") for a in axes})
    mu = mean(imp, x, dims, True)
    var = elementwise(imp, "sub", [mean(imp, elementwise(imp, "mul", [x, x], x.dtype), dims, True), elementwise(imp, "mul", [mu, mu], x.dtype)], x.dtype)
    var = elementwise(imp, "maximum", [var, 0.0], x.dtype)
    std = elementwise(imp, "add", [imp.graph.add("sqrt", (var,)), 1e-9], x.dtype)
    return elementwise(imp, "div", [elementwise(imp, "sub", [x, mu], x.dtype), std], x.dtype)


@onnx_op("GroupNormalization")
def _group_norm(imp: OnnxImporter, node: Any, x: Any, scale: Any, bias: Any, num_groups: int = 1, epsilon: float = 1e-5, stash_type: int = 1) -> Node:
    """Each sample's channels in ``num_groups`` groups normalised together; scale and bias are per
    channel (opset 21) or per group (opset 18)."""
    x = imp.tensor(x)
    batch, channels, *rest = x.shape
    require_divisible(imp, channels, num_groups, f"GroupNormalization: channels (dim 1) must be divisible by num_groups={num_groups}")
    grouped = reshape(imp, x, [batch, num_groups, as_expr(channels) // num_groups, *rest])
    normed = normalize(imp, grouped, list(range(2, len(rest) + 3)), epsilon)[0]
    dims = {"dims": (1,)}
    if imp.opset < 21:
        for v, op in ((scale, "mul"), (bias, "add")):
            normed = elementwise(imp, op, [normed, imp.graph.add("broadcast_in_dim", (imp.tensor(v), *imp.sizes(normed.shape)), dims)], x.dtype)
        return reshape(imp, normed, x.shape)
    out = reshape(imp, normed, x.shape)
    out = elementwise(imp, "mul", [out, imp.graph.add("broadcast_in_dim", (imp.tensor(scale), *imp.sizes(x.shape)), dims)], x.dtype)
    return elementwise(imp, "add", [out, imp.graph.add("broadcast_in_dim", (imp.tensor(bias), *imp.sizes(x.shape)), dims)], x.dtype)


def _nll(imp: OnnxImporter, logp: Node, target: Any, weight: Any, reduction: str, ignore_index: int | None) -> Node:
    """-logp[n, target[n, ...], ...] times the class weight; an ignored target weighs 0. "mean"
    divides by the sum of the weights taken (the count of targets without weights)."""
    if reduction not in ("none", "sum", "mean"):
        raise LoweringError(f"reduction {reduction!r} (ONNX allows none, sum, mean)")
    t = convert(imp, imp.tensor(target), "i64")
    ignored = elementwise(imp, "eq", [t, ignore_index], "i64") if ignore_index is not None else None
    if ignored is not None:  # the ignored value may lie outside [0, C): read class 0 there, weigh it 0
        t = select(imp, ignored, 0, t, "i64")
    spots = list(t.shape)
    picked = imp.graph.add("gather", (logp, reshape(imp, t, [spots[0], 1, *spots[1:]])), {"axis": 1})
    loss = imp.graph.add("neg", (reshape(imp, picked, spots),))
    w = None
    if weight is not None:
        w = reshape(imp, imp.graph.add("index_select", (imp.tensor(weight), reshape(imp, t, [product(spots)])), {"axis": 0}), spots)
    if ignored is not None:
        w = select(imp, ignored, 0.0, 1.0 if w is None else w, logp.dtype)
    if w is not None:
        loss = elementwise(imp, "mul", [loss, w], logp.dtype)
    everything = list(range(len(spots)))
    if reduction == "none":
        return loss
    total = reshape(imp, reduce(imp, loss, everything, "sum", True), [])
    if reduction == "sum":
        return total
    if w is None:
        return reshape(imp, mean(imp, loss, everything, True), [])
    return elementwise(imp, "div", [total, reshape(imp, reduce(imp, w, everything, "sum", True), [])], logp.dtype)


@onnx_op("NegativeLogLikelihoodLoss")
def _nll_loss(imp: OnnxImporter, node: Any, x: Any, target: Any, weight: Any = None, reduction: str = "mean", ignore_index: int | None = None) -> Node:
    return _nll(imp, imp.tensor(x), target, weight, reduction, ignore_index)


@onnx_op("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(imp: OnnxImporter, node: Any, scores: Any, labels: Any, weights: Any = None, reduction: str = "mean", ignore_index: int | None = None) -> list[Node]:
    logp = log_softmax(imp, imp.tensor(scores), 1)
    return [_nll(imp, logp, labels, weights, reduction, ignore_index), logp]


@onnx_op("LpNormalization")
def _lp_normalization(imp: OnnxImporter, node: Any, x: Any, axis: int = -1, p: int = 2) -> Node:
    if p not in (1, 2):
        raise LoweringError(f"LpNormalization with p={p} (ONNX allows 1 and 2)")
    x = imp.tensor(x)
    a = normalize_axis(axis, x.tensor_type.rank, "LpNormalization")
    if p == 1:
        norm = reduce(imp, imp.graph.add("abs", (x,)), [a], "sum", True)
    else:
        norm = imp.graph.add("sqrt", (reduce(imp, elementwise(imp, "mul", [x, x], x.dtype), [a], "sum", True),))
    # An all-zero row stays zero (ONNX's reference), not 0/0.
    norm = select(imp, elementwise(imp, "eq", [norm, 0.0], x.dtype), 1.0, norm, x.dtype)
    return elementwise(imp, "div", [x, norm], x.dtype)


@onnx_op("RMSNormalization")
def _rms_norm(imp: OnnxImporter, node: Any, x: Any, scale: Any, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1) -> Node:
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    axes = list(range(normalize_axis(axis, rank, "RMSNormalization"), rank))
    square = mean(imp, elementwise(imp, "mul", [x, x], x.dtype), axes, True)
    out = elementwise(imp, "mul", [x, imp.graph.add("rsqrt", (elementwise(imp, "add", [square, epsilon], x.dtype),))], x.dtype)
    return elementwise(imp, "mul", [out, imp.tensor(scale)], x.dtype)
