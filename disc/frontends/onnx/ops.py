"""Lowering table of the ONNX frontend: one function per ONNX op type.

Each ``fn(imp, node, *operands, **attrs) -> value | list of values`` receives the operands as
the importer holds them (``Node``, numpy constant, ``ShapeValue`` or None for an omitted
optional input) and the node's attributes as Python values. Integer ops over shape values and
constants compute at compile time (numpy or symbolic dims), so a model's shape subgraph
(``Shape -> Gather -> Concat -> Reshape``) leaves no run-time work but the index ops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from disc.frontends.arrays import NeedsValue, arange, reshape_target
from disc.frontends.arrays import dim_arith as _dim_arith
from disc.frontends.arrays import known as _known
from disc.frontends.arrays import known_ints as _ints
from disc.frontends.arrays import shape_dims as _dims_of
from disc.frontends.onnx.importer import ELEM_TYPES, DimValue, OnnxImporter, ShapeValue
from disc.ir.builder import (
    LoweringError,
    batched_matmul,
    broadcast_shapes,
    broadcast_to,
    convert,
    cumulative_sum,
    einsum,
    elementwise,
    log_softmax,
    mean,
    normalize,
    reduce,
    reshape,
    select,
    slice_bound,
    softmax,
    tile,
    triangle,
)
from disc.ir.graph import Node
from disc.ir.registry import normalize_axis
from disc.ir.types import FLOAT_DTYPES, dtype_of_numpy, numpy_dtype
from disc.shape.expr import DimLike, SymExpr, as_expr, product

OPS: dict[str, Callable[..., Any]] = {}


def onnx_op(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        for n in names:
            OPS[n] = fn
        return fn

    return wrap


# -- elementwise -------------------------------------------------------------------------------------
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Mod": "remainder"}
_COMPARE = {"Equal": "eq", "Less": "lt", "LessOrEqual": "le", "Greater": "gt", "GreaterOrEqual": "ge"}
_LOGICAL = {"And": "logical_and", "Or": "logical_or", "Xor": "logical_xor"}
_NUMPY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum}


@onnx_op(*_BINARY, *_COMPARE, *_LOGICAL)
def _binary(imp: OnnxImporter, node: Any, a: Any, b: Any, fmod: int = 0) -> Any:
    op = _BINARY.get(node.op_type) or _COMPARE.get(node.op_type) or _LOGICAL[node.op_type]
    if op == "remainder" and fmod:
        op = "fmod"  # the dividend's sign, as C's fmod (the default, 0, takes the divisor's)
    ka, kb = _known(a), _known(b)
    if ka is not None and kb is not None and op in _NUMPY and ka.dtype.kind in "iu" and kb.dtype.kind in "iu":
        return np.asarray(_NUMPY[op](ka, kb), np.result_type(ka, kb))  # shape arithmetic on constants (0-d stays an array)
    if isinstance(a, DimValue) or isinstance(b, DimValue):  # arithmetic on one symbolic dim
        da = a.dim if isinstance(a, DimValue) else (int(ka) if ka is not None and ka.size == 1 else None)
        db = b.dim if isinstance(b, DimValue) else (int(kb) if kb is not None and kb.size == 1 else None)
        out = _dim_arith(op, da, db) if da is not None and db is not None else None
        if out is not None:
            return DimValue(out)
    if isinstance(a, ShapeValue) or isinstance(b, ShapeValue):  # shape arithmetic on symbolic dims
        da = a.dims if isinstance(a, ShapeValue) else list(_ints(a, "shape arithmetic"))
        db = b.dims if isinstance(b, ShapeValue) else list(_ints(b, "shape arithmetic"))
        if len(da) == 1:
            da = da * len(db)
        if len(db) == 1:
            db = db * len(da)
        out = [_dim_arith(op, x, y) for x, y in zip(da, db)] if len(da) == len(db) else [None]
        if all(d is not None for d in out):
            return ShapeValue(out)
    x, y = imp.tensor(a), imp.tensor(b)
    if op in _LOGICAL.values():
        dtype = "i1"
    else:
        dtype = x.dtype
        if x.dtype != y.dtype:
            raise LoweringError(f"{node.op_type}: operand dtypes differ ({x.dtype}, {y.dtype}); ONNX requires one type")
    return elementwise(imp, op, [x, y], dtype)


_UNARY = {
    "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
    "Neg": "neg", "Abs": "abs", "Erf": "erf", "Reciprocal": "reciprocal", "Floor": "floor", "Ceil": "ceil",
    "Sin": "sin", "Cos": "cos", "Not": "logical_not", "Sign": "sign", "Round": "round",
}  # fmt: skip


@onnx_op(*_UNARY)
def _unary(imp: OnnxImporter, node: Any, x: Any) -> Node:
    return imp.graph.add(_UNARY[node.op_type], (imp.tensor(x),))


_VARIADIC = {"Sum": "add", "Max": "maximum", "Min": "minimum", "Mean": "add"}


@onnx_op(*_VARIADIC)
def _variadic(imp: OnnxImporter, node: Any, *xs: Any) -> Node:
    nodes = [imp.tensor(x) for x in xs]
    out = nodes[0]
    for x in nodes[1:]:
        out = elementwise(imp, _VARIADIC[node.op_type], [out, x], out.dtype)
    if node.op_type == "Mean" and len(nodes) > 1:
        out = elementwise(imp, "div", [out, float(len(nodes))], out.dtype)
    return out


@onnx_op("Identity")
def _identity(imp: OnnxImporter, node: Any, x: Any) -> Any:
    return x


@onnx_op("Gelu")
def _gelu(imp: OnnxImporter, node: Any, x: Any, approximate: str = "none") -> Node:
    return imp.graph.add("gelu_tanh" if approximate == "tanh" else "gelu", (imp.tensor(x),))


@onnx_op("LeakyRelu")
def _leaky_relu(imp: OnnxImporter, node: Any, x: Any, alpha: float = 0.01) -> Node:
    x = imp.tensor(x)
    return select(imp, elementwise(imp, "lt", [x, 0.0], x.dtype), elementwise(imp, "mul", [x, alpha], x.dtype), x, x.dtype)


@onnx_op("Clip")
def _clip(imp: OnnxImporter, node: Any, x: Any, lo: Any = None, hi: Any = None) -> Node:
    out = imp.tensor(x)
    if lo is not None:
        out = elementwise(imp, "maximum", [out, imp.tensor(lo)], out.dtype)
    if hi is not None:
        out = elementwise(imp, "minimum", [out, imp.tensor(hi)], out.dtype)
    return out


@onnx_op("Elu", "Selu", "Celu")
def _elu(imp: OnnxImporter, node: Any, x: Any, alpha: float | None = None, gamma: float = 1.0507009873554805) -> Node:
    x = imp.tensor(x)
    defaults = {"Elu": 1.0, "Selu": 1.6732632423543772, "Celu": 1.0}
    a = defaults[node.op_type] if alpha is None else alpha
    inner = elementwise(imp, "div", [x, a], x.dtype) if node.op_type == "Celu" else x
    neg = elementwise(imp, "mul", [imp.graph.add("expm1", (inner,)), a], x.dtype)
    out = select(imp, elementwise(imp, "gt", [x, 0.0], x.dtype), x, neg, x.dtype)
    return elementwise(imp, "mul", [out, gamma], x.dtype) if node.op_type == "Selu" else out


@onnx_op("HardSigmoid", "HardSwish")
def _hard_sigmoid(imp: OnnxImporter, node: Any, x: Any, alpha: float | None = None, beta: float = 0.5) -> Node:
    x = imp.tensor(x)
    a = (1.0 / 6.0 if node.op_type == "HardSwish" else 0.2) if alpha is None else alpha
    y = elementwise(imp, "add", [elementwise(imp, "mul", [x, a], x.dtype), beta], x.dtype)
    y = elementwise(imp, "minimum", [elementwise(imp, "maximum", [y, 0.0], x.dtype), 1.0], x.dtype)
    return elementwise(imp, "mul", [x, y], x.dtype) if node.op_type == "HardSwish" else y


@onnx_op("Softplus", "Softsign", "Mish")
def _soft(imp: OnnxImporter, node: Any, x: Any) -> Node:
    x = imp.tensor(x)
    if node.op_type == "Softsign":
        return elementwise(imp, "div", [x, elementwise(imp, "add", [imp.graph.add("abs", (x,)), 1.0], x.dtype)], x.dtype)
    # log(1 + e^x) = max(x, 0) + log1p(e^-|x|): no overflow for large x
    soft = elementwise(imp, "add", [imp.graph.add("relu", (x,)), imp.graph.add("log1p", (imp.graph.add("exp", (imp.graph.add("neg", (imp.graph.add("abs", (x,)),)),)),))], x.dtype)
    return soft if node.op_type == "Softplus" else elementwise(imp, "mul", [x, imp.graph.add("tanh", (soft,))], x.dtype)


@onnx_op("PRelu")
def _prelu(imp: OnnxImporter, node: Any, x: Any, slope: Any) -> Node:
    x = imp.tensor(x)
    return select(imp, elementwise(imp, "lt", [x, 0.0], x.dtype), elementwise(imp, "mul", [x, imp.tensor(slope)], x.dtype), x, x.dtype)


@onnx_op("Dropout")
def _dropout(imp: OnnxImporter, node: Any, x: Any, ratio: Any = None, training_mode: Any = None, seed: int | None = None) -> Any:
    mode = _known(training_mode) if training_mode is not None else np.array(False)
    if mode is None or bool(mode.reshape(-1)[0]):  # a run-time flag may say training too
        raise LoweringError("Dropout in training mode")
    if len(node.output) > 1 and node.output[1]:
        x = imp.tensor(x)
        ones = imp.graph.add("broadcast_in_dim", (imp.graph.add_constant(np.array(True)), *imp.sizes(x.shape)), {"dims": ()})
        return [x, ones]
    return x


@onnx_op("Where")
def _where(imp: OnnxImporter, node: Any, cond: Any, a: Any, b: Any) -> Node:
    x, y = imp.tensor(a), imp.tensor(b)
    return select(imp, imp.tensor(cond), x, y, x.dtype)


@onnx_op("CastLike")
def _cast_like(imp: OnnxImporter, node: Any, x: Any, like: Any, saturate: int = 1) -> Any:
    return convert(imp, imp.tensor(x), imp.tensor(like).dtype)


@onnx_op("Cast")
def _cast(imp: OnnxImporter, node: Any, x: Any, to: int, saturate: int = 1, round_mode: str = "up") -> Any:
    if to not in ELEM_TYPES:
        raise LoweringError(f"Cast to element type {to}, which disc does not run")
    k = _known(x)
    if k is not None and not isinstance(x, Node):
        return k.astype(numpy_dtype(ELEM_TYPES[to])) if ELEM_TYPES[to] != "bf16" else convert(imp, imp.tensor(x), "bf16")
    if isinstance(x, ShapeValue) and ELEM_TYPES[to] in ("i64", "i32"):
        return x
    return convert(imp, imp.tensor(x), ELEM_TYPES[to])


# -- linear algebra ----------------------------------------------------------------------------------
def _matmul(imp: OnnxImporter, a: Node, b: Node) -> Node:
    """numpy's matmul: a 1-d operand is a row (lhs) or a column (rhs) whose dim is then dropped,
    batch dims broadcast."""
    ra, rb = a.tensor_type.rank, b.tensor_type.rank
    out = batched_matmul(imp, reshape(imp, a, [1, a.shape[0]]) if ra == 1 else a, reshape(imp, b, [b.shape[0], 1]) if rb == 1 else b)
    if ra > 1 and rb > 1:
        return out
    shape = list(out.shape)
    if rb == 1:
        shape.pop(-1)
    if ra == 1:
        shape.pop(-1 if rb == 1 else -2)
    return reshape(imp, out, shape)


@onnx_op("MatMul")
def _matmul_op(imp: OnnxImporter, node: Any, a: Any, b: Any) -> Node:
    return _matmul(imp, imp.tensor(a), imp.tensor(b))


@onnx_op("Einsum")
def _einsum(imp: OnnxImporter, node: Any, *xs: Any, equation: str = "") -> Node:
    return einsum(imp, equation, [imp.tensor(x) for x in xs])


@onnx_op("Gemm")
def _gemm(imp: OnnxImporter, node: Any, a: Any, b: Any, c: Any = None, alpha: float = 1.0, beta: float = 1.0, transA: int = 0, transB: int = 0) -> Node:
    x, y = imp.tensor(a), imp.tensor(b)
    if transA:
        x = imp.graph.add("transpose", (x,), {"perm": (1, 0)})
    if transB:
        y = imp.graph.add("transpose", (y,), {"perm": (1, 0)})
    out = _matmul(imp, x, y)
    if alpha != 1.0:
        out = elementwise(imp, "mul", [out, alpha], out.dtype)
    if c is not None:
        bias = imp.tensor(c)
        if beta != 1.0:
            bias = elementwise(imp, "mul", [bias, beta], out.dtype)
        out = elementwise(imp, "add", [out, bias], out.dtype)
    return out


# -- normalisation and softmax -------------------------------------------------------------------------
@onnx_op("Softmax", "LogSoftmax")
def _softmax(imp: OnnxImporter, node: Any, x: Any, axis: int = -1) -> Node:
    x = imp.tensor(x)
    axis = normalize_axis(axis, x.tensor_type.rank, node.op_type)
    if imp.opset < 13:  # softmax over the flattened trailing dims
        raise LoweringError(f"{node.op_type} before opset 13 (coerced to 2-d)")
    return log_softmax(imp, x, axis) if node.op_type == "LogSoftmax" else softmax(imp, x, axis)


@onnx_op("BatchNormalization")
def _batch_norm(imp: OnnxImporter, node: Any, x: Any, scale: Any, bias: Any, mean: Any, var: Any, epsilon: float = 1e-5, momentum: float = 0.9, training_mode: int = 0) -> Node:
    if training_mode or (len(node.output) > 1 and any(node.output[1:])):
        raise LoweringError("BatchNormalization in training mode")
    x = imp.tensor(x)
    rank = x.tensor_type.rank

    def channel(v: Any) -> Node:
        return imp.graph.add("broadcast_in_dim", (imp.tensor(v), *imp.sizes(x.shape)), {"dims": (1,)}) if rank > 1 else imp.tensor(v)

    inv = imp.graph.add("rsqrt", (elementwise(imp, "add", [imp.tensor(var), epsilon], x.dtype),))
    out = elementwise(imp, "mul", [elementwise(imp, "sub", [x, channel(mean)], x.dtype), channel(elementwise(imp, "mul", [inv, imp.tensor(scale)], x.dtype))], x.dtype)
    return elementwise(imp, "add", [out, channel(bias)], x.dtype)


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


_REDUCE = {"ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min", "ReduceProd": "prod", "ReduceMean": "mean"}


@onnx_op(*_REDUCE)
def _reduce(imp: OnnxImporter, node: Any, x: Any, axes_in: Any = None, keepdims: int = 1, noop_with_empty_axes: int = 0, axes: Sequence[int] | None = None) -> Node:
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    chosen = axes if axes is not None else (_ints(axes_in, f"{node.op_type} axes") if axes_in is not None else None)
    if not chosen:
        if noop_with_empty_axes:
            return x
        chosen = list(range(rank))
    dims = sorted({normalize_axis(a, rank, node.op_type) for a in chosen})
    kind = _REDUCE[node.op_type]
    out = mean(imp, x, dims, True) if kind == "mean" else reduce(imp, x, dims, kind, True)
    if keepdims:
        return out
    return reshape(imp, out, [d for i, d in enumerate(x.shape) if i not in dims])


# -- movement ------------------------------------------------------------------------------------------
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
def _reshape(imp: OnnxImporter, node: Any, x: Any, shape: Any, allowzero: int = 0) -> Node:
    x = imp.tensor(x)
    return reshape(imp, x, reshape_target(imp, x, _dims_of(shape, "Reshape's shape"), allowzero))


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
    positions = sorted(normalize_axis(a, rank, "Unsqueeze") for a in wanted)
    shape = list(x.shape)
    for p in positions:
        shape.insert(p, 1)
    return reshape(imp, x, shape)


@onnx_op("Squeeze")
def _squeeze(imp: OnnxImporter, node: Any, x: Any, axes_in: Any = None, axes: Any = None) -> Any:
    if isinstance(x, ShapeValue) and len(x.dims) == 1 and (axes_in is None and axes is None or _axes(imp, node, axes_in, axes) in ([0], [-1])):
        return DimValue(x.dims[0])
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
    s, e = _ints(starts, "Slice starts"), _ints(ends, "Slice ends")
    ax = _ints(axes, "Slice axes") if axes is not None else list(range(len(s)))
    st = _ints(steps, "Slice steps") if steps is not None else [1] * len(s)
    if isinstance(x, ShapeValue) and ax == [0] and st == [1]:
        return ShapeValue(x.dims[slice(s[0], e[0])])
    out = imp.tensor(x)
    for a, lo, hi, step in zip(ax, s, e, st):
        a = normalize_axis(a, out.tensor_type.rank, "Slice")
        if step <= 0:
            raise LoweringError("Slice with a negative step")
        bounds = [slice_bound(imp, out.shape[a], v) for v in (lo, hi)]
        out = imp.graph.add("slice", (out, *bounds), {"axis": a, "step": step})
    return out


@onnx_op("Expand")
def _expand(imp: OnnxImporter, node: Any, x: Any, shape: Any) -> Node:
    x = imp.tensor(x)
    target = _dims_of(shape, "Expand's shape")
    return broadcast_to(imp, x, broadcast_shapes(imp, [x.shape, target]))


@onnx_op("ConstantOfShape")
def _constant_of_shape(imp: OnnxImporter, node: Any, shape: Any, value: Any = None) -> Node:
    fill = value if value is not None else np.zeros((1,), np.float32)
    dims = _dims_of(shape, "ConstantOfShape's shape")
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


# -- convolution and pooling -----------------------------------------------------------------------------
@onnx_op("Conv")
def _conv(imp: OnnxImporter, node: Any, x: Any, w: Any, b: Any = None, dilations: Any = None, group: int = 1, kernel_shape: Any = None, pads: Any = None, strides: Any = None, auto_pad: str = "NOTSET") -> Node:
    if auto_pad not in ("NOTSET", "VALID"):
        raise LoweringError(f"Conv with auto_pad={auto_pad}")
    x, w = imp.tensor(x), imp.tensor(w)
    n = w.tensor_type.rank - 2
    pads = list(pads) if pads is not None else [0] * (2 * n)
    if pads[:n] != pads[n:]:
        raise LoweringError(f"Conv with asymmetric pads {pads}")
    out = imp.graph.add(
        "convolution",
        (x, w),
        {
            "stride": tuple(strides or [1] * n),
            "padding": tuple(pads[:n]),
            "dilation": tuple(dilations or [1] * n),
            "groups": int(group),
            "transposed": False,
            "output_padding": tuple([0] * n),
        },
    )
    if b is None:
        return out
    bias = imp.tensor(b)
    return imp.graph.add("add", (out, imp.graph.add("broadcast_in_dim", (bias, *imp.sizes(out.shape)), {"dims": (1,)})))



# -- pooling ---------------------------------------------------------------------------------------------
def _pool_attrs(node: Any, rank: int, kernel_shape: Sequence[int], strides: Any, pads: Any, dilations: Any, auto_pad: str) -> dict:
    n = len(kernel_shape)
    if auto_pad not in ("NOTSET", "VALID"):
        raise LoweringError(f"{node.op_type} with auto_pad={auto_pad}")
    pads = list(pads) if pads is not None else [0] * (2 * n)
    lead = rank - n
    return {
        "window": (1,) * lead + tuple(kernel_shape),
        "strides": (1,) * lead + tuple(strides or [1] * n),
        "padding": ((0, 0),) * lead + tuple((pads[i], pads[i + n]) for i in range(n)),
        "dilation": (1,) * lead + tuple(dilations or [1] * n),
    }


@onnx_op("MaxPool")
def _max_pool(imp: OnnxImporter, node: Any, x: Any, kernel_shape: Sequence[int] = (), strides: Any = None, pads: Any = None, dilations: Any = None, ceil_mode: int = 0, auto_pad: str = "NOTSET", storage_order: int = 0) -> Node:
    if len(node.output) > 1 and node.output[1]:
        raise LoweringError("MaxPool's Indices output")
    x = imp.tensor(x)
    attrs = _pool_attrs(node, x.tensor_type.rank, kernel_shape, strides, pads, dilations, auto_pad)
    return imp.graph.add("reduce_window", (x,), {"kind": "max", "ceil_mode": bool(ceil_mode), **attrs})


@onnx_op("AveragePool")
def _avg_pool(imp: OnnxImporter, node: Any, x: Any, kernel_shape: Sequence[int] = (), strides: Any = None, pads: Any = None, dilations: Any = None, ceil_mode: int = 0, auto_pad: str = "NOTSET", count_include_pad: int = 0) -> Node:
    x = imp.tensor(x)
    attrs = _pool_attrs(node, x.tensor_type.rank, kernel_shape, strides, pads, dilations, auto_pad)
    total = imp.graph.add("reduce_window", (x,), {"kind": "sum", "ceil_mode": bool(ceil_mode), **attrs})
    padded = any(p != (0, 0) for p in attrs["padding"])
    if (count_include_pad or not padded) and not ceil_mode:
        return elementwise(imp, "div", [total, float(np.prod(kernel_shape))], x.dtype)
    # The window's count of real elements (or of real and padding ones, not of those past the
    # end that ceil_mode adds): the same window sum over ones.
    ones = imp.graph.add("broadcast_in_dim", (imp.graph.add_constant(np.array(1.0, numpy_dtype(x.dtype))), *imp.sizes(x.shape)), {"dims": ()})
    if count_include_pad:
        if ceil_mode:  # the padding counts, the windows' overhang past it does not: not expressible here yet
            raise LoweringError("AveragePool with count_include_pad and ceil_mode together")
        ones = imp.graph.add("pad", (ones,), {"low": tuple(p[0] for p in attrs["padding"]), "high": tuple(p[1] for p in attrs["padding"]), "value": 1.0})
        counted = {**attrs, "padding": ((0, 0),) * len(attrs["padding"])}
        count = imp.graph.add("reduce_window", (ones,), {"kind": "sum", "ceil_mode": bool(ceil_mode), **counted})
    else:
        count = imp.graph.add("reduce_window", (ones,), {"kind": "sum", "ceil_mode": bool(ceil_mode), **attrs})
    if not imp.graph.constraints.prove_same_shape(total.shape, count.shape):
        raise LoweringError(f"AveragePool: window counts of shape {count.shape} for sums of shape {total.shape}")
    return elementwise(imp, "div", [total, count], x.dtype)


@onnx_op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(imp: OnnxImporter, node: Any, x: Any) -> Node:
    x = imp.tensor(x)
    axes = list(range(2, x.tensor_type.rank))
    return mean(imp, x, axes, True) if node.op_type == "GlobalAveragePool" else reduce(imp, x, axes, "max", True)


@onnx_op("LRN")
def _lrn(imp: OnnxImporter, node: Any, x: Any, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> Node:
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    lo = (size - 1) // 2
    window = {
        "window": (1, size) + (1,) * (rank - 2),
        "strides": (1,) * rank,
        "padding": ((0, 0), (lo, size - 1 - lo)) + ((0, 0),) * (rank - 2),
        "dilation": (1,) * rank,
    }
    squares = imp.graph.add("reduce_window", (elementwise(imp, "mul", [x, x], x.dtype),), {"kind": "sum", "ceil_mode": False, **window})
    base = elementwise(imp, "add", [elementwise(imp, "mul", [squares, alpha / size], x.dtype), bias], x.dtype)
    return elementwise(imp, "div", [x, elementwise(imp, "pow", [base, beta], x.dtype)], x.dtype)


@onnx_op("CumSum")
def _cumsum(imp: OnnxImporter, node: Any, x: Any, axis: Any, exclusive: int = 0, reverse: int = 0) -> Node:
    x = imp.tensor(x)
    a = normalize_axis(_ints(axis, "CumSum's axis")[0], x.tensor_type.rank, "CumSum")
    return cumulative_sum(imp, x, a, bool(exclusive), bool(reverse))


@onnx_op("Hardmax")
def _hardmax(imp: OnnxImporter, node: Any, x: Any, axis: int = -1) -> Node:
    """1 where the first maximum along ``axis`` lies, 0 elsewhere."""
    x = imp.tensor(x)
    a = normalize_axis(axis, x.tensor_type.rank, "Hardmax")
    first = imp.graph.add("argreduce", (x,), {"axis": a, "kind": "argmax", "keepdim": True, "last": False})
    positions = imp.graph.add("broadcast_in_dim", (imp.graph.add("iota", (imp.index(x.shape[a]),), {"dtype": "i64"}), *imp.sizes(x.shape)), {"dims": (a,)})
    hit = imp.graph.add("eq", (positions, broadcast_to(imp, first, x.shape)))
    return convert(imp, hit, x.dtype)


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


@onnx_op("Pad")
def _pad(imp: OnnxImporter, node: Any, x: Any, pads: Any, value: Any = None, axes: Any = None, mode: str = "constant") -> Node:
    if mode != "constant":
        raise LoweringError(f"Pad mode {mode!r}")
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    amounts = _ints(pads, "Pad's pads")
    chosen = [normalize_axis(a, rank, "Pad") for a in _ints(axes, "Pad's axes")] if axes is not None else list(range(rank))
    low, high = [0] * rank, [0] * rank
    for i, a in enumerate(chosen):
        low[a], high[a] = amounts[i], amounts[i + len(chosen)]
    fill = 0.0 if value is None else float(np.asarray(_known(value)).reshape(-1)[0]) if _known(value) is not None else None
    if fill is None and isinstance(value, Node) and value.op == "input":
        raise NeedsValue("Pad's value", value.name)
    if fill is None:
        raise LoweringError("Pad's value must be a constant")
    return imp.graph.add("pad", (x,), {"low": tuple(low), "high": tuple(high), "value": fill if x.dtype in FLOAT_DTYPES else int(fill)})


@onnx_op("Split")
def _split(imp: OnnxImporter, node: Any, x: Any, split: Any = None, axis: int = 0, num_outputs: int | None = None) -> list[Node]:
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
    return tile(imp, imp.tensor(x), _ints(repeats, "Tile's repeats"))


@onnx_op("ArgMax", "ArgMin")
def _argreduce(imp: OnnxImporter, node: Any, x: Any, axis: int = 0, keepdims: int = 1, select_last_index: int = 0) -> Node:
    x = imp.tensor(x)
    axis = normalize_axis(axis, x.tensor_type.rank, node.op_type)
    return imp.graph.add("argreduce", (x,), {"axis": axis, "kind": node.op_type.lower(), "keepdim": bool(keepdims), "last": bool(select_last_index)})


@onnx_op("Trilu")
def _trilu(imp: OnnxImporter, node: Any, x: Any, k: Any = None, upper: int = 1) -> Node:
    x = imp.tensor(x)
    diagonal = _ints(k, "Trilu's k")[0] if k is not None else 0
    keep = triangle(imp, x.shape[-2], x.shape[-1], bool(upper), diagonal)
    zero = 0.0 if x.dtype in FLOAT_DTYPES else (False if x.dtype == "i1" else 0)
    return select(imp, broadcast_to(imp, keep, x.shape), x, zero, x.dtype)


@onnx_op("RMSNormalization")
def _rms_norm(imp: OnnxImporter, node: Any, x: Any, scale: Any, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1) -> Node:
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    axes = list(range(normalize_axis(axis, rank, "RMSNormalization"), rank))
    square = mean(imp, elementwise(imp, "mul", [x, x], x.dtype), axes, True)
    out = elementwise(imp, "mul", [x, imp.graph.add("rsqrt", (elementwise(imp, "add", [square, epsilon], x.dtype),))], x.dtype)
    return elementwise(imp, "mul", [out, imp.tensor(scale)], x.dtype)


_NORM_REDUCE = {"ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"}


@onnx_op(*_NORM_REDUCE)
def _norm_reduce(imp: OnnxImporter, node: Any, x: Any, axes_in: Any = None, keepdims: int = 1, noop_with_empty_axes: int = 0, axes: Sequence[int] | None = None) -> Node:
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    chosen = axes if axes is not None else (_ints(axes_in, f"{node.op_type} axes") if axes_in is not None else None)
    if not chosen and noop_with_empty_axes:
        chosen = []
    elif not chosen:
        chosen = list(range(rank))
    dims = sorted({normalize_axis(a, rank, node.op_type) for a in chosen})
    op = node.op_type
    if op == "ReduceLogSumExp":  # log(sum(exp(x - max))) + max: no overflow
        peak = reduce(imp, x, dims, "max", True) if dims else x
        finite = select(imp, imp.graph.add("isinf", (peak,)), 0.0, peak, x.dtype) if x.dtype in FLOAT_DTYPES else peak
        shifted = imp.graph.add("exp", (elementwise(imp, "sub", [x, finite], x.dtype),))
        out = elementwise(imp, "add", [imp.graph.add("log", (reduce(imp, shifted, dims, "sum", True) if dims else shifted,)), finite], x.dtype)
    else:
        term = {"ReduceL1": lambda: imp.graph.add("abs", (x,)), "ReduceLogSum": lambda: x}.get(op, lambda: elementwise(imp, "mul", [x, x], x.dtype))()
        out = reduce(imp, term, dims, "sum", True) if dims else term
        if op == "ReduceL2":
            out = imp.graph.add("sqrt", (out,))
        elif op == "ReduceLogSum":
            out = imp.graph.add("log", (out,))
    if keepdims or not dims:
        return out
    return reshape(imp, out, [d for i, d in enumerate(x.shape) if i not in dims])
