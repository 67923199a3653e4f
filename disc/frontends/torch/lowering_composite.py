"""Lowering table, part 4: the composite ops ``torch.export`` keeps before decomposition.

``torch.export.export`` returns ATen ops such as ``linear``, ``layer_norm``,
``conv2d`` and ``batch_norm``; ``run_decompositions`` would rewrite them into
core ATen, but it re-traces the whole program to do so (BERT-base: 4.5 of a
7.5 s compile). Lowering them here, to the same disc IR their decompositions
produce, lets the export skip that step (see ``export.py``). Each entry
reuses the core op's lowering, so both paths agree by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from disc.frontends.torch.importer import Importer, LoweringError
from disc.frontends.torch.lowering import _full, _to_copy, _where, aten, lower, meta_dtype, norm_axis, size_value
from disc.frontends.torch.lowering_movement import _permute, _select, _split, slice_axis, view
from disc.frontends.torch.lowering_nn import (
    _batch_norm,
    _convolution,
    _layer_norm,
    _log_softmax,
    _matmul,
    _native_dropout,
    _native_group_norm,
    _pair,
    _softmax,
    max_pool2d,
)
from disc.ir.builder import broadcast_to, convert, dim_value, elementwise, reshape
from disc.ir.graph import Node
from disc.ir.types import dtype_of_torch
from disc.shape.expr import DimLike, as_expr, product, simplify_dim


@lower(aten.linear.default)
def _linear(ctx: Importer, fx_node, x: Node, w: Node, bias: Any = None) -> Node:
    out = _matmul(ctx, fx_node, x, _permute(ctx, fx_node, w, [1, 0]))
    if bias is None:
        return out
    return ctx.graph.add("add", (out, broadcast_to(ctx, bias, out.shape)))


@lower(aten.layer_norm.default)
def _layer_norm_composite(ctx: Importer, fx_node, x: Node, normalized_shape: Sequence[Any], weight: Any = None, bias: Any = None, eps: float = 1e-5, cudnn_enable: bool = True) -> Node:
    return _layer_norm(ctx, fx_node, x, normalized_shape, weight, bias, eps)[0]


def _in_dtype(ctx: Importer, x: Node, dtype: torch.dtype | None) -> Node:
    return x if dtype is None else convert(ctx, x, dtype_of_torch(dtype))


@lower(aten.softmax.int)
def _softmax_composite(ctx: Importer, fx_node, x: Node, dim: int, dtype: torch.dtype | None = None) -> Node:
    return _softmax(ctx, fx_node, _in_dtype(ctx, x, dtype), dim)


@lower(aten.log_softmax.int)
def _log_softmax_composite(ctx: Importer, fx_node, x: Node, dim: int, dtype: torch.dtype | None = None) -> Node:
    return _log_softmax(ctx, fx_node, _in_dtype(ctx, x, dtype), dim)


@lower(aten.dropout.default)
def _dropout(ctx: Importer, fx_node, x: Node, p: float, train: Any) -> Node:
    return _native_dropout(ctx, fx_node, x, p, train)[0]


@lower(aten.batch_norm.default)
def _batch_norm_composite(ctx: Importer, fx_node, x: Node, weight: Any, bias: Any, running_mean: Any, running_var: Any, training: bool, momentum: float, eps: float, cudnn_enabled: bool = True) -> Node:
    # Training updates the running statistics in place: torch's decomposition makes that functional.
    if training or not isinstance(running_mean, Node) or not isinstance(running_var, Node):
        raise LoweringError("batch_norm in training mode or without running statistics")
    return _batch_norm(ctx, fx_node, x, weight, bias, running_mean, running_var, momentum, eps)[0]


@lower(aten.conv1d.default, aten.conv2d.default, aten.conv3d.default)
def _conv(ctx: Importer, fx_node, x: Node, w: Node, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Node:
    spatial = w.tensor_type.rank - 2
    if x.tensor_type.rank != spatial + 2:
        raise LoweringError("a convolution of an unbatched input")  # torch adds and drops the batch dim around it
    geometry = [_pair(v, spatial) for v in (stride, padding, dilation)]
    return _convolution(ctx, fx_node, x, w, bias, *geometry, False, [0] * spatial, groups)


@lower(aten.max_pool2d.default)
def _max_pool2d_values(ctx: Importer, fx_node, x: Node, kernel: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> Node:
    if x.tensor_type.rank != 4:
        raise LoweringError("max_pool2d of an unbatched input")
    return max_pool2d(ctx, x, kernel, stride, padding, dilation, ceil_mode, with_indices=False)[0]


@lower(aten.flatten.using_ints)
def _flatten(ctx: Importer, fx_node, x: Node, start: int = 0, end: int = -1) -> Node:
    rank = x.tensor_type.rank
    if rank == 0:
        return reshape(ctx, x, [1])
    start, end = start % rank, end % rank
    shape = list(x.shape)
    return reshape(ctx, x, [*shape[:start], product(shape[start : end + 1]), *shape[end + 1 :]])


@lower(aten.chunk.default)
def _chunk(ctx: Importer, fx_node, x: Node, chunks: int, dim: int = 0) -> list[Node]:
    size = x.shape[norm_axis(dim, x.tensor_type.rank)]
    if not isinstance(size, int):
        raise LoweringError("chunk of a dynamic dim")  # the piece count depends on the size: torch guards it
    return _split(ctx, fx_node, x, -(-size // chunks), dim)


@lower(aten.unbind.int)
def _unbind(ctx: Importer, fx_node, x: Node, dim: int = 0) -> list[Node]:
    axis = norm_axis(dim, x.tensor_type.rank)
    size = x.shape[axis]
    if not isinstance(size, int):
        raise LoweringError("unbind of a dynamic dim")  # the piece count depends on the size
    return [_select(ctx, fx_node, x, axis, i) for i in range(size)]


@lower(aten.unflatten.int)
def _unflatten(ctx: Importer, fx_node, x: Node, dim: int, sizes: Sequence[Any]) -> Node:
    axis = norm_axis(dim, x.tensor_type.rank)
    pieces = [None if v == -1 else v for v in (size_value(ctx, s) for s in sizes)]
    return view(ctx, x, [*x.shape[:axis], *pieces, *x.shape[axis + 1 :]])


@lower(aten.stack.default)
def _stack(ctx: Importer, fx_node, tensors: Sequence[Node], dim: int = 0) -> Node:
    axis = norm_axis(dim, tensors[0].tensor_type.rank + 1)
    pieces = [reshape(ctx, convert(ctx, t, meta_dtype(fx_node)), [*t.shape[:axis], 1, *t.shape[axis:]]) for t in tensors]
    return pieces[0] if len(pieces) == 1 else ctx.graph.add("concat", pieces, {"axis": axis})


@lower(aten.movedim.int)
def _movedim(ctx: Importer, fx_node, x: Node, source: int, destination: int) -> Node:
    rank = x.tensor_type.rank
    order = [d for d in range(rank) if d != norm_axis(source, rank)]
    order.insert(norm_axis(destination, rank), norm_axis(source, rank))
    return _permute(ctx, fx_node, x, order)


@lower(aten.narrow.default)
def _narrow(ctx: Importer, fx_node, x: Node, dim: int, start: Any, length: Any) -> Node:
    axis = norm_axis(dim, x.tensor_type.rank)
    begin = as_expr(size_value(ctx, start))
    if isinstance(start, int) and start < 0:  # counts from the end
        begin = as_expr(x.shape[axis]) + start
    return slice_axis(ctx, x, axis, simplify_dim(begin), simplify_dim(begin + as_expr(size_value(ctx, length))))


@lower(aten.expand_as.default)
def _expand_as(ctx: Importer, fx_node, x: Node, other: Node) -> Node:
    return broadcast_to(ctx, x, other.shape)


@lower(aten.view_as.default)
def _view_as(ctx: Importer, fx_node, x: Node, other: Node) -> Node:
    return reshape(ctx, x, list(other.shape))


@lower(aten.glu.default)
def _glu(ctx: Importer, fx_node, x: Node, dim: int = -1) -> Node:
    size = x.shape[norm_axis(dim, x.tensor_type.rank)]
    if not isinstance(size, int):
        raise LoweringError("glu over a dynamic dim")
    a, b = _split(ctx, fx_node, x, size // 2, dim)
    return elementwise(ctx, "mul", [a, ctx.graph.add("sigmoid", (b,))], x.dtype)


@lower(aten.group_norm.default)
def _group_norm(ctx: Importer, fx_node, x: Node, groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5, cudnn_enabled: bool = True) -> Node:
    return _native_group_norm(ctx, fx_node, x, weight, bias, None, None, None, groups, eps)[0]


def _replicate(ctx: Importer, x: Node, factors: Sequence[DimLike], whole: bool) -> Node:
    """Dim i of ``x`` repeated ``factors[i]`` times (a size, symbolic or not), as a broadcast of a
    new size-1 axis: whole copies one after another (``whole``, torch's ``repeat``) or each element
    in place (nearest upsampling). Both are exact and fuse like any broadcast."""
    ones, grown, merged = [], [], []
    for d, k in zip(x.shape, factors):
        once = as_expr(k) == as_expr(1)
        ones += [d] if once else ([1, d] if whole else [d, 1])
        grown += [d] if once else ([k, d] if whole else [d, k])
        merged.append(d if once else simplify_dim(as_expr(d) * k))
    return reshape(ctx, broadcast_to(ctx, reshape(ctx, x, ones), grown), merged)


@lower(aten.repeat.default)
def _repeat(ctx: Importer, fx_node, x: Node, repeats: Sequence[Any]) -> Node:
    # A count may be a size (DeBERTa repeats its position table once per batch row).
    counts = [size_value(ctx, r) for r in repeats]
    extra = len(counts) - x.tensor_type.rank
    return _replicate(ctx, reshape(ctx, x, [1] * extra + list(x.shape)), counts, whole=True)


@lower(aten.upsample_nearest2d.vec)
def _upsample_nearest2d(ctx: Importer, fx_node, x: Node, output_size: Any, scale_factors: Any) -> Node:
    """Nearest resizing. By whole factors each value is repeated (source index = destination //
    factor, as PyTorch picks it). To a size, static or taken from another tensor's shape (an FPN's
    top-down path), H and W are each a gather at PyTorch's source index
    ``min(floor(i * (in / out)), in - 1)``, computed in float32 as its kernel does."""
    if scale_factors is not None and all(float(f).is_integer() and f >= 1 for f in scale_factors):
        return _replicate(ctx, x, [1, 1, *(int(f) for f in scale_factors)], whole=False)
    if output_size is None:  # the output size is floor(in * factor): not kept as an exact dim
        raise LoweringError("nearest upsampling by a fractional factor")
    for axis, size in zip((2, 3), output_size):
        x = ctx.graph.add("index_select", (x, _nearest_source(ctx, x.shape[axis], size_value(ctx, size))), {"axis": axis})
    return x


def _nearest_source(ctx: Importer, in_size: Any, out_size: Any) -> Node:
    """Source row of each of ``out_size`` destination rows, for nearest resizing from ``in_size``."""
    if isinstance(in_size, int) and isinstance(out_size, int):
        scale: Any = float(torch.tensor(in_size, dtype=torch.float32) / out_size)  # float32 division, as PyTorch's
    else:
        scale = elementwise(ctx, "div", [ctx.index(in_size), ctx.index(out_size)], "f32")
    position = elementwise(ctx, "mul", [ctx.graph.add("iota", (ctx.index(out_size),), {"dtype": "i64"}), scale], "f32")
    source = convert(ctx, ctx.graph.add("floor", (position,)), "i64")
    last = dim_value(ctx, simplify_dim(as_expr(in_size) - 1))
    return elementwise(ctx, "minimum", [source, last], "i64")


@lower(aten.diagonal.default)
def _diagonal(ctx: Importer, fx_node, x: Node, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Node:
    """The diagonal as a gather: dim1 and dim2 moved last and merged, then every (m + 1)-th
    element from the first on the diagonal, as many as fit (none when the offset passes the edge)."""
    rank = x.tensor_type.rank
    d1, d2 = norm_axis(dim1, rank), norm_axis(dim2, rank)
    if d1 == d2:
        raise LoweringError("diagonal of a dim with itself")
    rest = [d for d in range(rank) if d not in (d1, d2)]
    x = _permute(ctx, fx_node, x, [*rest, d1, d2])
    n, m = x.shape[-2], x.shape[-1]
    flat = reshape(ctx, x, [*x.shape[:-2], simplify_dim(as_expr(n) * m)])
    first = offset if offset >= 0 else simplify_dim(as_expr(m) * -offset)
    rows, cols = (n, simplify_dim(as_expr(m) - offset)) if offset >= 0 else (simplify_dim(as_expr(n) + offset), m)
    length = ctx.graph.add("imax", (ctx.index(0), ctx.graph.add("imin", (ctx.index(rows), ctx.index(cols)))))
    along = ctx.graph.add("iota", (length,), {"dtype": "i64"})
    ctx.register_dims(along)  # its length is a fresh symbol (a min): later sizes refer to it
    steps = elementwise(ctx, "mul", [along, ctx.index(simplify_dim(as_expr(m) + 1))], "i64")
    positions = elementwise(ctx, "add", [steps, ctx.index(first)], "i64")
    return ctx.graph.add("index_select", (flat, positions), {"axis": rank - 2})


@lower(aten.flip.default)
def _flip(ctx: Importer, fx_node, x: Node, dims: Sequence[int]) -> Node:
    for axis in {norm_axis(d, x.tensor_type.rank) for d in dims}:
        size = x.shape[axis]
        last = dim_value(ctx, simplify_dim(as_expr(size) - 1))
        reversed_index = elementwise(ctx, "sub", [last, ctx.graph.add("iota", (ctx.index(size),), {"dtype": "i64"})], "i64")
        x = ctx.graph.add("index_select", (x, reversed_index), {"axis": axis})
    return x


@lower(aten.outer.default)
def _outer(ctx: Importer, fx_node, a: Node, b: Node) -> Node:
    dtype = meta_dtype(fx_node)
    column = reshape(ctx, convert(ctx, a, dtype), [a.shape[0], 1])
    row = reshape(ctx, convert(ctx, b, dtype), [1, b.shape[0]])
    return elementwise(ctx, "mul", [column, row], dtype)


@lower(aten.numpy_T.default)
def _numpy_t(ctx: Importer, fx_node, x: Node) -> Node:
    return _permute(ctx, fx_node, x, list(reversed(range(x.tensor_type.rank))))


lower(aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten.to.other, aten.type_as.default)(_to_copy)  # the result's dtype is in torch's meta (a program runs on one device)

_FILL = {aten.ones.default: 1, aten.zeros.default: 0, aten.new_ones.default: 1, aten.new_zeros.default: 0}


@lower(*_FILL)
def _fill(ctx: Importer, fx_node, *args: Any, **kw: Any) -> Node:
    return _full(ctx, fx_node, args[-1], _FILL[fx_node.target])  # new_ones(self, size) or ones(size)


@lower(aten.new_full.default)
def _new_full(ctx: Importer, fx_node, x: Node, size: Sequence[Any], value: Any, **kw: Any) -> Node:
    return _full(ctx, fx_node, size, value)


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(ctx: Importer, fx_node, x: Node, mask: Node, value: Any) -> Node:
    return _where(ctx, fx_node, mask, value, x)
