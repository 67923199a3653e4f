"""Lowering table, part 3: reductions, normalisations, GEMM, convolution, pooling.

Softmax, LayerNorm and friends are expanded into reduce + broadcast +
elementwise ops here: that is the form fusion recognises and stitches back
into one kernel, and it keeps the op set small.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from disc.frontends.torch.importer import Importer, LoweringError
from disc.frontends.torch.lowering import _where, aten, lower, meta_dtype, meta_of, norm_axis, reduce_dims
from disc.ir.builder import broadcast_to, convert, elementwise, log_softmax, mean, normalize, numel_of, reduce, reshape, scalar, softmax
from disc.ir.graph import Node
from disc.shape.expr import as_expr


# -- reductions ----------------------------------------------------------------------------
def _reduction(kind: str):
    def fn(ctx: Importer, fx_node, x: Node, dims: Any = None, keepdim: bool = False, **kw) -> Node:
        out_dtype = meta_dtype(fx_node)
        src = convert(ctx, x, out_dtype) if kind in ("sum", "prod") else x
        if kind in ("any", "all"):
            src = convert(ctx, x, "i1")
        return convert(ctx, reduce(ctx, src, reduce_dims(x, dims), kind, keepdim), out_dtype)

    return fn


lower(aten.sum.dim_IntList, aten.sum.default)(_reduction("sum"))
lower(aten.prod.dim_int, aten.prod.default)(_reduction("prod"))
lower(aten.amax.default)(_reduction("max"))
lower(aten.amin.default)(_reduction("min"))
lower(aten.any.dim, aten.any.dims, aten.any.default)(_reduction("any"))
lower(aten.all.dim, aten.all.dims, aten.all.default)(_reduction("all"))


@lower(aten.mean.dim, aten.mean.default)
def _mean(ctx: Importer, fx_node, x: Node, dims: Any = None, keepdim: bool = False, **kw) -> Node:
    return mean(ctx, convert(ctx, x, meta_dtype(fx_node)), reduce_dims(x, dims), keepdim)


@lower(aten.var.correction, aten.var.dim)
def _var(ctx: Importer, fx_node, x: Node, dims: Any = None, *args: Any, correction: Any = None, keepdim: bool = False, **kw) -> Node:
    if fx_node.target is aten.var.dim:
        unbiased = args[0] if args else True
        keepdim = args[1] if len(args) > 1 else keepdim
        correction = 1 if unbiased else 0
    elif args:
        keepdim = args[0]
    correction = 1 if correction is None else correction
    axes = reduce_dims(x, dims)
    centered = elementwise(ctx, "sub", [x, mean(ctx, x, axes, True)], x.dtype)
    total = reduce(ctx, elementwise(ctx, "mul", [centered, centered], x.dtype), axes, "sum", keepdim)
    count = elementwise(ctx, "sub", [numel_of(ctx, x, axes, x.dtype), float(correction)], x.dtype)
    return elementwise(ctx, "div", [total, count], x.dtype)


@lower(aten.var_mean.correction)
def _var_mean(ctx: Importer, fx_node, x: Node, dims: Any = None, *, correction: Any = None, keepdim: bool = False) -> list[Node]:
    # The mean is computed once: the variance's centring reads the same (CSE'd) value.
    axes = reduce_dims(x, dims)
    var = _var(ctx, fx_node, x, dims, correction=correction, keepdim=keepdim)
    return [var, mean(ctx, x, axes, keepdim)]


@lower(aten.std.correction, aten.std.dim)
def _std(ctx: Importer, fx_node, x: Node, *args: Any, **kw: Any) -> Node:
    return ctx.graph.add("sqrt", (_var(ctx, fx_node, x, *args, **kw),))


@lower(aten.linalg_vector_norm.default)
def _vector_norm(ctx: Importer, fx_node, x: Node, ord: Any = 2, dims: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Node:
    """||x||_ord over ``dims``: 2 (the usual), 1, inf, -inf, 0 (the nonzero count) or any other p."""
    x = convert(ctx, x, meta_dtype(fx_node))
    axes = reduce_dims(x, dims)
    ord = float(ord)
    if ord == 0:
        return reduce(ctx, convert(ctx, elementwise(ctx, "ne", [x, 0.0], x.dtype), x.dtype), axes, "sum", keepdim)
    magnitude = ctx.graph.add("abs", (x,))
    if math.isinf(ord):
        return reduce(ctx, magnitude, axes, "max" if ord > 0 else "min", keepdim)
    if ord == 1:
        return reduce(ctx, magnitude, axes, "sum", keepdim)
    if ord == 2:
        return ctx.graph.add("sqrt", (reduce(ctx, elementwise(ctx, "mul", [x, x], x.dtype), axes, "sum", keepdim),))
    total = reduce(ctx, elementwise(ctx, "pow", [magnitude, ord], x.dtype), axes, "sum", keepdim)
    return elementwise(ctx, "pow", [total, 1.0 / ord], x.dtype)


@lower(aten.logsumexp.default)
def _logsumexp(ctx: Importer, fx_node, x: Node, dims: Any = None, keepdim: bool = False) -> Node:
    """log(sum(exp(x - m))) + m with m the max, taken as 0 where it is infinite (as PyTorch does)."""
    x = convert(ctx, x, meta_dtype(fx_node))
    axes = reduce_dims(x, dims)
    peak = reduce(ctx, x, axes, "max", True)
    infinite = elementwise(ctx, "eq", [ctx.graph.add("abs", (peak,)), float("inf")], x.dtype)
    shift = _where(ctx, fx_node, infinite, 0.0, peak)
    total = reduce(ctx, ctx.graph.add("exp", (elementwise(ctx, "sub", [x, shift], x.dtype),)), axes, "sum", keepdim)
    shift = shift if keepdim else reshape(ctx, shift, list(total.shape))
    return elementwise(ctx, "add", [ctx.graph.add("log", (total,)), shift], x.dtype)


def _arg(kind: str):
    def fn(ctx: Importer, fx_node, x: Node, dim: Any = None, keepdim: bool = False) -> Node:
        if dim is None:
            x = reshape(ctx, x, [x.tensor_type.numel()])
            dim = 0
        return ctx.graph.add("argreduce", (x,), {"axis": norm_axis(dim, x.tensor_type.rank), "kind": kind, "keepdim": keepdim})

    return fn


lower(aten.argmax.default)(_arg("argmax"))
lower(aten.argmin.default)(_arg("argmin"))


@lower(aten.max.dim, aten.min.dim)
def _max_dim(ctx: Importer, fx_node, x: Node, dim: int, keepdim: bool = False) -> list[Node]:
    is_max = fx_node.target is aten.max.dim
    axis = norm_axis(dim, x.tensor_type.rank)
    values = reduce(ctx, x, [axis], "max" if is_max else "min", keepdim)
    index = ctx.graph.add("argreduce", (x,), {"axis": axis, "kind": "argmax" if is_max else "argmin", "keepdim": keepdim})
    return [values, index]


# -- softmax and normalisation -----------------------------------------------------------------
@lower(aten._softmax.default)
def _softmax(ctx: Importer, fx_node, x: Node, dim: int, half_to_float: bool = False) -> Node:
    return softmax(ctx, x, norm_axis(dim, x.tensor_type.rank))


@lower(aten._log_softmax.default)
def _log_softmax(ctx: Importer, fx_node, x: Node, dim: int, half_to_float: bool = False) -> Node:
    return log_softmax(ctx, x, norm_axis(dim, x.tensor_type.rank))


@lower(aten.native_layer_norm.default)
def _layer_norm(ctx: Importer, fx_node, x: Node, normalized_shape: Sequence[Any], weight: Any, bias: Any, eps: float) -> list[Node]:
    rank = x.tensor_type.rank
    axes = list(range(rank - len(normalized_shape), rank))
    out, mu, rstd = normalize(ctx, x, axes, eps)
    if weight is not None:
        out = elementwise(ctx, "mul", [out, weight], x.dtype)
    if bias is not None:
        out = elementwise(ctx, "add", [out, bias], x.dtype)
    return [out, mu, rstd]


@lower(aten.rms_norm.default)
def _rms_norm(ctx: Importer, fx_node, x: Node, normalized_shape: Sequence[Any], weight: Any = None, eps: Any = None) -> Node:
    rank = x.tensor_type.rank
    axes = list(range(rank - len(normalized_shape), rank))
    eps = torch.finfo(meta_of(fx_node).dtype).eps if eps is None else float(eps)
    ms = mean(ctx, elementwise(ctx, "mul", [x, x], x.dtype), axes, True)
    out = elementwise(ctx, "mul", [x, ctx.graph.add("rsqrt", (elementwise(ctx, "add", [ms, eps], x.dtype),))], x.dtype)
    return out if weight is None else elementwise(ctx, "mul", [out, weight], x.dtype)


@lower(aten.native_group_norm.default)
def _native_group_norm(ctx: Importer, fx_node, x: Node, weight: Any, bias: Any, n: Any, c: Any, hw: Any, groups: int, eps: float) -> list[Node]:
    """Statistics over each group of C / groups channels and all positions; the affine part per channel."""
    channels = x.shape[1]
    if not isinstance(channels, int):
        raise LoweringError("group_norm over a dynamic channel count")
    rows = reshape(ctx, x, [x.shape[0], groups, channels // groups, *x.shape[2:]])
    normed, mu, rstd = _layer_norm(ctx, fx_node, rows, rows.shape[2:], None, None, eps)  # each group is a LayerNorm row
    out = reshape(ctx, normed, list(x.shape))
    if weight is not None:
        out = ctx.graph.add("mul", (out, _channel(ctx, weight, x)))
    if bias is not None:
        out = ctx.graph.add("add", (out, _channel(ctx, bias, x)))
    stats = [x.shape[0], groups]
    return [out, reshape(ctx, mu, stats), reshape(ctx, rstd, stats)]


def _channel(ctx: Importer, v: Node, x: Node) -> Node:
    """Broadcast a per-channel vector over an N, C, ... tensor."""
    shape = x.shape
    return ctx.graph.add("broadcast_in_dim", (v, *ctx.sizes(shape)), {"dims": (1,)})


@lower(aten._native_batch_norm_legit_no_training.default)
def _batch_norm(ctx: Importer, fx_node, x: Node, weight: Any, bias: Any, running_mean: Node, running_var: Node, momentum: float, eps: float) -> list[Any]:
    inv = ctx.graph.add("rsqrt", (elementwise(ctx, "add", [running_var, float(eps)], running_var.dtype),))
    out = ctx.graph.add("sub", (x, _channel(ctx, running_mean, x)))
    out = ctx.graph.add("mul", (out, _channel(ctx, inv, x)))
    if weight is not None:
        out = ctx.graph.add("mul", (out, _channel(ctx, weight, x)))
    if bias is not None:
        out = ctx.graph.add("add", (out, _channel(ctx, bias, x)))
    return [out, None, None]


# -- GEMM ----------------------------------------------------------------------------------
def matmul(ctx: Importer, a: Node, b: Node) -> Node:
    return ctx.graph.add("dot_general", (a, b), {"lhs_contract": (a.tensor_type.rank - 1,), "rhs_contract": (0,)})


@lower(aten.mm.default)
def _mm(ctx: Importer, fx_node, a: Node, b: Node) -> Node:
    return matmul(ctx, a, b)


@lower(aten.matmul.default)
def _matmul(ctx: Importer, fx_node, a: Node, b: Node) -> Node:
    """``[..., m, k] @ [k, n]``, or a batched product over equal leading dims (what export keeps, see export.py)."""
    ra, rb = a.tensor_type.rank, b.tensor_type.rank
    if ra >= 2 and rb == 2:
        return matmul(ctx, a, b)
    c = ctx.graph.constraints
    if ra == rb >= 3 and all(c.prove_equal(x, y) for x, y in zip(a.shape[:-2], b.shape[:-2])):
        batch = tuple(range(ra - 2))
        return ctx.graph.add("dot_general", (a, b), {"lhs_batch": batch, "rhs_batch": batch, "lhs_contract": (ra - 1,), "rhs_contract": (ra - 2,)})
    raise LoweringError(f"matmul of ranks {ra} and {rb} with batch dims not provably equal")


@lower(aten.bmm.default)
def _bmm(ctx: Importer, fx_node, a: Node, b: Node) -> Node:
    return ctx.graph.add("dot_general", (a, b), {"lhs_batch": (0,), "rhs_batch": (0,), "lhs_contract": (2,), "rhs_contract": (1,)})


@lower(aten.addmm.default)
def _addmm(ctx: Importer, fx_node, bias: Node, a: Node, b: Node, beta: Any = 1, alpha: Any = 1) -> Node:
    out = matmul(ctx, a, b)
    if alpha != 1:
        out = elementwise(ctx, "mul", [out, alpha], out.dtype)
    if beta != 1:
        bias = elementwise(ctx, "mul", [bias, beta], out.dtype)
    return ctx.graph.add("add", (out, broadcast_to(ctx, bias, out.shape)))


# -- convolution and pooling -------------------------------------------------------------------
@lower(aten.convolution.default)
def _convolution(ctx: Importer, fx_node, x: Node, w: Node, bias: Any, stride, padding, dilation, transposed, output_padding, groups) -> Node:
    out = ctx.graph.add(
        "convolution",
        (x, w),
        {
            "stride": tuple(stride),
            "padding": tuple(padding),
            "dilation": tuple(dilation),
            "groups": int(groups),
            "transposed": bool(transposed),
            "output_padding": tuple(output_padding),
        },
    )
    if bias is None:
        return out
    return ctx.graph.add("add", (out, _channel(ctx, bias, out)))


@lower(aten.convolution_backward.default)
def _convolution_backward(
    ctx: Importer, fx_node, gy: Node, x: Node, w: Node, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
) -> list[Any]:
    """(dL/dx, dL/dw, dL/dbias), each only where ``output_mask`` asks: the first two are
    library calls, the bias gradient a sum of gy over all but the channel dim."""
    if transposed:
        raise LoweringError("the backward of a transposed convolution")
    kernel = [as_expr(d) for d in w.tensor_type.shape[2:]]
    if not all(k.is_const for k in kernel):
        raise LoweringError("a convolution backward with a dynamic kernel size")
    geometry = {"stride": tuple(stride), "padding": tuple(padding), "dilation": tuple(dilation), "groups": int(groups)}
    out: list[Any] = [None, None, None]
    if output_mask[0]:
        out[0] = ctx.graph.add("convolution_backward_input", (gy, w, *ctx.sizes(x.tensor_type.shape)), geometry)
    if output_mask[1]:
        out[1] = ctx.graph.add("convolution_backward_weight", (x, gy), {**geometry, "kernel": tuple(int(k.const_value) for k in kernel)})
    if output_mask[2]:
        out[2] = reduce(ctx, gy, [0, *range(2, gy.tensor_type.rank)], "sum", False)
    return out


def _window_attrs(rank: int, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int]) -> dict:
    nsp = len(kernel)
    lead = rank - nsp
    stride = list(stride) or list(kernel)
    return {
        "window": (1,) * lead + tuple(kernel),
        "strides": (1,) * lead + tuple(stride),
        "padding": ((0, 0),) * lead + tuple((p, p) for p in padding),
        "dilation": (1,) * lead + tuple(dilation),
    }


def _pair(v: Any, n: int = 2) -> list[int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * n if len(v) == 1 else v


@lower(aten.max_pool2d_with_indices.default)
def _max_pool2d(ctx: Importer, fx_node, x: Node, kernel, stride=(), padding=0, dilation=1, ceil_mode=False) -> list[Any]:
    """Values, and (when used: training saves them for the backward) the indices, flat over the H x W plane."""
    with_indices = any(u.args[1] == 1 for u in fx_node.users)
    return max_pool2d(ctx, x, kernel, stride, padding, dilation, ceil_mode, with_indices)


def max_pool2d(ctx: Importer, x: Node, kernel, stride, padding, dilation, ceil_mode, with_indices: bool) -> list[Any]:
    rank = x.tensor_type.rank
    attrs = _window_attrs(rank, _pair(kernel), _pair(stride) if stride else [], _pair(padding), _pair(dilation))
    values = ctx.graph.add("reduce_window", (x,), {"kind": "max", "ceil_mode": bool(ceil_mode), **attrs})
    if not with_indices:
        return [values, None]
    index_dims = (rank - 2, rank - 1)
    indices = ctx.graph.add("reduce_window", (x,), {"kind": "argmax", "ceil_mode": bool(ceil_mode), "index_dims": index_dims, **attrs})
    return [values, indices]


@lower(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(ctx: Importer, fx_node, gy: Node, x: Node, kernel, stride, padding, dilation, ceil_mode, indices: Node) -> Node:
    """dL/dx: each output gradient added at the input position its index names, per image plane."""
    lead = list(x.shape[:-2])
    plane = [*lead, as_expr(x.shape[-2]) * x.shape[-1]]
    pooled = [*lead, as_expr(gy.shape[-2]) * gy.shape[-1]]
    zeros = broadcast_to(ctx, scalar(ctx, 0, x.dtype), plane)
    grads = ctx.graph.add("scatter_add", (zeros, reshape(ctx, indices, pooled), reshape(ctx, gy, pooled)), {"axis": len(lead)})
    return reshape(ctx, grads, list(x.shape))


@lower(aten.avg_pool2d.default)
def _avg_pool2d(ctx: Importer, fx_node, x: Node, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None) -> Node:
    kernel = _pair(kernel)
    pads = _pair(padding)
    if ceil_mode or (not count_include_pad and any(pads)):
        raise LoweringError("avg_pool2d with ceil_mode or count_include_pad=False")
    attrs = _window_attrs(x.tensor_type.rank, kernel, _pair(stride) if stride else [], pads, [1, 1])
    total = ctx.graph.add("reduce_window", (x,), {"kind": "sum", "ceil_mode": False, **attrs})
    divisor = divisor_override or kernel[0] * kernel[1]
    return elementwise(ctx, "div", [total, float(divisor)], x.dtype)


@lower(aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(ctx: Importer, fx_node, x: Node, output_size: Sequence[int]) -> Node:
    if list(output_size) != [1, 1]:
        raise LoweringError("adaptive_avg_pool2d to a size other than 1x1")
    rank = x.tensor_type.rank
    return mean(ctx, x, [rank - 2, rank - 1], True)


_ = scalar


# -- dropout -------------------------------------------------------------------------------
@lower(aten.native_dropout.default)
def _native_dropout(ctx: Importer, fx_node, x: Node, p: float, train: Any = True) -> list[Node]:
    """(x * mask / (1 - p), mask) with mask ~ Bernoulli(1 - p): a counter-based draw (``random_uniform``).

    The mask differs from eager's (another generator), but has the same law and is
    reproduced by ``torch.manual_seed``; the product keeps torch's form, so a NaN in a
    dropped position stays NaN as in eager.
    """
    if isinstance(p, Node) or isinstance(train, Node):
        raise LoweringError("dropout with a traced probability")
    if train is False or p == 0:
        return [x, broadcast_to(ctx, scalar(ctx, True, "i1"), x.shape)]
    if p >= 1:
        return [elementwise(ctx, "mul", [x, 0.0], x.dtype), broadcast_to(ctx, scalar(ctx, False, "i1"), x.shape)]
    keep = elementwise(ctx, "lt", [ctx.random_uniform(x.shape), 1.0 - float(p)], "f32")
    kept = elementwise(ctx, "mul", [x, convert(ctx, keep, x.dtype)], x.dtype)
    return [elementwise(ctx, "mul", [kept, 1.0 / (1.0 - float(p))], x.dtype), keep]
