"""Lowering table, part 2: views, layout and indexing ops.

Sizes that torch computed from SymInts arrive as index values, so a
``view(x, [b, s, 12, 64])`` becomes ``reshape(%x, %b, %s, %12, %64)`` whose
result type is ``[b, s, 12, 64]`` in disc symbols.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from disc.frontends.torch.importer import Importer, LoweringError
from disc.frontends.torch.lowering import aten, lower, meta_dtype, norm_axis, size_value
from disc.ir.builder import broadcast_shapes, broadcast_to, convert, dim_value, elementwise, floor_divide, reshape, scalar, select
from disc.ir.graph import Node
from disc.shape.expr import DimLike, SymExpr, as_expr, exact_divide, product, simplify_dim

INT64_MAX = 9223372036854775807


@lower(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(ctx: Importer, fx_node, x: Node, size: Sequence[Any]) -> Node:
    return view(ctx, x, [None if v == -1 else v for v in (size_value(ctx, s) for s in size)])


def view(ctx: Importer, x: Node, dims: list[DimLike | None]) -> Node:
    """``x`` reshaped to ``dims``; one of them may be None (torch's -1): what the others leave."""
    if dims.count(None) > 1:
        raise LoweringError("view with more than one -1")
    if None in dims:
        known = product(d for d in dims if d is not None)
        c = ctx.graph.constraints
        if not c.prove_ge(known, 1):  # torch refuses too: with a zero size, any -1 fits
            c.assume(known, ">=", 1, f"view to [{', '.join('-1' if d is None else str(d) for d in dims)}]: the sizes other than -1 must not multiply to 0")
        # -1 = numel / product(known); computed as index arithmetic (exact
        # division where the factors cancel, a new runtime symbol otherwise).
        dims[dims.index(None)] = floor_divide(ctx, x.tensor_type.numel(), known)
    return reshape(ctx, x, [d for d in dims if d is not None])


@lower(aten.as_strided.default)
def _as_strided(ctx: Importer, fx_node, x: Node, size: Sequence[Any], stride: Sequence[Any], storage_offset: Any = None) -> Node:
    # disc stores every tensor contiguously, so a view of a contiguous tensor's storage that
    # is itself contiguous over all of it is a reshape (a pooler's adaptive average decomposes
    # to one). Any other layout would read the storage in an order disc does not keep.
    c = ctx.graph.constraints
    src = fx_node.args[0].meta.get("val")
    if not isinstance(src, torch.Tensor) or not _contiguous(ctx, [ctx.sym_to_expr(d) for d in src.shape], [ctx.sym_to_expr(d) for d in src.stride()]):
        raise LoweringError("as_strided of a tensor torch does not hold contiguously")
    shape = [size_value(ctx, d) for d in size]
    offset = 0 if storage_offset is None else size_value(ctx, storage_offset)
    if not (c.prove_equal(offset, 0) and _contiguous(ctx, shape, [size_value(ctx, d) for d in stride])):
        raise LoweringError("as_strided to a layout other than contiguous")
    if not c.prove_equal(product(shape), x.tensor_type.numel()):
        raise LoweringError("as_strided over part of the storage")
    return reshape(ctx, x, shape)


def _contiguous(ctx: Importer, shape: Sequence[DimLike], stride: Sequence[DimLike]) -> bool:
    """Whether ``stride`` is provably the row-major layout of ``shape`` (a size-1 dim's stride is free)."""
    c = ctx.graph.constraints
    step: DimLike = 1
    for d, st in reversed(list(zip(shape, stride))):
        if not c.prove_is_one(d):
            if not c.prove_equal(st, step):
                return False
            step = simplify_dim(as_expr(step) * d)
    return True


@lower(aten.expand.default)
def _expand(ctx: Importer, fx_node, x: Node, size: Sequence[Any], implicit: bool = False) -> Node:
    rank = len(size)
    offset = rank - x.tensor_type.rank
    shape: list[DimLike] = []
    for i, s in enumerate(size):
        v = size_value(ctx, s)
        if v == -1:
            if i < offset:
                raise LoweringError("expand: -1 for a new leading dim")
            v = x.shape[i - offset]
        shape.append(v)
    return broadcast_to(ctx, x, shape)


@lower(aten.permute.default)
def _permute(ctx: Importer, fx_node, x: Node, dims: Sequence[int]) -> Node:
    rank = x.tensor_type.rank
    perm = tuple(norm_axis(d, rank) for d in dims)
    if perm == tuple(range(rank)):
        return x
    return ctx.graph.add("transpose", (x,), {"perm": perm})


@lower(aten.t.default)
def _t(ctx: Importer, fx_node, x: Node) -> Node:
    return x if x.tensor_type.rank < 2 else ctx.graph.add("transpose", (x,), {"perm": (1, 0)})


@lower(aten.transpose.int)
def _transpose(ctx: Importer, fx_node, x: Node, a: int, b: int) -> Node:
    rank = x.tensor_type.rank
    perm = list(range(rank))
    a, b = norm_axis(a, rank), norm_axis(b, rank)
    perm[a], perm[b] = perm[b], perm[a]
    return _permute(ctx, fx_node, x, perm)


@lower(aten.unsqueeze.default)
def _unsqueeze(ctx: Importer, fx_node, x: Node, axis: int) -> Node:
    shape = list(x.shape)
    shape.insert(norm_axis(axis, len(shape) + 1), 1)
    return reshape(ctx, x, shape)


@lower(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(ctx: Importer, fx_node, x: Node, dims: Any = None) -> Node:
    rank = x.tensor_type.rank
    axes = range(rank) if dims is None else ([dims] if isinstance(dims, int) else dims)
    c = ctx.graph.constraints
    drop, unknown = set(), []
    for a in axes:
        a = norm_axis(a, rank)
        if c.prove_is_one(x.shape[a]):
            drop.add(a)
        elif not c.prove_not_one(x.shape[a]):
            unknown.append(a)
    # torch decided each unknown dim from its traced size (its output's rank says how many it
    # dropped); eager decides at run time, so that decision is checked.
    val = fx_node.meta.get("val")
    dropped = rank - len(drop) - val.dim() if isinstance(val, torch.Tensor) else 0
    if dropped not in (0, len(unknown)):
        raise LoweringError(f"squeeze of dims {unknown}: torch dropped {dropped} of them, which ones is not known")
    for a in unknown:
        if dropped:
            c.assume(x.shape[a], "==", 1, f"squeeze of dim {a} traced as 1")
            drop.add(a)
        else:
            c.assume(x.shape[a], "!=", 1, f"squeeze of dim {a} traced as not 1")
    return reshape(ctx, x, [d for i, d in enumerate(x.shape) if i not in drop])


def _norm_index(ctx: Importer, v: Any, dim: DimLike, default: DimLike) -> DimLike:
    """A slice bound as a non-negative dim expression clamped to ``[0, dim]``."""
    if v is None:
        return default
    if isinstance(v, Node):
        return size_value(ctx, v)
    v = int(v)
    if v >= INT64_MAX or (isinstance(dim, int) and v >= dim):
        return dim
    if v < 0:
        if isinstance(dim, int):
            return max(dim + v, 0)
        return as_expr(dim) + v
    if isinstance(dim, int):
        return min(v, dim)
    # A constant bound on a symbolic dim: min(v, dim) is decided at run time.
    m = ctx.graph.add("imin", (ctx.index(v), ctx.index(dim)))
    ctx.index_cache.setdefault(ctx.graph.constraints.normalize(as_expr(m.type.value)), m)  # type: ignore[union-attr]
    return m.type.value  # type: ignore[union-attr]


def slice_axis(ctx: Importer, x: Node, axis: int, start: DimLike, stop: DimLike, step: int = 1) -> Node:
    c = ctx.graph.constraints
    dim = x.shape[axis]
    if step == 1 and c.prove_equal(start, 0) and c.prove_equal(stop, dim):
        return x
    return ctx.graph.add("slice", (x, ctx.index(start), ctx.index(stop)), {"axis": axis, "step": step})


@lower(aten.slice.Tensor)
def _slice(ctx: Importer, fx_node, x: Node, axis: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Node:
    axis = norm_axis(axis, x.tensor_type.rank)
    dim = x.shape[axis]
    lo = _norm_index(ctx, start, dim, 0)
    hi = _norm_index(ctx, end, dim, dim)
    return slice_axis(ctx, x, axis, lo, hi, int(step))


@lower(aten.select.int)
def _select(ctx: Importer, fx_node, x: Node, axis: int, index: Any) -> Node:
    axis = norm_axis(axis, x.tensor_type.rank)
    dim = x.shape[axis]
    if isinstance(index, int) and index < 0:
        start: DimLike = as_expr(dim) + index if not isinstance(dim, int) else dim + index
    else:
        start = size_value(ctx, index)
    part = slice_axis(ctx, x, axis, start, as_expr(start) + 1)
    return reshape(ctx, part, [d for i, d in enumerate(x.shape) if i != axis])


@lower(aten.split_with_sizes.default, aten.split.Tensor)
def _split(ctx: Importer, fx_node, x: Node, sizes: Any, axis: int = 0) -> list[Node]:
    axis = norm_axis(axis, x.tensor_type.rank)
    dim = x.shape[axis]
    if isinstance(sizes, (int, Node)):
        chunk = size_value(ctx, sizes)
        if not isinstance(chunk, int) or not isinstance(dim, int):
            raise LoweringError("split by a chunk size over a dynamic dim")
        sizes = [min(chunk, dim - i) for i in range(0, dim, chunk)]
    outs, offset = [], SymExpr.const(0)
    for s in sizes:
        stop = offset + as_expr(size_value(ctx, s))
        outs.append(slice_axis(ctx, x, axis, simplify_dim(offset), simplify_dim(stop)))
        offset = stop
    return outs


@lower(aten.cat.default)
def _cat(ctx: Importer, fx_node, tensors: Sequence[Node], axis: int = 0) -> Node:
    dtype = meta_dtype(fx_node)
    parts = [convert(ctx, t, dtype) for t in tensors if not (t.tensor_type.rank == 1 and t.shape[0] == 0)]
    if len(parts) == 1:
        return parts[0]
    return ctx.graph.add("concat", parts, {"axis": norm_axis(axis, parts[0].tensor_type.rank)})


@lower(aten.roll.default)
def _roll(ctx: Importer, fx_node, x: Node, shifts: Sequence[int], dims: Sequence[int] = ()) -> Node:
    """``roll`` by constant shifts along named dims (Swin's shifted windows): rolling by ``k``
    puts ``x[n-k:]`` in front of ``x[:n-k]``, with ``k`` taken modulo the dim ``n`` (at run
    time where ``n`` may be smaller than the shift)."""
    if not dims or len(shifts) != len(dims) or not all(isinstance(s, int) for s in shifts):
        raise LoweringError("roll of the flattened tensor, or by a shift that is not a constant")
    c = ctx.graph.constraints
    for shift, axis in zip(shifts, dims):
        axis = norm_axis(axis, x.tensor_type.rank)
        dim = as_expr(x.shape[axis])
        if dim.is_const:
            k: SymExpr = SymExpr.const(shift % max(dim.const_value, 1))
        elif shift >= 0 and c.prove_ge(dim, shift):
            k = SymExpr.const(shift)
        elif shift < 0 and c.prove_ge(dim, -shift):
            k = dim + shift
        else:
            c.assume(dim, ">=", 1, "roll: a dim rolled by a shift must not be empty")
            k = shift - floor_divide(ctx, shift, dim) * dim
        if k.is_const and k.const_value == 0:
            continue
        split = simplify_dim(dim - k)
        x = ctx.graph.add("concat", [slice_axis(ctx, x, axis, split, dim), slice_axis(ctx, x, axis, 0, split)], {"axis": axis})
    return x


@lower(aten.constant_pad_nd.default)
def _pad(ctx: Importer, fx_node, x: Node, pad: Sequence[int], value: float = 0.0) -> Node:
    rank = x.tensor_type.rank
    if any(isinstance(p, Node) for p in pad):
        return _pad_dynamic(ctx, x, pad, value)
    low, high = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        low[rank - 1 - i], high[rank - 1 - i] = int(pad[2 * i]), int(pad[2 * i + 1])
    return ctx.graph.add("pad", (x,), {"low": tuple(low), "high": tuple(high), "value": float(value)})


@lower(aten.pad.default)
def _pad_any_mode(ctx: Importer, fx_node, x: Node, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Node:
    """``F.pad`` as torch.export keeps it. Without this one lowering a model that pads
    (Swin's windows) was decomposed whole: 190 s of a 370 s compile."""
    if mode != "constant":
        raise LoweringError(f"pad mode {mode!r} (torch's decomposition spells it out)")
    return _pad(ctx, fx_node, x, pad, 0.0 if value is None else value)


def _pad_dynamic(ctx: Importer, x: Node, pad: Sequence[Any], value: float) -> Node:
    """Padding by amounts computed from sizes ("same" padding, which depends on a size's parity).

    An amount may be negative: the backward of such a padding crops by it. Each side crops by
    ``max(-amount, 0)`` (a slice), then grows by ``max(amount, 0)`` (blocks of ``value``
    concatenated), one axis at a time; where the sign is provable one of the two is nothing.
    """
    rank = x.tensor_type.rank
    for i in range(len(pad) // 2):
        axis = rank - 1 - i
        low, high = (as_expr(size_value(ctx, a)) for a in (pad[2 * i], pad[2 * i + 1]))
        crop_low, crop_high = _positive_part(ctx, -low), _positive_part(ctx, -high)
        if not (_is_zero(crop_low) and _is_zero(crop_high)):
            x = slice_axis(ctx, x, axis, crop_low, as_expr(x.shape[axis]) - crop_high)
        grow = [_positive_part(ctx, low), _positive_part(ctx, high)]
        blocks = [broadcast_to(ctx, scalar(ctx, value, x.dtype), [g if k == axis else d for k, d in enumerate(x.shape)]) if not _is_zero(g) else None for g in grow]
        if any(b is not None for b in blocks):
            x = ctx.graph.add("concat", [b for b in (blocks[0], x, blocks[1]) if b is not None], {"axis": axis})
    return x


def _is_zero(d: DimLike) -> bool:
    return as_expr(d).is_const and as_expr(d).const_value == 0


def _positive_part(ctx: Importer, e: SymExpr) -> DimLike:
    """``max(e, 0)``: ``e`` or 0 where the sign is provable, else an index op decides at run time."""
    c = ctx.graph.constraints
    if e.is_const:
        return max(e.const_value, 0)
    if c.prove_ge(e, 0):
        return e
    if c.prove_ge(-e, 0):
        return 0
    m = ctx.graph.add("imax", (ctx.index(e), ctx.index(0)))
    value = c.normalize(as_expr(m.type.value))  # type: ignore[union-attr]
    ctx.index_cache.setdefault(value, m)
    return value


@lower(aten.embedding.default)
def _embedding(ctx: Importer, fx_node, weight: Node, ids: Node, *args: Any) -> Node:
    flat = reshape(ctx, ids, [ids.tensor_type.numel()])
    rows = ctx.graph.add("index_select", (weight, flat), {"axis": 0})
    return reshape(ctx, rows, [*ids.shape, weight.shape[1]])


@lower(aten.index_select.default)
def _index_select(ctx: Importer, fx_node, x: Node, axis: int, index: Node) -> Node:
    return ctx.graph.add("index_select", (x, index), {"axis": norm_axis(axis, x.tensor_type.rank)})


@lower(aten.index.Tensor)
def _index(ctx: Importer, fx_node, x: Node, indices: Sequence[Any]) -> Node:
    axis, tensors = _index_tensors(indices)
    if len(tensors) > 1:
        return _index_several(ctx, x, axis, tensors)
    idx = tensors[0]
    if idx.dtype == "i1":
        return _mask_select(ctx, fx_node, x, axis, idx)
    flat = reshape(ctx, idx, [idx.tensor_type.numel()])
    picked = ctx.graph.add("index_select", (x, flat), {"axis": axis, "wrap_negative": True})  # x[-1] is x's last row
    shape = [*x.shape[:axis], *idx.shape, *x.shape[axis + 1 :]]
    return reshape(ctx, picked, shape)


def _index_tensors(indices: Sequence[Any]) -> tuple[int, list[Node]]:
    """The first dim the index tensors of ``indices`` (None: a whole dim) cover, and those tensors.
    Non-adjacent ones (torch moves their result dims to the front) are left to PyTorch."""
    present = [i for i, t in enumerate(indices) if t is not None]
    if not present:
        raise LoweringError("advanced indexing without an index tensor")
    if present != list(range(present[0], present[-1] + 1)):
        raise LoweringError("index tensors at dims that are not adjacent")
    return present[0], [indices[i] for i in present]


def _index_several(ctx: Importer, x: Node, axis: int, idx: list[Node]) -> Node:
    """``x[..., i0, i1, ...]`` over adjacent dims: one gather at the flat position of each tuple
    (the index tensors broadcast together: a mask function's batch and position ranges)."""
    if any(t.dtype not in ("i64", "i32") for t in idx):
        raise LoweringError("a boolean mask beside other index tensors")
    covered, rest = x.shape[axis : axis + len(idx)], x.shape[axis + len(idx) :]
    positions, shape = _flat_positions(ctx, idx, covered)
    rows = reshape(ctx, x, [*x.shape[:axis], product(covered), *rest])
    picked = ctx.graph.add("index_select", (rows, positions), {"axis": axis})
    return reshape(ctx, picked, [*x.shape[:axis], *shape, *rest])


def _flat_positions(ctx: Importer, idx: list[Node], covered: Sequence[DimLike]) -> tuple[Node, tuple[DimLike, ...]]:
    """The row-major position in ``covered`` of each tuple of integer ``idx`` (broadcast together),
    as a 1-d i64 tensor, and the broadcast shape. Negative indices count from the end, as in eager."""
    shape = broadcast_shapes(ctx, [t.shape for t in idx])
    flat: Node | None = None
    outside: Node | None = None  # a tuple with an index out of its dim's range
    for j, (t, size) in enumerate(zip(idx, covered)):
        t = convert(ctx, t, "i64")
        t = select(ctx, elementwise(ctx, "lt", [t, 0], "i64"), elementwise(ctx, "add", [t, dim_value(ctx, size)], "i64"), t, "i64")
        bad = elementwise(ctx, "logical_or", [elementwise(ctx, "lt", [t, 0], "i64"), elementwise(ctx, "ge", [t, dim_value(ctx, size)], "i64")], "i1")
        outside = bad if outside is None else elementwise(ctx, "logical_or", [outside, bad], "i1")
        stride = simplify_dim(product(covered[j + 1 :]))
        term = t if as_expr(stride) == as_expr(1) else elementwise(ctx, "mul", [t, dim_value(ctx, stride)], "i64")
        flat = term if flat is None else elementwise(ctx, "add", [flat, term], "i64")
    assert flat is not None and outside is not None
    # Such a tuple's flat position could land inside the rows (x[0, 5] of a 3x4 x is x[1, 1]): it
    # becomes -1, which the gather (negatives not wrapped) refuses with an IndexError, as eager does.
    flat = select(ctx, outside, -1, flat, "i64")
    return reshape(ctx, broadcast_to(ctx, flat, shape), [product(shape)]), shape


def _mask_select(ctx: Importer, fx_node, x: Node, axis: int, mask: Node) -> Node:
    """``x[..., mask]``: the dims ``mask`` covers become one, of the data-dependent count of its true elements.

    The covered dims are flattened and gathered at the mask's true positions
    (``nonzero``). Every indexing by one mask shares one ``nonzero``, so its
    results provably have the same count (a detector's boxes and scores).
    """
    k = mask.tensor_type.rank
    if k == 0:
        raise LoweringError("indexing by a 0-d boolean mask")
    covered = x.shape[axis : axis + k]
    if len(covered) != k:
        raise LoweringError(f"a {k}-d mask indexes dims {axis}..{axis + k - 1} of a {x.tensor_type.rank}-d tensor")
    c = ctx.graph.constraints
    for d, (m, n) in enumerate(zip(mask.shape, covered)):
        try:
            c.assume_equal(m, n, f"boolean mask dim {d} must equal the indexed dim {axis + d}")
        except ValueError as e:  # provably different
            raise LoweringError(str(e)) from e
    val = fx_node.meta.get("val")
    count = ctx.sym_to_expr(val.shape[axis]) if isinstance(val, torch.Tensor) else None
    positions = ctx.mask_positions.get(mask)
    if positions is None:
        name = count.as_symbol() if isinstance(count, SymExpr) else None
        flat_mask = reshape(ctx, mask, [mask.tensor_type.numel()])
        positions = ctx.graph.add("nonzero", (flat_mask,), {"count": name or c.new_symbol("nnz").as_symbol()})
        ctx.mask_positions[mask] = positions
        ctx.register_dims(positions)
    elif isinstance(count, SymExpr):
        c.add_equal(count, positions.shape[0])  # torch names each indexing's count anew; one mask, one count
    rows = reshape(ctx, x, [*x.shape[:axis], product(covered), *x.shape[axis + k :]])
    return ctx.graph.add("index_select", (rows, positions), {"axis": axis})


@lower(aten.gather.default)
def _gather(ctx: Importer, fx_node, x: Node, axis: int, index: Node, sparse_grad: bool = False) -> Node:
    return ctx.graph.add("gather", (x, index), {"axis": norm_axis(axis, x.tensor_type.rank)})


@lower(aten.scatter_add.default)
def _scatter_add(ctx: Importer, fx_node, x: Node, axis: int, index: Node, src: Node) -> Node:
    return ctx.graph.add("scatter_add", (x, index, src), {"axis": norm_axis(axis, x.tensor_type.rank)})


@lower(aten.index_put.default)
def _index_put(ctx: Importer, fx_node, x: Node, indices: Sequence[Any], values: Node, accumulate: bool = False) -> Node:
    """``x[:, ..., idx] += values`` along the axis of the index tensor (or the flattened axes of
    several adjacent ones): the gradient of an embedding lookup, of ``x[idx]``, of ``x[i, j]``
    or of ``index_select``."""
    if not accumulate:
        raise LoweringError("index_put that assigns (accumulate=False): duplicate indices make it order-dependent")
    axis, tensors = _index_tensors(indices)
    if indices[-1] is None:
        raise LoweringError("index_put with a None after the index tensors")
    if any(t.dtype not in ("i64", "i32") for t in tensors):
        raise LoweringError("index_put with a boolean index (masks have data-dependent shapes)")
    k = len(tensors)
    lead, covered, rest = list(x.shape[:axis]), list(x.shape[axis : axis + k]), list(x.shape[axis + k :])
    if k == 1:
        flat, shape = reshape(ctx, tensors[0], [tensors[0].tensor_type.numel()]), tuple(tensors[0].shape)
    else:  # several index tensors (the gradient of x[i, j]): at the flat position of each tuple
        flat, shape = _flat_positions(ctx, tensors, covered)
    n = product(shape)
    vals = broadcast_to(ctx, convert(ctx, values, x.dtype), [*lead, *shape, *rest])
    vals = reshape(ctx, vals, [*lead, n, *rest])
    index = ctx.graph.add("broadcast_in_dim", (flat, *ctx.sizes([*lead, n, *rest])), {"dims": (axis,)})
    rows = reshape(ctx, x, [*lead, product(covered), *rest])
    return reshape(ctx, ctx.graph.add("scatter_add", (rows, index, vals), {"axis": axis}), x.shape)


@lower(aten.scatter.value)
def _scatter_value(ctx: Importer, fx_node, x: Node, axis: int, index: Node, value: Any) -> Node:
    """``x`` with ``value`` written where ``index`` points along ``axis`` (a one-hot, in the
    gradient of a cross-entropy): every write stores the same value, so the order of duplicates
    does not matter. Marks the hits with a scatter-add of ones, then selects."""
    axis = norm_axis(axis, x.tensor_type.rank)
    zeros = broadcast_to(ctx, scalar(ctx, 0, "i32"), x.shape)
    ones = broadcast_to(ctx, scalar(ctx, 1, "i32"), index.shape)
    hits = ctx.graph.add("scatter_add", (zeros, convert(ctx, index, "i64"), ones), {"axis": axis})
    chosen = elementwise(ctx, "gt", [hits, 0], "i32")
    return ctx.graph.add("select", (chosen, broadcast_to(ctx, scalar(ctx, value, x.dtype), x.shape), x))


@lower(aten.slice_scatter.default)
def _slice_scatter(ctx: Importer, fx_node, x: Node, src: Node, axis: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Node:
    """``x`` with ``x[start:end:step]`` along ``axis`` replaced by ``src``: the gradient of a slice."""
    axis = norm_axis(axis, x.tensor_type.rank)
    dim = x.shape[axis]
    lo, hi = _norm_index(ctx, start, dim, 0), _norm_index(ctx, end, dim, dim)
    c = ctx.graph.constraints
    if int(step) != 1:
        # The raw start: a constant below the step is the phase even where the dim may be smaller
        # (then, a multiple of the step, it is 0 and so is everything scattered).
        phase = start if isinstance(start, int) and 0 <= start < int(step) else lo
        return _strided_slice_scatter(ctx, x, convert(ctx, src, x.dtype), axis, phase, hi, int(step))
    parts = []
    if not c.prove_equal(lo, 0):
        parts.append(slice_axis(ctx, x, axis, 0, lo))
    parts.append(convert(ctx, src, x.dtype))
    if not c.prove_equal(hi, dim):
        parts.append(slice_axis(ctx, x, axis, hi, dim))
    if len(parts) == 1:
        return parts[0]
    return ctx.graph.add("concat", parts, {"axis": axis})


def _strided_slice_scatter(ctx: Importer, x: Node, src: Node, axis: int, lo: DimLike, hi: DimLike, step: int) -> Node:
    """``x[lo::step] = src`` along ``axis`` where the dim is a multiple of ``step`` and ``lo < step``
    (Swin's patch merging takes ``x[:, r::2, c::2]`` of an even-sized map): the dim split into
    (dim / step, step), the phase ``lo`` of the second axis replaced, and merged back. Anything
    else is left to PyTorch."""
    c = ctx.graph.constraints
    dim = as_expr(x.shape[axis])
    blocks = exact_divide(c.normalize(dim), SymExpr.const(step)) if step > 0 else None
    start = as_expr(lo)
    if blocks is None or not start.is_const or not 0 <= start.const_value < step or not c.prove_equal(hi, dim):
        raise LoweringError("slice_scatter with a step, other than a phase of a dim that is a multiple of the step")
    phase = start.const_value
    shape = list(x.shape)
    split = tuple(shape[:axis] + [simplify_dim(blocks), step] + shape[axis + 1 :])
    grid = reshape(ctx, x, split)
    parts = []
    if phase > 0:
        parts.append(slice_axis(ctx, grid, axis + 1, 0, phase))
    parts.append(reshape(ctx, src, tuple(shape[:axis] + [simplify_dim(blocks), 1] + shape[axis + 1 :])))
    if phase + 1 < step:
        parts.append(slice_axis(ctx, grid, axis + 1, phase + 1, step))
    merged = parts[0] if len(parts) == 1 else ctx.graph.add("concat", parts, {"axis": axis + 1})
    return reshape(ctx, merged, tuple(shape))


@lower(aten.cumsum.default)
def _cumsum(ctx: Importer, fx_node, x: Node, axis: int, dtype: Any = None) -> Node:
    return ctx.graph.add("cumsum", (convert(ctx, x, meta_dtype(fx_node)),), {"axis": norm_axis(axis, x.tensor_type.rank)})


__all__: list[str] = []
_ = torch
