"""Lowering table of the TensorFlow frontend: one function per TensorFlow op type.

Each ``fn(imp, node, *operands, **attrs) -> value | list of values`` receives the data operands
as the importer holds them (``Node``, numpy constant, ``ShapeValue`` or ``DimValue``) and the
NodeDef's attributes as Python values (dtypes as disc's names). Integer ops over shape values
and constants compute at compile time, so Keras' shape subgraphs (``Shape -> StridedSlice ->
Pack -> Reshape``, ``Tensordot``'s ``Shape -> GatherV2 -> Prod``) leave only index ops behind.

Layouts: ``Conv2D``/``DepthwiseConv2dNative``/pooling read NHWC (TensorFlow's default) as the
IR's channels-last convolution and windows; filters (HWIO) become OIHW constants at import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from disc.frontends.arrays import DimValue, ShapeValue, arange, dim_arith, known, known_ints, reshape_target, same_padding, shape_dims
from disc.frontends.tf.importer import TfImporter
from disc.ir.builder import (
    LoweringError,
    arithmetic,
    batched_matmul,
    broadcast_to,
    convert,
    cumulative_sum,
    dim_value,
    einsum,
    elementwise,
    log_softmax,
    mean,
    reduce,
    reshape,
    select,
    slice_bound,
    softmax,
    tile,
    top_k,
    triangle,
)
from disc.ir.graph import Node
from disc.ir.registry import normalize_axis
from disc.ir.types import FLOAT_DTYPES, numpy_dtype
from disc.shape.expr import DimLike, as_expr, product

OPS: dict[str, Callable[..., Any]] = {}


def tf_op(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        for n in names:
            OPS[n] = fn
        return fn

    return wrap


def _is_int(v: Any) -> bool:
    return isinstance(v, (ShapeValue, DimValue)) or (isinstance(v, np.ndarray) and v.dtype.kind in "iu")


def _int_dtype(v: Any) -> str:
    return v.dtype if isinstance(v, (ShapeValue, DimValue)) else ("i32" if v.dtype == np.int32 else "i64")


# -- constants and identities ---------------------------------------------------------------------------------
@tf_op("Const")
def _const(imp: TfImporter, node: Any, value: Any = None, dtype: str = "f32") -> np.ndarray:
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf" and value.dtype.name != "bfloat16":
        raise LoweringError(f"a constant of dtype {dtype}, which disc does not run")
    return value


@tf_op("Identity", "StopGradient", "Snapshot", "PreventGradient", "EnsureShape", "CheckNumerics")
def _identity(imp: TfImporter, node: Any, x: Any, *rest: Any, **attrs: Any) -> Any:
    # EnsureShape and CheckNumerics only check at run time; the compiled program checks its own shapes.
    return x


@tf_op("IdentityN")
def _identity_n(imp: TfImporter, node: Any, *xs: Any, **attrs: Any) -> list[Any]:
    return list(xs)


# -- elementwise -------------------------------------------------------------------------------------------------
_BINARY = {
    "AddV2": "add", "Add": "add", "Sub": "sub", "Mul": "mul", "RealDiv": "div", "Div": "div", "DivNoNan": "div",
    "FloorDiv": "floor_div", "FloorMod": "remainder", "Maximum": "maximum", "Minimum": "minimum", "Pow": "pow",
    "Less": "lt", "LessEqual": "le", "Greater": "gt", "GreaterEqual": "ge", "Equal": "eq", "NotEqual": "ne",
    "LogicalAnd": "logical_and", "LogicalOr": "logical_or",
}  # fmt: skip
_NUMPY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum}
_DIM_OPS = {"add": "add", "sub": "sub", "mul": "mul", "floor_div": "div"}


@tf_op(*_BINARY)
def _binary(imp: TfImporter, node: Any, a: Any, b: Any, **attrs: Any) -> Any:
    op = _BINARY[node.op]
    ka, kb = known(a), known(b)
    if ka is not None and kb is not None and op in _NUMPY and ka.dtype.kind in "iu" and kb.dtype.kind in "iu":
        return _NUMPY[op](ka, kb).astype(np.result_type(ka, kb))  # shape arithmetic on constants
    if op in _DIM_OPS and _is_int(a) and _is_int(b):
        folded = _fold_dims(imp, op, a, b, ka, kb)
        if folded is not None:
            return folded
    x, y = imp.tensor(a), imp.tensor(b)
    if x.dtype != y.dtype:
        raise LoweringError(f"{node.op}: operand dtypes differ ({x.dtype}, {y.dtype}); TensorFlow requires one type")
    if op == "div" and x.dtype not in FLOAT_DTYPES:
        raise LoweringError(f"{node.op} of integers (C-style truncating division)")
    if node.op == "DivNoNan":  # 0 where the divisor is 0
        q = elementwise(imp, "div", [x, y], x.dtype)
        return select(imp, elementwise(imp, "eq", [y, 0.0], y.dtype), 0.0, q, x.dtype)
    return elementwise(imp, op, [x, y], x.dtype)


def _fold_dims(imp: TfImporter, op: str, a: Any, b: Any, ka: Any, kb: Any) -> Any:
    """Arithmetic on symbolic dims (a DimValue or ShapeValue with an integer or another such value)."""
    dim_op = _DIM_OPS[op]
    dtype = _int_dtype(a if isinstance(a, (ShapeValue, DimValue)) else b)

    def dims(v: Any, k: Any) -> list[DimLike] | None:
        if isinstance(v, ShapeValue):
            return list(v.dims)
        if isinstance(v, DimValue):
            return [v.dim]
        return [int(x) for x in np.asarray(k).reshape(-1)] if k is not None and np.asarray(k).ndim <= 1 else None

    da, db = dims(a, ka), dims(b, kb)
    if da is None or db is None:
        return None
    if len(da) == 1 and len(db) != 1:
        da = da * len(db)
    if len(db) == 1 and len(da) != 1:
        db = db * len(da)
    if len(da) != len(db):
        return None
    out = [dim_arith(imp, dim_op, x, y) for x, y in zip(da, db)]
    if any(d is None for d in out):
        return None
    scalar = (
        not isinstance(a, ShapeValue) and not isinstance(b, ShapeValue) and all(np.asarray(k).ndim == 0 for k in (ka, kb) if k is not None)
    )
    return DimValue(out[0], dtype) if scalar and len(out) == 1 else ShapeValue(out, dtype)


@tf_op("SquaredDifference")
def _squared_difference(imp: TfImporter, node: Any, a: Any, b: Any, **attrs: Any) -> Node:
    x = imp.tensor(a)
    d = elementwise(imp, "sub", [x, imp.tensor(b)], x.dtype)
    return elementwise(imp, "mul", [d, d], x.dtype)


@tf_op("AddN")
def _add_n(imp: TfImporter, node: Any, *xs: Any, **attrs: Any) -> Node:
    nodes = [imp.tensor(x) for x in xs]
    out = nodes[0]
    for x in nodes[1:]:
        out = elementwise(imp, "add", [out, x], out.dtype)
    return out


@tf_op("BiasAdd", "BiasAddV1")
def _bias_add(imp: TfImporter, node: Any, x: Any, bias: Any, data_format: str = "NHWC", **attrs: Any) -> Node:
    x, b = imp.tensor(x), imp.tensor(bias)
    if data_format == "NCHW" and x.tensor_type.rank > 2:
        return imp.graph.add("add", (x, imp.graph.add("broadcast_in_dim", (b, *imp.sizes(x.shape)), {"dims": (1,)})))
    return elementwise(imp, "add", [x, b], x.dtype)


_UNARY = {
    "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Expm1": "expm1", "Log": "log",
    "Log1p": "log1p", "Sqrt": "sqrt", "Rsqrt": "rsqrt", "Neg": "neg", "Abs": "abs", "Erf": "erf",
    "Reciprocal": "reciprocal", "Inv": "reciprocal", "Floor": "floor", "Ceil": "ceil", "Round": "round",
    "Rint": "round", "Sin": "sin", "Cos": "cos", "Tan": "tan", "Sign": "sign", "LogicalNot": "logical_not",
    "IsNan": "isnan", "Atan": "atan", "Asin": "asin", "Acos": "acos", "Sinh": "sinh", "Cosh": "cosh",
}  # fmt: skip


@tf_op(*_UNARY)
def _unary(imp: TfImporter, node: Any, x: Any, **attrs: Any) -> Node:
    return imp.graph.add(_UNARY[node.op], (imp.tensor(x),))


@tf_op("Relu6", "Square", "Erfc", "Softplus", "Softsign", "Elu", "Selu", "LeakyRelu")
def _activation(imp: TfImporter, node: Any, x: Any, alpha: float = 0.2, **attrs: Any) -> Node:
    x = imp.tensor(x)
    op, dt = node.op, x.dtype
    if op == "Relu6":
        return elementwise(imp, "minimum", [imp.graph.add("relu", (x,)), 6.0], dt)
    if op == "Square":
        return elementwise(imp, "mul", [x, x], dt)
    if op == "Erfc":
        return elementwise(imp, "sub", [1.0, imp.graph.add("erf", (x,))], dt)
    if op == "Softsign":
        return elementwise(imp, "div", [x, elementwise(imp, "add", [imp.graph.add("abs", (x,)), 1.0], dt)], dt)
    if op == "Softplus":  # max(x, 0) + log1p(e^-|x|): no overflow for large x
        tail = imp.graph.add("log1p", (imp.graph.add("exp", (imp.graph.add("neg", (imp.graph.add("abs", (x,)),)),)),))
        return elementwise(imp, "add", [imp.graph.add("relu", (x,)), tail], dt)
    if op == "LeakyRelu":
        return select(imp, elementwise(imp, "lt", [x, 0.0], dt), elementwise(imp, "mul", [x, alpha], dt), x, dt)
    neg = imp.graph.add("expm1", (x,))
    if op == "Selu":
        neg = elementwise(imp, "mul", [neg, 1.6732632423543772], dt)
    out = select(imp, elementwise(imp, "gt", [x, 0.0], dt), x, neg, dt)
    return elementwise(imp, "mul", [out, 1.0507009873554805], dt) if op == "Selu" else out


@tf_op("ClipByValue")
def _clip(imp: TfImporter, node: Any, x: Any, lo: Any, hi: Any, **attrs: Any) -> Node:
    x = imp.tensor(x)
    return elementwise(imp, "minimum", [elementwise(imp, "maximum", [x, imp.tensor(lo)], x.dtype), imp.tensor(hi)], x.dtype)


@tf_op("Select", "SelectV2")
def _select(imp: TfImporter, node: Any, cond: Any, a: Any, b: Any, **attrs: Any) -> Node:
    x, y, c = imp.tensor(a), imp.tensor(b), imp.tensor(cond)
    if node.op == "Select" and c.tensor_type.rank == 1 and x.tensor_type.rank > 1:  # v1: a vector picks rows
        c = imp.graph.add("broadcast_in_dim", (c, *imp.sizes(x.shape)), {"dims": (0,)})
    return select(imp, c, x, y, x.dtype)


@tf_op("Cast")
def _cast(imp: TfImporter, node: Any, x: Any, DstT: str = "f32", **attrs: Any) -> Any:
    if DstT.startswith("tf-dtype"):
        raise LoweringError(f"Cast to {DstT}, which disc does not run")
    if isinstance(x, (ShapeValue, DimValue)) and DstT in ("i32", "i64"):
        return type(x)(x.dims if isinstance(x, ShapeValue) else x.dim, DstT)  # type: ignore[call-arg]
    if isinstance(x, np.ndarray) and DstT != "bf16" and x.dtype.kind in "iub":
        return x.astype(numpy_dtype(DstT))
    return convert(imp, imp.tensor(x), DstT)


# -- shapes -------------------------------------------------------------------------------------------------------
@tf_op("Shape")
def _shape(imp: TfImporter, node: Any, x: Any, out_type: str = "i32", **attrs: Any) -> ShapeValue:
    dims = [len(x.dims)] if isinstance(x, ShapeValue) else list(np.shape(x)) if isinstance(x, np.ndarray) else list(imp.tensor(x).shape)
    return ShapeValue(dims, out_type)


@tf_op("Size")
def _size(imp: TfImporter, node: Any, x: Any, out_type: str = "i32", **attrs: Any) -> DimValue:
    return DimValue(product(imp.tensor(x).shape), out_type)


@tf_op("Rank")
def _rank(imp: TfImporter, node: Any, x: Any, **attrs: Any) -> np.ndarray:
    return np.array(imp.tensor(x).tensor_type.rank, np.int32)


@tf_op("Reshape")
def _reshape(imp: TfImporter, node: Any, x: Any, shape: Any, **attrs: Any) -> Any:
    if isinstance(x, np.ndarray) and known(shape) is not None:
        return x.reshape(known_ints(shape, "Reshape's shape"))
    x = imp.tensor(x)
    return reshape(imp, x, reshape_target(imp, x, shape_dims(shape, "Reshape's shape"), allowzero=True))


@tf_op("ExpandDims")
def _expand_dims(imp: TfImporter, node: Any, x: Any, axis: Any, **attrs: Any) -> Any:
    a = known_ints(axis, "ExpandDims' axis")[0]
    if isinstance(x, DimValue) and a in (0, -1):
        return ShapeValue([x.dim], x.dtype)
    if isinstance(x, np.ndarray):
        return np.expand_dims(x, a)
    x = imp.tensor(x)
    rank = x.tensor_type.rank + 1
    shape = list(x.shape)
    shape.insert(normalize_axis(a, rank, "ExpandDims"), 1)
    return reshape(imp, x, shape)


@tf_op("Squeeze")
def _squeeze(imp: TfImporter, node: Any, x: Any, squeeze_dims: Sequence[int] = (), **attrs: Any) -> Any:
    if isinstance(x, ShapeValue) and len(x.dims) == 1 and list(squeeze_dims) in ([], [0], [-1]):
        return DimValue(x.dims[0], x.dtype)
    if isinstance(x, np.ndarray):
        return np.squeeze(x, tuple(squeeze_dims) or None)
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    c = imp.graph.constraints
    drop = (
        {normalize_axis(a, rank, "Squeeze") for a in squeeze_dims}
        if squeeze_dims
        else {i for i, d in enumerate(x.shape) if c.prove_is_one(d)}
    )
    for a in drop:
        if not c.prove_is_one(x.shape[a]):
            raise LoweringError(f"Squeeze: dim {a} ({x.shape[a]}) is not provably 1")
    return reshape(imp, x, [d for i, d in enumerate(x.shape) if i not in drop])


def _bits(mask: int, n: int) -> list[bool]:
    return [bool(mask >> i & 1) for i in range(n)]


@tf_op("StridedSlice")
def _strided_slice(
    imp: TfImporter, node: Any, x: Any, begin: Any, end: Any, strides: Any,
    begin_mask: int = 0, end_mask: int = 0, ellipsis_mask: int = 0, new_axis_mask: int = 0, shrink_axis_mask: int = 0, **attrs: Any,
) -> Any:  # fmt: skip
    steps = known_ints(strides, "StridedSlice's strides")
    n_spec = len(steps)
    b_dims, e_dims = shape_dims(begin, "StridedSlice's begin"), shape_dims(end, "StridedSlice's end")
    bm, em, elm, nm, sm = (_bits(m, n_spec) for m in (begin_mask, end_mask, ellipsis_mask, new_axis_mask, shrink_axis_mask))
    if isinstance(x, ShapeValue) or (isinstance(x, np.ndarray) and x.ndim == 1 and known(begin) is not None and known(end) is not None):
        return _slice_known_vector(x, b_dims, e_dims, steps, bm, em, elm, nm, sm)
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    # The sparse spec as one entry per input dim (or new axis): (kind, begin, end, step).
    real = sum(1 for i in range(n_spec) if not nm[i] and not elm[i])
    dense: list[tuple[str, Any, Any, int]] = []
    for i in range(n_spec):
        if elm[i]:
            dense += [("all", None, None, 1)] * (rank - real)
        elif nm[i]:
            dense.append(("new", None, None, 1))
        elif sm[i]:
            dense.append(("one", b_dims[i], None, 1))
        else:
            dense.append(("range", None if bm[i] else b_dims[i], None if em[i] else e_dims[i], steps[i]))
    if not any(elm):
        dense += [("all", None, None, 1)] * (rank - real)
    out, axis, shape = x, 0, []
    for kind, lo, hi, step in dense:
        if kind == "new":
            shape.append(1)
            continue
        n = x.shape[axis]
        if kind == "one":
            start = as_expr(n) + lo if isinstance(lo, int) and lo < 0 else as_expr(lo)
            if not imp.graph.constraints.prove_ge(as_expr(n) - start, 1):
                imp.graph.constraints.assume(as_expr(n) - start, ">=", 1, f"StridedSlice: index {lo} must be inside dim {axis} (size {n})")
            out = imp.graph.add("slice", (out, imp.index(start), imp.index(start + 1)), {"axis": axis, "step": 1})
        elif kind == "range":
            if step <= 0:
                raise LoweringError("StridedSlice with a negative stride")
            start = imp.index(0) if lo is None else slice_bound(imp, n, lo, 2**31 - 1)
            stop = imp.index(n) if hi is None else slice_bound(imp, n, hi, 2**31 - 1)
            out = imp.graph.add("slice", (out, start, stop), {"axis": axis, "step": step})
            shape.append(out.shape[axis])
        else:
            shape.append(out.shape[axis])
        axis += 1
    return reshape(imp, out, shape)


def _slice_known_vector(x: Any, b: list, e: list, steps: list[int], bm, em, elm, nm, sm) -> Any:
    """StridedSlice of a 1-d value known at compile time (a shape value or a constant vector)."""
    if len(steps) != 1 or elm[0] or nm[0]:
        raise LoweringError("StridedSlice of a shape with more than one slice spec")
    items = list(x.dims) if isinstance(x, ShapeValue) else list(x)
    if not all(isinstance(v, int) for v in (*b, *e)):
        raise LoweringError("StridedSlice of a shape with bounds computed at run time")
    if sm[0]:
        item = items[b[0]]
        return DimValue(item, x.dtype) if isinstance(x, ShapeValue) else np.asarray(item, x.dtype)
    picked = items[slice(None if bm[0] else b[0], None if em[0] else e[0], steps[0])]
    return ShapeValue(picked, x.dtype) if isinstance(x, ShapeValue) else np.asarray(picked, x.dtype)


@tf_op("Slice")
def _slice(imp: TfImporter, node: Any, x: Any, begin: Any, size: Any, **attrs: Any) -> Any:
    b, s = shape_dims(begin, "Slice's begin"), shape_dims(size, "Slice's size")
    if isinstance(x, ShapeValue):
        lo, n = known_ints(begin, "Slice's begin")[0], known_ints(size, "Slice's size")[0]
        return ShapeValue(x.dims[lo:] if n == -1 else x.dims[lo : lo + n], x.dtype)
    out = imp.tensor(x)
    for axis, (lo, n) in enumerate(zip(b, s)):
        stop = out.shape[axis] if isinstance(n, int) and n == -1 else as_expr(lo) + n
        if isinstance(lo, int) and lo == 0 and stop is out.shape[axis]:
            continue
        out = imp.graph.add("slice", (out, imp.index(lo), imp.index(stop)), {"axis": axis, "step": 1})
    return out


@tf_op("Pack")
def _pack(imp: TfImporter, node: Any, *xs: Any, axis: int = 0, **attrs: Any) -> Any:
    scalars = [
        x.dim if isinstance(x, DimValue) else int(known(x)) if known(x) is not None and np.ndim(known(x)) == 0 and _is_int(x) else None
        for x in xs
    ]
    if axis == 0 and all(s is not None for s in scalars) and any(isinstance(x, DimValue) for x in xs):
        return ShapeValue(scalars, next(x.dtype for x in xs if isinstance(x, DimValue)))
    if all(isinstance(x, np.ndarray) for x in xs):
        return np.stack(xs, axis=axis)
    nodes = [imp.tensor(x) for x in xs]
    rank = nodes[0].tensor_type.rank + 1
    axis = normalize_axis(axis, rank, "Pack")
    parts = []
    for n in nodes:
        shape = list(n.shape)
        shape.insert(axis, 1)
        parts.append(reshape(imp, n, shape))
    return parts[0] if len(parts) == 1 else imp.graph.add("concat", tuple(parts), {"axis": axis})


@tf_op("Unpack")
def _unpack(imp: TfImporter, node: Any, x: Any, num: int = 0, axis: int = 0, **attrs: Any) -> list[Any]:
    if isinstance(x, ShapeValue):
        return [DimValue(d, x.dtype) for d in x.dims]
    x = imp.tensor(x)
    axis = normalize_axis(axis, x.tensor_type.rank, "Unpack")
    outs = []
    for i in range(num):
        one = imp.graph.add("slice", (x, imp.index(i), imp.index(i + 1)), {"axis": axis, "step": 1})
        outs.append(reshape(imp, one, [d for j, d in enumerate(x.shape) if j != axis]))
    return outs


@tf_op("ConcatV2")
def _concat(imp: TfImporter, node: Any, *operands: Any, **attrs: Any) -> Any:
    *parts, axis_in = operands
    axis = known_ints(axis_in, "ConcatV2's axis")[0]
    if any(isinstance(p, (ShapeValue, DimValue)) for p in parts) and all(isinstance(p, (ShapeValue, DimValue, np.ndarray)) for p in parts):
        dims: list[DimLike] = []
        for p in parts:
            dims += [p.dim] if isinstance(p, DimValue) else shape_dims(p, "ConcatV2 of shape values")
        return ShapeValue(dims, next(p.dtype for p in parts if isinstance(p, (ShapeValue, DimValue))))
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts, axis=axis)
    nodes = [imp.tensor(p) for p in parts]
    if len(nodes) == 1:
        return nodes[0]
    return imp.graph.add("concat", tuple(nodes), {"axis": normalize_axis(axis, nodes[0].tensor_type.rank, "ConcatV2")})


@tf_op("Fill")
def _fill(imp: TfImporter, node: Any, dims: Any, value: Any, **attrs: Any) -> Node:
    shape = shape_dims(dims, "Fill's dims")
    scalar = imp.tensor(np.asarray(value).reshape(()) if isinstance(value, np.ndarray) else value)
    if scalar.tensor_type.rank:
        raise LoweringError(f"Fill's value must be a scalar (got rank {scalar.tensor_type.rank})")
    return imp.graph.add("broadcast_in_dim", (scalar, *imp.sizes(shape)), {"dims": ()})


@tf_op("ZerosLike", "OnesLike")
def _zeros_like(imp: TfImporter, node: Any, x: Any, **attrs: Any) -> Node:
    x = imp.tensor(x)
    value = np.array(0 if node.op == "ZerosLike" else 1).astype(numpy_dtype(x.dtype))
    return imp.graph.add("broadcast_in_dim", (imp.graph.add_constant(value), *imp.sizes(x.shape)), {"dims": ()})


@tf_op("Range")
def _range(imp: TfImporter, node: Any, start: Any, limit: Any, delta: Any, Tidx: str = "i32", **attrs: Any) -> Any:
    return arange(imp, start, limit, delta, Tidx)


@tf_op("Transpose")
def _transpose(imp: TfImporter, node: Any, x: Any, perm: Any, **attrs: Any) -> Any:
    p = tuple(known_ints(perm, "Transpose's perm"))
    if isinstance(x, np.ndarray):
        return np.transpose(x, p)
    x = imp.tensor(x)
    return x if p == tuple(range(len(p))) else imp.graph.add("transpose", (x,), {"perm": p})


@tf_op("GatherV2")
def _gather(imp: TfImporter, node: Any, params: Any, indices: Any, axis: Any, batch_dims: int = 0, **attrs: Any) -> Any:
    if batch_dims:
        raise LoweringError(f"GatherV2 with batch_dims={batch_dims}")
    a = known_ints(axis, "GatherV2's axis")[0]
    k = known(indices)
    if isinstance(params, ShapeValue) and k is not None:
        picked = [params.dims[int(i)] for i in np.asarray(k).reshape(-1)]
        return DimValue(picked[0], params.dtype) if np.ndim(k) == 0 else ShapeValue(picked, params.dtype)
    if isinstance(params, np.ndarray) and k is not None:
        return np.take(params, k, axis=a)
    data = imp.tensor(params)
    a = normalize_axis(a, data.tensor_type.rank, "GatherV2")
    index = imp.tensor(indices)
    flat = reshape(imp, index, [product(index.shape)])
    # TensorFlow refuses an index outside [0, size) (a negative one included): so does index_select.
    rows = imp.graph.add("index_select", (data, flat), {"axis": a, "wrap_negative": False})
    return reshape(imp, rows, [*data.shape[:a], *index.shape, *data.shape[a + 1 :]])


@tf_op("Tile")
def _tile(imp: TfImporter, node: Any, x: Any, multiples: Any, **attrs: Any) -> Node:
    return tile(imp, imp.tensor(x), known_ints(multiples, "Tile's multiples"))


@tf_op("Pad", "PadV2")
def _pad(imp: TfImporter, node: Any, x: Any, paddings: Any, value: Any = None, **attrs: Any) -> Node:
    x = imp.tensor(x)
    amounts = np.asarray(known_ints(paddings, f"{node.op}'s paddings")).reshape(-1, 2)
    fill = 0.0 if value is None else known(value)
    if fill is None:
        raise LoweringError(f"{node.op}'s constant value must be known when the model is compiled")
    fill = float(np.asarray(fill).reshape(-1)[0])
    attrs_ = {
        "low": tuple(int(v) for v in amounts[:, 0]),
        "high": tuple(int(v) for v in amounts[:, 1]),
        "value": fill if x.dtype in FLOAT_DTYPES else int(fill),
    }
    return imp.graph.add("pad", (x,), attrs_)


@tf_op("Split")
def _split(imp: TfImporter, node: Any, axis: Any, x: Any, num_split: int = 1, **attrs: Any) -> list[Node]:
    x = imp.tensor(x)
    a = normalize_axis(known_ints(axis, "Split's axis")[0], x.tensor_type.rank, "Split")
    n = x.shape[a]
    if not imp.graph.constraints.prove_divisible(n, num_split):
        imp.graph.constraints.assume(n, "%", num_split, f"Split: dim {a} must be divisible by {num_split}")
    size = as_expr(n) // num_split
    return [imp.graph.add("slice", (x, imp.index(size * i), imp.index(size * (i + 1))), {"axis": a, "step": 1}) for i in range(num_split)]


@tf_op("SplitV")
def _split_v(imp: TfImporter, node: Any, x: Any, sizes: Any, axis: Any, **attrs: Any) -> list[Node]:
    x = imp.tensor(x)
    a = normalize_axis(known_ints(axis, "SplitV's axis")[0], x.tensor_type.rank, "SplitV")
    parts: list[DimLike] = list(known_ints(sizes, "SplitV's sizes"))
    if -1 in parts:
        i = parts.index(-1)
        parts[i] = as_expr(x.shape[a]) - sum(int(p) for j, p in enumerate(parts) if j != i)
    outs, start = [], as_expr(0)
    for size in parts:
        outs.append(imp.graph.add("slice", (x, imp.index(start), imp.index(start + size)), {"axis": a, "step": 1}))
        start = start + size
    return outs


# -- reductions -----------------------------------------------------------------------------------------------
_REDUCE = {"Sum": "sum", "Mean": "mean", "Max": "max", "Min": "min", "Prod": "prod", "All": "min", "Any": "max"}


@tf_op(*_REDUCE)
def _reduce(imp: TfImporter, node: Any, x: Any, axes: Any, keep_dims: bool = False, **attrs: Any) -> Any:
    kind = _REDUCE[node.op]
    if isinstance(x, ShapeValue) and kind in ("prod", "sum") and not keep_dims:
        total = product(x.dims) if kind == "prod" else sum((as_expr(d) for d in x.dims), as_expr(0))
        return DimValue(total, x.dtype)
    if isinstance(x, np.ndarray) and x.dtype.kind in "iu" and kind in ("prod", "sum"):
        fn = np.prod if kind == "prod" else np.sum
        return np.asarray(fn(x, axis=tuple(known_ints(axes, "reduction axes")), keepdims=keep_dims), x.dtype)
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    dims = sorted({normalize_axis(a, rank, node.op) for a in known_ints(axes, f"{node.op}'s axes")})
    if node.op in ("All", "Any"):
        out = reduce(imp, convert(imp, x, "i32"), dims, kind, bool(keep_dims))
        return convert(imp, out, "i1")
    return mean(imp, x, dims, bool(keep_dims)) if kind == "mean" else reduce(imp, x, dims, kind, bool(keep_dims))


@tf_op("ArgMax", "ArgMin")
def _argreduce(imp: TfImporter, node: Any, x: Any, dimension: Any, output_type: str = "i64", **attrs: Any) -> Node:
    x = imp.tensor(x)
    axis = normalize_axis(known_ints(dimension, f"{node.op}'s dimension")[0], x.tensor_type.rank, node.op)
    out = imp.graph.add("argreduce", (x,), {"axis": axis, "kind": node.op.lower(), "keepdim": False, "last": False})
    return out if output_type == "i64" else convert(imp, out, output_type)


@tf_op("Cumsum")
def _cumsum(imp: TfImporter, node: Any, x: Any, axis: Any, exclusive: bool = False, reverse: bool = False, **attrs: Any) -> Node:
    x = imp.tensor(x)
    a = normalize_axis(known_ints(axis, "Cumsum's axis")[0], x.tensor_type.rank, "Cumsum")
    return cumulative_sum(imp, x, a, exclusive, reverse)


# -- linear algebra and normalisation ----------------------------------------------------------------------
@tf_op("TopKV2", "TopK")
def _top_k(imp: TfImporter, node: Any, x: Any, k: Any = None, sorted: bool = True, index_type: str = "i32", **attrs: Any) -> list[Node]:
    # (TopK, the first version, holds k as an attribute.) Unsorted results come sorted, which TensorFlow allows.
    x = imp.tensor(x)
    count = attrs["k"] if k is None else known_ints(k, "TopKV2's k")[0]
    values, indices = top_k(imp, x, x.tensor_type.rank - 1, int(count), True, node.op)
    return [values, convert(imp, indices, index_type)]


def _swap_last(imp: TfImporter, x: Node) -> Node:
    r = x.tensor_type.rank
    return imp.graph.add("transpose", (x,), {"perm": (*range(r - 2), r - 1, r - 2)})


@tf_op("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
def _matmul(
    imp: TfImporter,
    node: Any,
    a: Any,
    b: Any,
    transpose_a: bool = False,
    transpose_b: bool = False,
    adj_x: bool = False,
    adj_y: bool = False,
    **attrs: Any,
) -> Node:
    x, y = imp.tensor(a), imp.tensor(b)
    if transpose_a or adj_x:
        x = _swap_last(imp, x)
    if transpose_b or adj_y:
        y = _swap_last(imp, y)
    ra, rb = x.tensor_type.rank, y.tensor_type.rank
    if ra < 2 or rb < 2:
        raise LoweringError(f"{node.op} of operands of rank {ra} and {rb} (both need rank >= 2)")
    return batched_matmul(imp, x, y)


@tf_op("MatrixBandPart")
def _band_part(imp: TfImporter, node: Any, x: Any, num_lower: Any, num_upper: Any, **attrs: Any) -> Node:
    x = imp.tensor(x)
    lower, upper = known_ints(num_lower, "MatrixBandPart's num_lower")[0], known_ints(num_upper, "MatrixBandPart's num_upper")[0]
    rows, cols = x.shape[-2], x.shape[-1]
    keep = None  # col - row >= -lower and col - row <= upper; a negative bound keeps that whole side
    if lower >= 0:
        keep = triangle(imp, rows, cols, True, -lower)
    if upper >= 0:
        below = triangle(imp, rows, cols, False, upper)
        keep = below if keep is None else imp.graph.add("logical_and", (keep, below))
    if keep is None:
        return x
    zero = 0.0 if x.dtype in FLOAT_DTYPES else (False if x.dtype == "i1" else 0)
    return select(imp, broadcast_to(imp, keep, x.shape), x, zero, x.dtype)


@tf_op("Einsum")
def _einsum(imp: TfImporter, node: Any, *xs: Any, equation: str = "", **attrs: Any) -> Node:
    return einsum(imp, equation, [imp.tensor(x) for x in xs])


@tf_op("Softmax", "LogSoftmax")
def _softmax(imp: TfImporter, node: Any, x: Any, **attrs: Any) -> Node:
    x = imp.tensor(x)
    axis = x.tensor_type.rank - 1
    return log_softmax(imp, x, axis) if node.op == "LogSoftmax" else softmax(imp, x, axis)


@tf_op("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
def _batch_norm(
    imp: TfImporter,
    node: Any,
    x: Any,
    scale: Any,
    offset: Any,
    mu: Any,
    var: Any,
    epsilon: float = 1e-4,
    data_format: str = "NHWC",
    is_training: bool = False,
    **attrs: Any,
) -> list[Any]:
    if is_training:
        raise LoweringError(f"{node.op} in training mode (batch statistics)")
    x = imp.tensor(x)
    axis = 1 if data_format.startswith("NC") else x.tensor_type.rank - 1
    cast = x.dtype != "f32"  # 16-bit inputs normalise with f32 statistics, as TensorFlow does

    def channel(v: Any) -> Node:
        return imp.graph.add("broadcast_in_dim", (imp.tensor(v), *imp.sizes(x.shape)), {"dims": (axis,)})

    xf = convert(imp, x, "f32") if cast else x
    inv = imp.graph.add("rsqrt", (elementwise(imp, "add", [imp.tensor(var), epsilon], "f32"),))
    gain = elementwise(imp, "mul", [inv, imp.tensor(scale)], "f32")
    out = elementwise(imp, "mul", [elementwise(imp, "sub", [xf, channel(mu)], "f32"), channel(gain)], "f32")
    out = elementwise(imp, "add", [out, channel(offset)], "f32")
    y = convert(imp, out, x.dtype) if cast else out
    return [y, mu, var, mu, var, mu]  # the statistics outputs: only read in training


# -- convolution and pooling --------------------------------------------------------------------------------
def _spatial_axes(data_format: str, rank: int) -> list[int]:
    return list(range(1, rank - 1)) if data_format.startswith("NH") or data_format == "NDHWC" else list(range(2, rank))


def _pad_same(imp: TfImporter, x: Node, axis: int, k: int, s: int, d: int, fill: float) -> Node:
    """Pad ``x`` along ``axis`` for SAME windows whose padding depends on the size at run time
    (stride > 1): pad by the most any size needs, then keep the window of what this size needs."""
    eff = (k - 1) * d + 1
    if eff < s:
        raise LoweringError(f"SAME padding with a window ({eff}) smaller than its stride ({s}) over a dim unknown at compile time")
    lows, highs = [], []
    for r in range(s):
        size = 1000 * s + r  # the padding depends only on size mod s (eff >= s: never clipped at 0)
        total = (-(-size // s) - 1) * s + eff - size
        lows.append(total // 2)
        highs.append(total - total // 2)
    lo_max, hi_max = max(lows), max(highs)
    rank = x.tensor_type.rank
    low, high = [0] * rank, [0] * rank
    low[axis], high[axis] = lo_max, hi_max
    padded = imp.graph.add("pad", (x,), {"low": tuple(low), "high": tuple(high), "value": fill})
    n = as_expr(x.shape[axis])
    total = n.ceildiv(s) * s - s + eff - n
    start = as_expr(lo_max) - total // 2
    return imp.graph.add("slice", (padded, imp.index(start), imp.index(start + n + total)), {"axis": axis, "step": 1})


def _window_padding(
    imp: TfImporter,
    x: Node,
    padding: str,
    axes: list[int],
    kernel: list[int],
    strides: list[int],
    dilations: list[int],
    explicit: Sequence[int],
    fill: float,
) -> tuple[Node, list[tuple[int, int]]]:
    """The input (padded where SAME needs a run-time amount) and each spatial axis' (low, high) padding."""
    pads: list[tuple[int, int]] = []
    for i, axis in enumerate(axes):
        if padding == "VALID":
            pads.append((0, 0))
        elif padding == "EXPLICIT":
            pads.append((int(explicit[2 * axis]), int(explicit[2 * axis + 1])))
        elif padding == "SAME":
            fixed = same_padding(x.shape[axis], kernel[i], strides[i], dilations[i])
            if fixed is None:
                x = _pad_same(imp, x, axis, kernel[i], strides[i], dilations[i], fill)
                fixed = (0, 0)
            pads.append(fixed)
        else:
            raise LoweringError(f"padding {padding!r}")
    return x, pads


@tf_op("Conv2D", "DepthwiseConv2dNative", "Conv3D")
def _conv(
    imp: TfImporter,
    node: Any,
    x: Any,
    w: Any,
    strides: Sequence[int] = (),
    padding: str = "VALID",
    dilations: Sequence[int] = (),
    data_format: str = "NHWC",
    explicit_paddings: Sequence[int] = (),
    **attrs: Any,
) -> Node:
    filt = known(w)
    if filt is None:
        raise LoweringError(f"{node.op} with a filter computed at run time (disc reads filters as constants)")
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    axes = _spatial_axes(data_format, rank)
    channel = rank - 1 if axes[0] == 1 else 1
    k = filt.ndim - 2
    spatial_kernel = list(filt.shape[:k])
    if node.op == "DepthwiseConv2dNative":  # [kh, kw, in, multiplier] -> [in * multiplier, 1, kh, kw], one group per input channel
        cin, mult = filt.shape[k], filt.shape[k + 1]
        oihw = np.ascontiguousarray(np.moveaxis(filt, (k, k + 1), (0, 1)).reshape(cin * mult, 1, *spatial_kernel))
        groups = int(cin)
    else:  # HWIO -> OIHW; a channel count a multiple of the filter's input channels is a grouped convolution
        oihw = np.ascontiguousarray(np.moveaxis(filt, (k + 1, k), (0, 1)))
        cin_x = x.shape[channel]
        if not (isinstance(cin_x, int) or as_expr(cin_x).is_const):
            raise LoweringError(f"{node.op}: the input's channel dim ({cin_x}) must be known when the model is compiled")
        groups = int(cin_x) // int(filt.shape[k])
    step = [int(strides[a]) for a in axes] if strides else [1] * k
    dil = [int(dilations[a]) for a in axes] if dilations else [1] * k
    x, pads = _window_padding(imp, x, padding, axes, spatial_kernel, step, dil, explicit_paddings, 0.0)
    if any(lo != hi for lo, hi in pads):  # asymmetric: padded first, the convolution unpadded
        low, high = [0] * rank, [0] * rank
        for axis, (lo, hi) in zip(axes, pads):
            low[axis], high[axis] = lo, hi
        x = imp.graph.add("pad", (x,), {"low": tuple(low), "high": tuple(high), "value": 0.0})
        pads = [(0, 0)] * k
    weight = imp.graph.add_constant(oihw.astype(numpy_dtype(x.dtype)))
    attrs_ = {
        "stride": tuple(step),
        "padding": tuple(lo for lo, _ in pads),
        "dilation": tuple(dil),
        "groups": groups,
        "transposed": False,
        "output_padding": (0,) * k,
        "channels_last": channel != 1,
    }
    return imp.graph.add("convolution", (x, weight), attrs_)


@tf_op("MaxPool", "AvgPool", "MaxPool3D", "AvgPool3D")
def _pool(
    imp: TfImporter,
    node: Any,
    x: Any,
    ksize: Sequence[int] = (),
    strides: Sequence[int] = (),
    padding: str = "VALID",
    data_format: str = "NHWC",
    explicit_paddings: Sequence[int] = (),
    **attrs: Any,
) -> Node:
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    axes = _spatial_axes(data_format, rank)
    kernel, step = [int(ksize[a]) for a in axes], [int(strides[a]) for a in axes]
    is_max = node.op.startswith("Max")
    lowest = float("-inf") if x.dtype in FLOAT_DTYPES else 0.0
    fill = lowest if is_max else 0.0
    if not is_max:  # the average counts real elements only: the same windows over ones
        ones = imp.graph.add(
            "broadcast_in_dim", (imp.graph.add_constant(np.array(1.0, numpy_dtype(x.dtype))), *imp.sizes(x.shape)), {"dims": ()}
        )
    x2, pads = _window_padding(imp, x, padding, axes, kernel, step, [1] * len(axes), explicit_paddings, fill)
    window, strides_, padding_ = [1] * rank, [1] * rank, [(0, 0)] * rank
    for axis, kk, ss, p in zip(axes, kernel, step, pads):
        window[axis], strides_[axis], padding_[axis] = kk, ss, p
    attrs_ = {"window": tuple(window), "strides": tuple(strides_), "padding": tuple(padding_), "dilation": (1,) * rank, "ceil_mode": False}
    if is_max:
        return imp.graph.add("reduce_window", (x2,), {"kind": "max", **attrs_})
    total = imp.graph.add("reduce_window", (x2,), {"kind": "sum", **attrs_})
    ones2, _ = _window_padding(imp, ones, padding, axes, kernel, step, [1] * len(axes), explicit_paddings, 0.0)
    count = imp.graph.add("reduce_window", (ones2,), {"kind": "sum", **attrs_})
    return elementwise(imp, "div", [total, count], x.dtype)


# -- resizing -------------------------------------------------------------------------------------------------
@tf_op("ResizeBilinear", "ResizeNearestNeighbor")
def _resize(imp: TfImporter, node: Any, images: Any, size: Any, align_corners: bool = False, half_pixel_centers: bool = False, **attrs: Any) -> Node:
    """NHWC images resized to ``size`` (known, or dims of the graph's shapes), one pass per axis
    (width, then height: TensorFlow's top/bottom lerps in the same order). Source coordinates in
    float32 as TensorFlow computes them, so each output reads the pixels TensorFlow's does."""
    x = imp.tensor(images)
    if x.tensor_type.rank != 4:
        raise LoweringError(f"{node.op} of a rank-{x.tensor_type.rank} tensor (TensorFlow takes NHWC images)")
    if align_corners and half_pixel_centers:
        raise LoweringError(f"{node.op}: align_corners and half_pixel_centers are exclusive (TensorFlow refuses both)")
    out_h, out_w = shape_dims(size, f"{node.op}'s size")
    bilinear = node.op == "ResizeBilinear"
    out = convert(imp, x, "f32") if bilinear and x.dtype != "f32" else x
    for axis, n_out in ((2, out_w), (1, out_h)):
        if not imp.graph.constraints.prove_equal(x.shape[axis], n_out):
            out = _resize_axis(imp, out, axis, x.shape[axis], n_out, bilinear, align_corners, half_pixel_centers)
    return out


def _resize_axis(imp: TfImporter, x: Node, axis: int, n_in: DimLike, n_out: DimLike, bilinear: bool, align_corners: bool, half_pixel: bool) -> Node:
    op = arithmetic(imp, "f32")

    def f32(d: DimLike) -> Node:
        return dim_value(imp, d, "f32")

    size_in, size_out = f32(n_in), f32(n_out)
    scale = op("div", size_in, size_out)
    if align_corners:  # (in - 1) / (out - 1), for more than one output
        scale = select(imp, op("gt", size_out, 1.0), op("div", op("sub", size_in, 1.0), op("sub", size_out, 1.0)), scale, "f32")
    o = convert(imp, imp.graph.add("iota", (imp.index(n_out),), {"dtype": "i64"}), "f32")
    pos = op("mul", op("add", o, 0.5) if half_pixel else o, scale)
    last = dim_value(imp, as_expr(n_in) - 1)

    def pick(index: Node) -> Node:
        clamped = elementwise(imp, "minimum", [elementwise(imp, "maximum", [index, 0], "i64"), last], "i64")
        return imp.graph.add("index_select", (x, clamped), {"axis": axis})

    if not bilinear:  # the nearest pixel: rounded half away from zero with aligned corners, else floored
        nearest = imp.graph.add("floor", (pos,))
        if align_corners:
            nearest = select(imp, op("ge", op("sub", pos, nearest), 0.5), op("add", nearest, 1.0), nearest, "f32")
        return pick(convert(imp, nearest, "i64"))
    if half_pixel:
        pos = op("sub", pos, 0.5)
    low = imp.graph.add("floor", (pos,))
    lerp = op("sub", pos, low)
    below = pick(convert(imp, low, "i64"))
    above = pick(convert(imp, imp.graph.add("ceil", (pos,)), "i64"))
    weight = imp.graph.add("broadcast_in_dim", (lerp, *imp.sizes(below.shape)), {"dims": (axis,)})
    return elementwise(imp, "add", [below, elementwise(imp, "mul", [elementwise(imp, "sub", [above, below], "f32"), weight], "f32")], "f32")
