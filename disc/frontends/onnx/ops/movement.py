"""Shape and data movement: reshapes, gathers, slices, concatenation, pads, scatters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from disc.frontends.arrays import NeedsValue, arange, reshape_target
from disc.frontends.arrays import known as _known
from disc.frontends.arrays import known_ints as _ints
from disc.frontends.arrays import shape_dims as _dims_of
from disc.frontends.onnx.importer import ELEM_TYPES, DimValue, OnnxImporter, ShapeValue
from disc.frontends.onnx.ops import onnx_op
from disc.frontends.onnx.ops.common import known_dim, require_divisible
from disc.ir.builder import (
    LoweringError,
    broadcast_shapes,
    broadcast_to,
    convert,
    dim_value,
    elementwise,
    flip,
    positions,
    reshape,
    scalar,
    select,
    slice_bound,
    tile,
    triangle,
)
from disc.ir.graph import Node
from disc.ir.registry import normalize_axis
from disc.ir.types import FLOAT_DTYPES, dtype_of_numpy
from disc.shape.expr import DimLike, SymExpr, as_expr, product


@onnx_op("Transpose")
def _transpose(imp: OnnxImporter, node: Any, x: Any, perm: Sequence[int] | None = None) -> Node:
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    perm = tuple(perm) if perm is not None else tuple(reversed(range(rank)))
    return x if perm == tuple(range(rank)) else imp.graph.add("transpose", (x,), {"perm": perm})


@onnx_op("Shape")
def _shape(imp: OnnxImporter, node: Any, x: Any, start: int = 0, end: int | None = None) -> ShapeValue:
    dims = [len(x.dims)] if isinstance(x, ShapeValue) else list(imp.tensor(x).shape)
    return ShapeValue(dims[start:end])


@onnx_op("Size")
def _size(imp: OnnxImporter, node: Any, x: Any) -> Any:
    if isinstance(x, ShapeValue):  # the rank of a Shape's tensor: known
        return np.array(len(x.dims), np.int64)
    if isinstance(x, np.ndarray):
        return np.array(x.size, np.int64)
    return DimValue(product(imp.tensor(x).shape))  # a compile-time count, usable as a shape


@onnx_op("Reshape")
def _reshape(imp: OnnxImporter, node: Any, x: Any, shape: Any, allowzero: int = 0) -> Any:
    kept = _shape_value_reshaped(x, _known(shape))
    if kept is not None:
        return kept
    x = imp.tensor(x)
    return reshape(imp, x, reshape_target(imp, x, _dims_of(shape, "Reshape's shape"), allowzero))


def _shape_value_reshaped(x: Any, target: np.ndarray | None) -> ShapeValue | DimValue | None:
    """A shape value (or one of its dims) reshaped to 1-d, or a one-dim shape value to 0-d, stays
    one, so that a Concat of shapes after it still reads symbolic dims: torch.export writes a
    flattened map's h * w as a Reshape of that 0-d product to [-1] before joining it to the batch."""
    if target is None or not isinstance(x, (ShapeValue, DimValue)):
        return None
    dims = [x.dim] if isinstance(x, DimValue) else list(x.dims)
    wanted = [int(v) for v in np.asarray(target).reshape(-1)]
    if wanted in ([-1], [len(dims)]):
        return ShapeValue(dims, x.dtype)
    if wanted == [] and len(dims) == 1:
        return DimValue(dims[0], x.dtype)
    return None


@onnx_op("Flatten")
def _flatten(imp: OnnxImporter, node: Any, x: Any, axis: int = 1) -> Node:
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    if not -rank <= axis <= rank:
        raise LoweringError(f"Flatten axis {axis} outside [-{rank}, {rank}]")
    axis = axis + rank if axis < 0 else axis
    return reshape(imp, x, [product(x.shape[:axis]), product(x.shape[axis:])])


def _axes(imp: OnnxImporter, node: Any, axes_in: Any, axes_attr: Any) -> list[int]:
    if axes_attr is not None:
        return list(axes_attr)
    return _ints(axes_in, f"{node.op_type} axes") if axes_in is not None else []


@onnx_op("Unsqueeze")
def _unsqueeze(imp: OnnxImporter, node: Any, x: Any, axes_in: Any = None, axes: Any = None) -> Any:
    wanted = _axes(imp, node, axes_in, axes)
    if isinstance(x, DimValue) and list(wanted) in ([0], [-1]):
        return ShapeValue([x.dim])  # one dim as a 1-element shape (what a Concat of shapes reads)
    if isinstance(x, np.ndarray):
        return np.expand_dims(x, tuple(wanted))
    x = imp.tensor(x)
    rank = x.tensor_type.rank + len(wanted)
    places = sorted(normalize_axis(a, rank, "Unsqueeze") for a in wanted)
    shape = list(x.shape)
    for p in places:
        shape.insert(p, 1)
    return reshape(imp, x, shape)


@onnx_op("Squeeze")
def _squeeze(imp: OnnxImporter, node: Any, x: Any, axes_in: Any = None, axes: Any = None) -> Any:
    if isinstance(x, ShapeValue) and len(x.dims) == 1 and (axes_in is None and axes is None or _axes(imp, node, axes_in, axes) in ([0], [-1])):
        return DimValue(x.dims[0])
    if isinstance(x, np.ndarray) and x.dtype.kind in "iub":  # shape arithmetic on constants
        wanted = _axes(imp, node, axes_in, axes)
        return np.squeeze(x, tuple(wanted)) if wanted else np.squeeze(x)
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    wanted = _axes(imp, node, axes_in, axes)
    c = imp.graph.constraints
    drop = {normalize_axis(a, rank, "Squeeze") for a in wanted} if wanted else {i for i, d in enumerate(x.shape) if c.prove_is_one(d)}
    for a in drop:
        if not c.prove_is_one(x.shape[a]):
            raise LoweringError(f"Squeeze: dim {a} ({x.shape[a]}) is not provably 1")
    return reshape(imp, x, [d for i, d in enumerate(x.shape) if i not in drop])


@onnx_op("Gather")
def _gather(imp: OnnxImporter, node: Any, x: Any, indices: Any, axis: int = 0) -> Any:
    if isinstance(x, ShapeValue):
        idx = _ints(indices, "Gather's indices into a shape")
        picked = [x.dims[i] for i in idx]
        return DimValue(picked[0]) if np.asarray(_known(indices)).ndim == 0 else ShapeValue(picked)
    k = _known(indices)
    if isinstance(x, np.ndarray) and x.dtype.kind in "iub" and x.size <= 64 and k is not None:  # shape arithmetic on constants
        return np.take(x, k, axis=normalize_axis(axis, x.ndim, "Gather"))
    data = imp.tensor(x)
    rank = data.tensor_type.rank
    axis = normalize_axis(axis, rank, "Gather")
    k = _known(indices)
    if k is not None and k.ndim == 0:  # one index: a slice of width 1, then the dim dropped
        start = as_expr(data.shape[axis]) + int(k) if int(k) < 0 else as_expr(int(k))
        picked = imp.graph.add("slice", (data, imp.index(start), imp.index(start + 1)), {"axis": axis, "step": 1})
        return reshape(imp, picked, [d for j, d in enumerate(data.shape) if j != axis])
    index = imp.tensor(indices)
    flat = reshape(imp, index, [product(index.shape)])
    rows = imp.graph.add("index_select", (data, flat), {"axis": axis, "wrap_negative": True})  # ONNX: [-size, size)
    return reshape(imp, rows, [*data.shape[:axis], *index.shape, *data.shape[axis + 1 :]])


def _true_positions(imp: OnnxImporter, mask: Node) -> Node:
    """The flat positions of ``mask``'s true elements, ascending; their count is a fresh symbol."""
    flat = reshape(imp, mask, [product(mask.shape)])
    positions = imp.graph.add("nonzero", (flat,), {"count": imp.graph.constraints.new_symbol("nnz").as_symbol()})
    imp.register_dims(positions)
    return positions


@onnx_op("Compress")
def _compress(imp: OnnxImporter, node: Any, x: Any, condition: Any, axis: int | None = None) -> Node:
    """numpy.compress: the slices along ``axis`` (of the flattened input if none) where condition
    holds; a condition shorter than the axis drops the slices past its end."""
    data, cond = imp.tensor(x), imp.tensor(condition)
    if cond.tensor_type.rank != 1:
        raise LoweringError(f"Compress: condition must be 1-D, got shape {cond.shape}")
    if axis is None:
        data, axis = reshape(imp, data, [product(data.shape)]), 0
    axis = normalize_axis(axis, data.tensor_type.rank, "Compress")
    imp.graph.constraints.assume(as_expr(data.shape[axis]) - cond.shape[0], ">=", 0, f"Compress: the condition may not be longer than input dim {axis}")
    keep = _true_positions(imp, elementwise(imp, "ne", [cond, False], "i1") if cond.dtype != "i1" else cond)
    return imp.graph.add("index_select", (data, keep), {"axis": axis})


@onnx_op("NonZero")
def _nonzero(imp: OnnxImporter, node: Any, x: Any) -> Node:
    """[rank, count]: each nonzero element's index, in row-major order (flat positions unravelled)."""
    data = imp.tensor(x)
    if data.tensor_type.rank == 0:
        raise LoweringError("NonZero of a 0-d tensor")
    flat = _true_positions(imp, elementwise(imp, "ne", [data, False if data.dtype == "i1" else 0], "i1"))
    rows = []
    for d in range(data.tensor_type.rank):
        stride = imp.shape_tensor([product(data.shape[d + 1 :])])
        index = elementwise(imp, "floor_div", [flat, stride], "i64")
        if d > 0:
            index = elementwise(imp, "remainder", [index, imp.shape_tensor([data.shape[d]])], "i64")
        rows.append(reshape(imp, index, [1, flat.shape[0]]))
    return rows[0] if len(rows) == 1 else imp.graph.add("concat", tuple(rows), {"axis": 0})


@onnx_op("GatherElements")
def _gather_elements(imp: OnnxImporter, node: Any, x: Any, indices: Any, axis: int = 0) -> Node:
    data, index = imp.tensor(x), imp.tensor(indices)
    axis = normalize_axis(axis, data.tensor_type.rank, "GatherElements")
    return imp.graph.add("gather", (data, index), {"axis": axis, "wrap_negative": True})


@onnx_op("Concat")
def _concat(imp: OnnxImporter, node: Any, *parts: Any, axis: int = 0) -> Any:
    if any(isinstance(p, (ShapeValue, DimValue)) for p in parts) and all(isinstance(p, (ShapeValue, DimValue, np.ndarray)) for p in parts):
        dims: list[DimLike] = []
        for p in parts:
            dims += [p.dim] if isinstance(p, DimValue) else _dims_of(p, "Concat of shape values")
        return ShapeValue(dims)
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts, axis=axis)
    nodes = [imp.tensor(p) for p in parts]
    axis = normalize_axis(axis, nodes[0].tensor_type.rank, "Concat")
    return imp.graph.add("concat", tuple(nodes), {"axis": axis})


@onnx_op("Slice")
def _slice(imp: OnnxImporter, node: Any, x: Any, starts: Any, ends: Any, axes: Any = None, steps: Any = None) -> Any:
    # Bounds may be dims (an exporter's position_ids[:, :seq]): a symbolic bound is a length, >= 0.
    s, e = _dims_of(starts, "Slice starts"), _dims_of(ends, "Slice ends")
    ax = _ints(axes, "Slice axes") if axes is not None else list(range(len(s)))
    st = _ints(steps, "Slice steps") if steps is not None else [1] * len(s)
    symbolic = [v for v in (*s, *e) if not isinstance(v, int)]
    if isinstance(x, ShapeValue) and ax == [0] and st == [1] and not symbolic:
        return ShapeValue(x.dims[slice(s[0], e[0])])
    for v in symbolic:
        if not imp.graph.constraints.prove_ge(v, 0):
            imp.graph.constraints.assume(v, ">=", 0, f"Slice: the bound {v} computed from shapes must not be negative")
    if symbolic and any(step < 0 for step in st):
        raise LoweringError("Slice with a negative step and bounds computed from shapes")
    if isinstance(x, np.ndarray) and x.dtype.kind in "iub" and x.size <= 64 and not symbolic:  # shape arithmetic on constants
        index = [slice(None)] * x.ndim
        for a, lo, hi, step in zip(ax, s, e, st):
            index[normalize_axis(a, x.ndim, "Slice")] = slice(lo, hi, step)
        return x[tuple(index)]
    out = imp.tensor(x)
    for a, lo, hi, step in zip(ax, s, e, st):
        a = normalize_axis(a, out.tensor_type.rank, "Slice")
        if step == 0:
            raise LoweringError(f"Slice step 0 on axis {a}")
        if step < 0:
            out = _reversed_slice(imp, out, a, lo, hi, -step)
            continue
        bounds = [slice_bound(imp, out.shape[a], v) for v in (lo, hi)]
        out = imp.graph.add("slice", (out, *bounds), {"axis": a, "step": step})
    return out


def _reversed_slice(imp: OnnxImporter, x: Node, axis: int, start: int, stop: int, step: int) -> Node:
    """x[start:stop:-step] along ``axis``: a forward slice of the flipped axis, whose position j
    is n - 1 - j of the original."""
    n = known_dim(x.shape[axis])
    if n is None and (start == -1 or start >= 2**62) and stop <= -(2**62):  # the whole axis backwards (a flip)
        flipped = flip(imp, x, axis)
        return flipped if step == 1 else imp.graph.add("slice", (flipped, imp.index(0), imp.index(x.shape[axis])), {"axis": axis, "step": step})
    if n is None:
        raise LoweringError(f"Slice with a negative step on axis {axis}, whose size ({x.shape[axis]}) is not known when the model is compiled")
    first, last = (v + n if v < 0 else v for v in (start, stop))
    first, last = min(max(first, -1), n - 1), min(max(last, -1), n - 1)  # numpy's clamping for a negative step
    lo, hi = n - 1 - first, n - 1 - last
    return imp.graph.add("slice", (flip(imp, x, axis), imp.index(lo), imp.index(max(hi, lo))), {"axis": axis, "step": step})


@onnx_op("SpaceToDepth", "DepthToSpace")
def _space_depth(imp: OnnxImporter, node: Any, x: Any, blocksize: int, mode: str = "DCR") -> Node:
    """Blocks of ``blocksize`` x ``blocksize`` pixels moved into channels or back: a reshape, a
    transpose, a reshape. DCR mode puts the block index in the channel's high part, CRD in its
    low part."""
    x = imp.tensor(x)
    if x.tensor_type.rank != 4:
        raise LoweringError(f"{node.op_type} takes a 4-d NCHW input, not rank {x.tensor_type.rank}")
    n, c, h, w = x.shape
    b = blocksize
    c, h, w = as_expr(c), as_expr(h), as_expr(w)
    if node.op_type == "SpaceToDepth":
        for i, d in ((2, h), (3, w)):
            require_divisible(imp, d, b, f"SpaceToDepth: dim {i} must be divisible by blocksize {b}")
        if mode not in ("DCR", "CRD"):
            raise LoweringError(f"SpaceToDepth mode {mode!r} (ONNX allows DCR and CRD)")
        blocks = reshape(imp, x, [n, c, h // b, b, w // b, b])
        moved = imp.graph.add("transpose", (blocks,), {"perm": (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)})
        return reshape(imp, moved, [n, c * b * b, h // b, w // b])
    require_divisible(imp, c, b * b, f"DepthToSpace: channels (dim 1) must be divisible by blocksize^2 = {b * b}")
    if mode == "DCR":
        blocks, perm = reshape(imp, x, [n, b, b, c // (b * b), h, w]), (0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        blocks, perm = reshape(imp, x, [n, c // (b * b), b, b, h, w]), (0, 1, 4, 2, 5, 3)
    else:
        raise LoweringError(f"DepthToSpace mode {mode!r} (ONNX allows DCR and CRD)")
    return reshape(imp, imp.graph.add("transpose", (blocks,), {"perm": perm}), [n, c // (b * b), h * b, w * b])


@onnx_op("EyeLike")
def _eye_like(imp: OnnxImporter, node: Any, x: Any, dtype: int | None = None, k: int = 0) -> Node:
    x = imp.tensor(x)
    if x.tensor_type.rank != 2:
        raise LoweringError(f"EyeLike takes a 2-d input, not rank {x.tensor_type.rank}")
    out = x.dtype if dtype is None else ELEM_TYPES.get(dtype)
    if out is None:
        raise LoweringError(f"EyeLike to element type {dtype}, which disc does not run")
    rows, cols = x.shape
    on_diagonal = elementwise(imp, "logical_and", [triangle(imp, rows, cols, True, k), triangle(imp, rows, cols, False, k)], "i1")
    return convert(imp, on_diagonal, out)


@onnx_op("OneHot")
def _one_hot(imp: OnnxImporter, node: Any, indices: Any, depth: Any, values: Any, axis: int = -1) -> Node:
    """``values[1]`` where a new axis' position equals the index (a negative index counts from
    ``depth``), ``values[0]`` elsewhere; an index outside [-depth, depth) hits nothing."""
    size = _ints(depth, "OneHot's depth")[0]
    idx = convert(imp, imp.tensor(indices), "i64")  # float indices truncate, as ONNX casts them
    idx = select(imp, elementwise(imp, "lt", [idx, 0], "i64"), elementwise(imp, "add", [idx, size], "i64"), idx, "i64")
    rank = idx.tensor_type.rank + 1
    a = normalize_axis(axis, rank, "OneHot")
    shape = [*idx.shape[:a], size, *idx.shape[a:]]
    along = positions(imp, shape, a)
    spread = imp.graph.add("broadcast_in_dim", (idx, *imp.sizes(shape)), {"dims": tuple(i for i in range(rank) if i != a)})
    v = imp.tensor(values)
    off, on = (reshape(imp, imp.graph.add("slice", (v, imp.index(i), imp.index(i + 1)), {"axis": 0, "step": 1}), []) for i in (0, 1))
    return select(imp, imp.graph.add("eq", (along, spread)), on, off, v.dtype)


@onnx_op("ReverseSequence")
def _reverse_sequence(imp: OnnxImporter, node: Any, x: Any, lens: Any, batch_axis: int = 1, time_axis: int = 0) -> Node:
    """Each batch entry's first ``lens[b]`` time steps reversed, the rest kept: a gather along
    time at ``lens[b] - 1 - t`` for t < lens[b], else t."""
    x = imp.tensor(x)
    shape = x.shape
    t = positions(imp, shape, time_axis)
    n = imp.graph.add("broadcast_in_dim", (convert(imp, imp.tensor(lens), "i64"), *imp.sizes(shape)), {"dims": (batch_axis,)})
    back = elementwise(imp, "sub", [elementwise(imp, "sub", [n, 1], "i64"), t], "i64")
    index = select(imp, imp.graph.add("lt", (t, n)), back, t, "i64")
    return imp.graph.add("gather", (x, index), {"axis": time_axis})


def _wrapped_index(imp: OnnxImporter, index: Node, size: DimLike) -> Node:
    """A negative index counted from the end of a dim of ``size``."""
    index = convert(imp, index, "i64")
    n = dim_value(imp, size)
    return select(imp, elementwise(imp, "lt", [index, 0], "i64"), elementwise(imp, "add", [index, n], "i64"), index, "i64")


def _tuple_offsets(imp: OnnxImporter, op: str, index: Node, shape: Sequence[DimLike], batch_dims: int) -> tuple[Node, int]:
    """For GatherND/ScatterND: each index tuple (``index``'s last axis; negatives counted from the
    end), preceded by its batch position, as one flat offset into ``shape``'s leading dims.
    Returns the offsets (of ``index``'s shape less its last axis) and how many dims they cover."""
    depth = known_dim(index.shape[-1])
    if depth is None:
        raise LoweringError(f"{op}: the index tuples' length (the last dim of indices, {index.shape[-1]}) must be known when the model is compiled")
    lead = batch_dims + depth
    if lead > len(shape):
        raise LoweringError(f"{op}: batch_dims {batch_dims} + tuple length {depth} exceed the data's rank {len(shape)}")
    spots = list(index.shape[:-1])
    flat = None
    for i in range(lead):
        if i < batch_dims:
            part = imp.graph.add("broadcast_in_dim", (imp.graph.add("iota", (imp.index(shape[i]),), {"dtype": "i64"}), *imp.sizes(spots)), {"dims": (i,)})
        else:
            j = i - batch_dims
            part = reshape(imp, imp.graph.add("slice", (index, imp.index(j), imp.index(j + 1)), {"axis": index.tensor_type.rank - 1, "step": 1}), spots)
            part = _wrapped_index(imp, part, shape[i])
        if flat is None:
            flat = part
        else:
            size = dim_value(imp, shape[i])
            flat = elementwise(imp, "add", [elementwise(imp, "mul", [flat, size], "i64"), part], "i64")
    return flat, lead


@onnx_op("GatherND")
def _gather_nd(imp: OnnxImporter, node: Any, x: Any, indices: Any, batch_dims: int = 0) -> Node:
    """Slices of ``x`` at the index tuples of ``indices``' last axis, as one index_select on ``x``
    with its batch and indexed dims flattened."""
    data, index = imp.tensor(x), imp.tensor(indices)
    flat, lead = _tuple_offsets(imp, "GatherND", index, data.shape, batch_dims)
    spots = list(index.shape[:-1])
    rows = reshape(imp, data, [product(data.shape[:lead]), *data.shape[lead:]])
    picked = imp.graph.add("index_select", (rows, reshape(imp, flat, [product(spots)])), {"axis": 0})
    return reshape(imp, picked, [*spots, *data.shape[lead:]])


def _scatter(imp: OnnxImporter, node: Any, data: Node, index: Node, updates: Node, axis: int, reduction: str) -> Node:
    """``data`` with ``updates`` written (or added) at ``index`` along ``axis`` (index, updates of one
    shape): scatter_add of the updates, and for a plain write a scatter_add of ones marking which
    elements were written. ONNX leaves duplicate indices of a plain write undefined."""
    if reduction not in ("none", "add"):
        raise LoweringError(f"{node.op_type} with reduction={reduction!r} (disc scatters with none and add)")
    if data.dtype == "i1":
        raise LoweringError(f"{node.op_type} on bool data")
    if reduction == "add":
        return imp.graph.add("scatter_add", (data, index, updates), {"axis": axis})
    zero = broadcast_to(imp, scalar(imp, 0, data.dtype), data.shape)
    written = imp.graph.add("scatter_add", (zero, index, updates), {"axis": axis})
    marks = imp.graph.add("scatter_add", (zero, index, broadcast_to(imp, scalar(imp, 1, data.dtype), updates.shape)), {"axis": axis})
    return select(imp, elementwise(imp, "gt", [marks, 0], data.dtype), written, data, data.dtype)


@onnx_op("ScatterElements", "Scatter")
def _scatter_elements(imp: OnnxImporter, node: Any, x: Any, indices: Any, updates: Any, axis: int = 0, reduction: str = "none") -> Node:
    data = imp.tensor(x)
    a = normalize_axis(axis, data.tensor_type.rank, node.op_type)
    return _scatter(imp, node, data, _wrapped_index(imp, imp.tensor(indices), data.shape[a]), imp.tensor(updates), a, reduction)


@onnx_op("ScatterND")
def _scatter_nd(imp: OnnxImporter, node: Any, x: Any, indices: Any, updates: Any, reduction: str = "none") -> Node:
    """Slices of ``data`` at the index tuples of ``indices``' last axis replaced (or added to): one
    scatter along the flattened indexed dims."""
    data, index, upd = imp.tensor(x), imp.tensor(indices), imp.tensor(updates)
    flat, depth = _tuple_offsets(imp, "ScatterND", index, data.shape, 0)
    spots = list(index.shape[:-1])
    rest = list(data.shape[depth:])
    count = product(spots)
    rows = reshape(imp, data, [product(data.shape[:depth]), *rest])
    values = reshape(imp, upd, [count, *rest])
    where = imp.graph.add("broadcast_in_dim", (reshape(imp, flat, [count]), *imp.sizes(values.shape)), {"dims": (0,)})
    return reshape(imp, _scatter(imp, node, rows, where, values, 0, reduction), data.shape)


@onnx_op("TensorScatter")
def _tensor_scatter(imp: OnnxImporter, node: Any, past_cache: Any, update: Any, write_indices: Any = None, mode: str = "linear", axis: int = -2) -> Node:
    """A KV-cache write: along ``axis``, cache position j of batch b takes update position
    j - write_indices[b] (modulo the cache length in circular mode) where that lies in the
    update, and keeps the past value elsewhere. Written as a gather from the update, so every
    output element is computed once (no scatter)."""
    if mode not in ("linear", "circular"):
        raise LoweringError(f"TensorScatter: mode {mode!r}; ONNX takes 'linear' or 'circular'")
    cache, upd = imp.tensor(past_cache), imp.tensor(update)
    rank = cache.tensor_type.rank
    a = normalize_axis(axis, rank, "TensorScatter")
    if a == 0:
        raise LoweringError("TensorScatter: axis may not be 0 (the batch dim)")
    c = imp.graph.constraints
    for d in range(rank):
        if d != a:
            c.assume_equal(cache.shape[d], upd.shape[d], f"TensorScatter: update dim {d} must equal the cache's")
    c.assume(as_expr(cache.shape[a]) - upd.shape[a], ">=", 0, f"TensorScatter: the update may not be longer than the cache along axis {a}")
    offset = positions(imp, cache.shape, a)
    if write_indices is not None:
        start = convert(imp, imp.tensor(write_indices), "i64")
        offset = elementwise(imp, "sub", [offset, imp.graph.add("broadcast_in_dim", (start, *imp.sizes(cache.shape)), {"dims": (0,)})], "i64")
    if mode == "circular":
        offset = elementwise(imp, "remainder", [offset, imp.shape_tensor([cache.shape[a]])], "i64")
    inside = elementwise(imp, "logical_and", [elementwise(imp, "ge", [offset, 0], "i64"), elementwise(imp, "lt", [offset, imp.shape_tensor([upd.shape[a]])], "i64")], "i1")
    taken = imp.graph.add("gather", (upd, select(imp, inside, offset, 0, "i64")), {"axis": a})
    return select(imp, inside, taken, cache, cache.dtype)


@onnx_op("Expand")
def _expand(imp: OnnxImporter, node: Any, x: Any, shape: Any) -> Node:
    x = imp.tensor(x)
    target = _dims_of(shape, "Expand's shape")
    return broadcast_to(imp, x, broadcast_shapes(imp, [x.shape, target]))


@onnx_op("ConstantOfShape")
def _constant_of_shape(imp: OnnxImporter, node: Any, shape: Any, value: Any = None) -> Node:
    fill = value if value is not None else np.zeros((1,), np.float32)
    dims = _dims_of(shape, "ConstantOfShape's shape")
    sizes = [known_dim(d) for d in dims]
    if None not in sizes and np.asarray(fill).dtype.kind in "iu" and int(np.prod(sizes)) <= 64:
        return np.full(sizes, np.asarray(fill).reshape(-1)[0])  # small integer fills are shape arithmetic
    scalar = imp.graph.add_constant(np.asarray(fill).reshape(()))
    return imp.graph.add("broadcast_in_dim", (scalar, *imp.sizes(dims)), {"dims": ()})


@onnx_op("Constant")
def _constant(imp: OnnxImporter, node: Any, value: Any = None, value_float: float | None = None, value_int: int | None = None, value_floats: Any = None, value_ints: Any = None) -> np.ndarray:
    if value is not None:
        return value
    if value_float is not None:
        return np.array(value_float, np.float32)
    if value_int is not None:
        return np.array(value_int, np.int64)
    if value_floats is not None:
        return np.array(value_floats, np.float32)
    if value_ints is not None:
        return np.array(value_ints, np.int64)
    raise LoweringError("Constant without a value")


@onnx_op("Range")
def _range(imp: OnnxImporter, node: Any, start: Any, limit: Any, delta: Any) -> Any:
    dtype = dtype_of_numpy(start.dtype) if isinstance(start, np.ndarray) else start.dtype  # a Node or a DimValue
    return arange(imp, start, limit, delta, dtype)


@onnx_op("Pad")
def _pad(imp: OnnxImporter, node: Any, x: Any, pads: Any, value: Any = None, axes: Any = None, mode: str = "constant") -> Node:
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    amounts = _ints(pads, "Pad's pads")
    chosen = [normalize_axis(a, rank, "Pad") for a in _ints(axes, "Pad's axes")] if axes is not None else list(range(rank))
    low, high = [0] * rank, [0] * rank
    for i, a in enumerate(chosen):
        low[a], high[a] = amounts[i], amounts[i + len(chosen)]
    if mode in ("edge", "reflect", "wrap"):
        for a in range(rank):
            x = _pad_from_data(imp, x, a, low[a], high[a], mode)
        return x
    if mode != "constant":
        raise LoweringError(f"Pad mode {mode!r} (ONNX allows constant, reflect, edge, wrap)")
    fill = 0.0 if value is None else float(np.asarray(_known(value)).reshape(-1)[0]) if _known(value) is not None else None
    if fill is None and isinstance(value, Node) and value.op == "input":
        raise NeedsValue("Pad's value", value.name)
    if fill is None:
        raise LoweringError("Pad's value must be a constant")
    return imp.graph.add("pad", (x,), {"low": tuple(low), "high": tuple(high), "value": fill if x.dtype in FLOAT_DTYPES else int(fill)})


def _pad_from_data(imp: OnnxImporter, x: Node, axis: int, low: int, high: int, mode: str) -> Node:
    """``x`` padded along ``axis`` with its own elements: the edge repeated, a mirror without the
    edge (reflect) or the far end (wrap)."""
    if low == 0 and high == 0:
        return x
    n = x.shape[axis]
    c = imp.graph.constraints
    if low < 0 or high < 0:
        raise LoweringError(f"Pad mode {mode!r} with negative pads ({low}, {high}) on axis {axis}")
    need = max(max(low, high) + (1 if mode == "reflect" else 0), 1)
    if not c.prove_ge(n, need):  # a dim known only at run time is checked there
        if known_dim(n) is not None:
            raise LoweringError(f"Pad mode {mode!r}: axis {axis} has {n} elements, fewer than the {need} that pads ({low}, {high}) need")
        c.assume(n, ">=", need, f"Pad mode {mode!r}: axis {axis} must have at least {need} elements for pads ({low}, {high})")

    def part(start: DimLike, stop: DimLike) -> Node:
        return imp.graph.add("slice", (x, imp.index(start), imp.index(stop)), {"axis": axis, "step": 1})

    def repeated(edge: Node, count: int) -> Node:
        return broadcast_to(imp, edge, [count if i == axis else d for i, d in enumerate(x.shape)])

    end = as_expr(n)
    if mode == "edge":
        before, after = repeated(part(0, 1), low), repeated(part(end - 1, end), high)
    elif mode == "reflect":
        before, after = flip(imp, part(1, low + 1), axis), flip(imp, part(end - 1 - high, end - 1), axis)
    else:
        before, after = part(end - low, end), part(0, high)
    pieces = ([before] if low else []) + [x] + ([after] if high else [])
    return imp.graph.add("concat", pieces, {"axis": axis})


@onnx_op("CenterCropPad")
def _center_crop_pad(imp: OnnxImporter, node: Any, x: Any, shape: Any, axes: Any = None) -> Node:
    """Each chosen axis cut or zero-padded to its target length around the centre (the odd
    element cut from, or padded at, the end)."""
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    targets = _ints(shape, "CenterCropPad's shape")
    chosen = [normalize_axis(a, rank, "CenterCropPad") for a in axes] if axes is not None else list(range(rank))
    if len(targets) != len(chosen):
        raise LoweringError(f"CenterCropPad: {len(targets)} target lengths for {len(chosen)} axes")
    for a, want in zip(chosen, targets):
        have = known_dim(x.shape[a])
        if have is None:
            raise LoweringError(f"CenterCropPad on axis {a}, whose length ({x.shape[a]}) is not known when the model is compiled")
        if want < have:
            start = (have - want) // 2
            x = imp.graph.add("slice", (x, imp.index(start), imp.index(start + want)), {"axis": a, "step": 1})
        elif want > have:
            low, high = [0] * rank, [0] * rank
            low[a] = (want - have) // 2
            high[a] = want - have - low[a]
            x = imp.graph.add("pad", (x,), {"low": tuple(low), "high": tuple(high), "value": 0.0 if x.dtype in FLOAT_DTYPES else 0})
    return x


@onnx_op("Split")
def _split(imp: OnnxImporter, node: Any, x: Any, split: Any = None, axis: int = 0, num_outputs: int | None = None) -> list[Any]:
    if isinstance(x, np.ndarray) and x.dtype.kind in "iu" and x.ndim == 1:  # pieces of a known shape stay known
        count, total = len(node.output), x.size
        step = -(-total // count)
        sizes = _ints(split, "Split's sizes") if split is not None else [min(step, total - i * step) for i in range(count)]
        return np.split(x, np.cumsum(sizes)[:-1])
    x = imp.tensor(x)
    axis = normalize_axis(axis, x.tensor_type.rank, "Split")
    n = x.shape[axis]
    count = len(node.output)
    if split is not None:
        sizes: list[DimLike] = list(_ints(split, "Split's sizes"))
    elif isinstance(n, int) or (isinstance(n, SymExpr) and n.is_const):
        total = int(n)
        step = -(-total // count)
        sizes = [min(step, total - i * step) for i in range(count)]
    else:
        sizes = [as_expr(n) // count] * count
        if not imp.graph.constraints.prove_divisible(n, count):
            raise LoweringError(f"Split of a dim ({n}) not provably divisible by {count}")
    outs, start = [], as_expr(0)
    for size in sizes:
        stop = start + size
        outs.append(imp.graph.add("slice", (x, imp.index(start), imp.index(stop)), {"axis": axis, "step": 1}))
        start = stop
    return outs


@onnx_op("Tile")
def _tile(imp: OnnxImporter, node: Any, x: Any, repeats: Any) -> Node:
    return tile(imp, imp.tensor(x), _dims_of(repeats, "Tile's repeats"))  # (a repeat may be a dim: DeBERTa's mask over the batch)


@onnx_op("Trilu")
def _trilu(imp: OnnxImporter, node: Any, x: Any, k: Any = None, upper: int = 1) -> Node:
    x = imp.tensor(x)
    diagonal = _ints(k, "Trilu's k")[0] if k is not None else 0
    keep = triangle(imp, x.shape[-2], x.shape[-1], bool(upper), diagonal)
    zero = 0.0 if x.dtype in FLOAT_DTYPES else (False if x.dtype == "i1" else 0)
    return select(imp, broadcast_to(imp, keep, x.shape), x, zero, x.dtype)
