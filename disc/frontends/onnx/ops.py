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
    flip,
    log_softmax,
    mean,
    normalize,
    reduce,
    reshape,
    scalar,
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
_BITWISE = {"BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor"}
_NUMPY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
    "div": lambda a, b: np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b)),  # integer Div truncates
    "remainder": np.mod, "fmod": np.fmod,
    "eq": np.equal, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
}  # fmt: skip
_NUMPY_LOGICAL = {"logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor}


def _shape_pair(imp: OnnxImporter, op: str, a: Any, b: Any) -> Any:
    """``a op b`` computed now when both are shape values, dims or known integers (the shape
    subgraph of a model), else None (a run-time op). A caller's input combined with a shape is
    taken as a value the program is compiled for."""
    ka, kb = _known(a), _known(b)
    if ka is not None and kb is not None and op in _NUMPY and ka.dtype.kind in "iu" and kb.dtype.kind in "iu":
        out = _NUMPY[op](ka, kb)  # shape arithmetic on constants (0-d stays an array)
        return np.asarray(out, bool if op in _COMPARE.values() else np.result_type(ka, kb))
    shapes = [v for v in (a, b) if isinstance(v, (ShapeValue, DimValue))]
    if not shapes:
        return None
    for v in (a, b):
        if isinstance(v, Node) and v.op == "input" and v.dtype in ("i64", "i32"):
            raise NeedsValue(f"shape arithmetic ({op}) on input", v.name)
    if isinstance(a, DimValue) or isinstance(b, DimValue):  # arithmetic on one symbolic dim
        da = a.dim if isinstance(a, DimValue) else (int(ka) if ka is not None and ka.size == 1 else None)
        db = b.dim if isinstance(b, DimValue) else (int(kb) if kb is not None and kb.size == 1 else None)
        out = _dim_op(imp, op, da, db) if da is not None and db is not None else None
        if out is not None:
            return DimValue(out)
    da, db = _shape_operand(a), _shape_operand(b)
    if isinstance(a, ShapeValue) or isinstance(b, ShapeValue):
        if da is None or db is None:
            return None
        if len(da) == 1:
            da = da * len(db)
        if len(db) == 1:
            db = db * len(da)
        out = [_dim_op(imp, op, x, y) for x, y in zip(da, db)] if len(da) == len(db) else [None]
        if all(d is not None for d in out):
            return ShapeValue(out)
    return None


def _dim_op(imp: OnnxImporter, op: str, a: DimLike, b: DimLike) -> DimLike | None:
    """Arithmetic, max and min of two dims, where symbolic dims allow it."""
    if op in ("maximum", "minimum"):
        c = imp.graph.constraints
        if c.prove_ge(a, b):
            return a if op == "maximum" else b
        if c.prove_ge(b, a):
            return b if op == "maximum" else a
        return None
    return _dim_arith(op, a, b)


def _dims_compared(imp: OnnxImporter, op: str, a: DimLike, b: DimLike) -> bool | None:
    """``a op b`` on two dims where the constraints decide it, else None."""
    c = imp.graph.constraints
    if op == "eq":
        return True if c.prove_equal(a, b) else False if c.prove_not_equal(a, b) else None
    lhs, rhs, strict = {"ge": (a, b, False), "le": (b, a, False), "gt": (a, b, True), "lt": (b, a, True)}[op]
    if c.prove_ge(lhs, as_expr(rhs) + int(strict)):
        return True
    if c.prove_ge(rhs, as_expr(lhs) + int(not strict)):
        return False
    return None


def _shape_operand(v: Any) -> list[DimLike] | None:
    """The dims of a shape-like value (a shape, one dim, or known integers), or None."""
    if isinstance(v, ShapeValue):
        return list(v.dims)
    if isinstance(v, DimValue):
        return [v.dim]
    k = _known(v)
    return [int(x) for x in k.reshape(-1)] if k is not None and k.dtype.kind in "iu" else None


@onnx_op(*_BINARY, *_COMPARE, *_LOGICAL, *_BITWISE)
def _binary(imp: OnnxImporter, node: Any, a: Any, b: Any, fmod: int = 0) -> Any:
    op = _BINARY.get(node.op_type) or _COMPARE.get(node.op_type) or _LOGICAL.get(node.op_type) or _BITWISE[node.op_type]
    if op == "remainder" and fmod:
        op = "fmod"  # the dividend's sign, as C's fmod (the default, 0, takes the divisor's)
    folded = _shape_pair(imp, op, a, b)
    if folded is not None:
        return folded
    ka, kb = _known(a), _known(b)
    if ka is not None and kb is not None and op in _NUMPY_LOGICAL and ka.dtype == bool and kb.dtype == bool:
        return np.asarray(_NUMPY_LOGICAL[op](ka, kb))
    if op in _COMPARE.values() and (isinstance(a, (ShapeValue, DimValue)) or isinstance(b, (ShapeValue, DimValue))):
        da, db = _shape_operand(a), _shape_operand(b)
        if da is not None and db is not None and (len(da) == len(db) or 1 in (len(da), len(db))):
            n = max(len(da), len(db))
            decided = [_dims_compared(imp, op, da[i % len(da)], db[i % len(db)]) for i in range(n)]
            if None not in decided:  # decided by the constraints: a compile-time condition
                scalar_like = isinstance(a, DimValue) and isinstance(b, DimValue) or (ka is not None and ka.ndim == 0 and isinstance(b, DimValue)) or (kb is not None and kb.ndim == 0 and isinstance(a, DimValue))
                return np.array(decided[0]) if scalar_like else np.array(decided)
    x, y = imp.tensor(a), imp.tensor(b)
    if op in _LOGICAL.values():
        dtype = "i1"
    else:
        dtype = x.dtype
        if x.dtype != y.dtype and op == "pow":  # Pow alone may mix types: the result is the base's
            return _mixed_pow(imp, x, y)
        if x.dtype != y.dtype:
            raise LoweringError(f"{node.op_type}: operand dtypes differ ({x.dtype}, {y.dtype}); ONNX requires one type")
    return elementwise(imp, op, [x, y], dtype)


def _mixed_pow(imp: OnnxImporter, base: Node, exponent: Node) -> Node:
    """Pow of a base and an exponent of different types, in the base's type: a float base takes
    the exponent converted to it; an integer base is raised in float64 and truncated back (as
    ONNX's reference computes it)."""
    if base.dtype in FLOAT_DTYPES:
        return elementwise(imp, "pow", [base, convert(imp, exponent, base.dtype)], base.dtype)
    wide = elementwise(imp, "pow", [convert(imp, base, "f64"), convert(imp, exponent, "f64")], "f64")
    return convert(imp, wide, base.dtype)


_UNARY = {
    "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
    "Neg": "neg", "Abs": "abs", "Erf": "erf", "Reciprocal": "reciprocal", "Floor": "floor", "Ceil": "ceil",
    "Sin": "sin", "Cos": "cos", "Not": "logical_not", "Sign": "sign", "Round": "round",
    "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh",
    "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh", "IsNaN": "isnan", "BitwiseNot": "bitwise_not",
}  # fmt: skip


_NUMPY_UNARY = {"neg": np.negative, "abs": np.abs, "sign": np.sign, "logical_not": np.logical_not}


@onnx_op(*_UNARY)
def _unary(imp: OnnxImporter, node: Any, x: Any) -> Any:
    op = _UNARY[node.op_type]
    k = _known(x)
    if k is not None and op in _NUMPY_UNARY and k.dtype.kind in "iub":  # shape arithmetic and conditions on constants
        return np.asarray(_NUMPY_UNARY[op](k), k.dtype)
    if isinstance(x, DimValue) and op == "neg":
        return DimValue(-as_expr(x.dim))
    return imp.graph.add(op, (imp.tensor(x),))


_VARIADIC = {"Sum": "add", "Max": "maximum", "Min": "minimum", "Mean": "add"}


@onnx_op(*_VARIADIC)
def _variadic(imp: OnnxImporter, node: Any, *xs: Any) -> Any:
    if node.op_type in ("Max", "Min", "Sum") and len(xs) > 1:  # shape arithmetic: fold it pairwise
        out = xs[0]
        for x in xs[1:]:
            folded = _shape_pair(imp, {"Max": "maximum", "Min": "minimum", "Sum": "add"}[node.op_type], out, x)
            if folded is None:
                break
            out = folded
        else:
            return out
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


@onnx_op("IsInf")
def _isinf(imp: OnnxImporter, node: Any, x: Any, detect_negative: int = 1, detect_positive: int = 1) -> Node:
    x = imp.tensor(x)
    hit = imp.graph.add("isinf", (x,))
    if detect_negative and detect_positive:
        return hit
    if not detect_negative and not detect_positive:
        return elementwise(imp, "logical_and", [hit, False], "i1")
    sign = elementwise(imp, "gt" if detect_positive else "lt", [x, 0.0], x.dtype)
    return elementwise(imp, "logical_and", [hit, sign], "i1")


@onnx_op("Shrink")
def _shrink(imp: OnnxImporter, node: Any, x: Any, bias: float = 0.0, lambd: float = 0.5) -> Node:
    x = imp.tensor(x)
    zero = 0.0 if x.dtype in FLOAT_DTYPES else 0
    above = select(imp, elementwise(imp, "gt", [x, lambd], x.dtype), elementwise(imp, "sub", [x, bias], x.dtype), zero, x.dtype)
    return select(imp, elementwise(imp, "lt", [x, -lambd], x.dtype), elementwise(imp, "add", [x, bias], x.dtype), above, x.dtype)


@onnx_op("ThresholdedRelu")
def _thresholded_relu(imp: OnnxImporter, node: Any, x: Any, alpha: float = 1.0) -> Node:
    x = imp.tensor(x)
    return select(imp, elementwise(imp, "gt", [x, alpha], x.dtype), x, 0.0, x.dtype)


def _swish(imp: OnnxImporter, x: Node, alpha: float) -> Node:
    gate = x if alpha == 1.0 else elementwise(imp, "mul", [x, alpha], x.dtype)
    return elementwise(imp, "mul", [x, imp.graph.add("sigmoid", (gate,))], x.dtype)


@onnx_op("Swish")
def _swish_op(imp: OnnxImporter, node: Any, x: Any, alpha: float = 1.0) -> Node:
    return _swish(imp, imp.tensor(x), alpha)


@onnx_op("SwiGLU")
def _swiglu(imp: OnnxImporter, node: Any, a: Any, b: Any, alpha: float = 1.0) -> Node:
    gate, value = imp.tensor(a), imp.tensor(b)
    if not imp.graph.constraints.prove_same_shape(gate.shape, value.shape):
        raise LoweringError(f"SwiGLU: the gate {gate.shape} and the value {value.shape} must have one shape (no broadcasting)")
    return elementwise(imp, "mul", [_swish(imp, gate, alpha), value], gate.dtype)


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
def _where(imp: OnnxImporter, node: Any, cond: Any, a: Any, b: Any) -> Any:
    kc = _known(cond)
    da, db = _shape_operand(a), _shape_operand(b)
    if kc is not None and kc.dtype == bool and da is not None and db is not None and kc.ndim <= 1:
        n = max(kc.size, len(da), len(db))
        if all(len(v) in (1, n) for v in (da, db)) and kc.size in (1, n):  # a choice between shapes, known now
            picked = [da[i % len(da)] if kc.reshape(-1)[i % kc.size] else db[i % len(db)] for i in range(n)]
            if kc.ndim == 0 and not isinstance(a, ShapeValue) and not isinstance(b, ShapeValue) and n == 1 and (isinstance(a, DimValue) or isinstance(b, DimValue) or np.ndim(_known(a)) == 0):
                return DimValue(picked[0])
            return ShapeValue(picked)
    x, y = imp.tensor(a), imp.tensor(b)
    return select(imp, imp.tensor(cond), x, y, x.dtype)


@onnx_op("CastLike")
def _cast_like(imp: OnnxImporter, node: Any, x: Any, like: Any, saturate: int = 1) -> Any:
    target = like.dtype if isinstance(like, Node) else imp.tensor(like).dtype
    k = _known(x)
    if k is not None and not isinstance(x, Node) and k.dtype.kind in "fiub":  # a constant stays one (a Pad's value, a shape)
        if target != "bf16":
            return k.astype(numpy_dtype(target))
        import ml_dtypes  # (installed with onnx) numpy's bfloat16, as onnx gives bf16 constants

        return k.astype(ml_dtypes.bfloat16)
    return convert(imp, imp.tensor(x), target)


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


# -- attention ------------------------------------------------------------------------------------------
def _split_heads(imp: OnnxImporter, x: Node, heads: int) -> Node:
    """[batch, seq, heads * size] -> [batch, heads, seq, size]."""
    b, s, hidden = x.shape
    _require_divisible(imp, hidden, heads, f"Attention: the hidden dim must be divisible by the {heads} heads")
    return imp.graph.add("transpose", (reshape(imp, x, [b, s, heads, as_expr(hidden) // heads]),), {"perm": (0, 2, 1, 3)})


def _repeat_heads(imp: OnnxImporter, x: Node, reps: int) -> Node:
    """Each of K's or V's heads used by ``reps`` consecutive query heads (grouped-query attention)."""
    b, h, s, d = x.shape
    wide = imp.graph.add("broadcast_in_dim", (x, *imp.sizes([b, h, reps, s, d])), {"dims": (0, 1, 3, 4)})
    return reshape(imp, wide, [b, as_expr(h) * reps, s, d])


def _attention_allowed(imp: OnnxImporter, sq: DimLike, skv: DimLike, offset: Any, causal: bool, left: int, right: int, nonpad: Node | None) -> Node | None:
    """Which (query, key) pairs may attend, or None for all: the causal frontier key <= query +
    offset, a sliding window around query + offset, and keys before each batch entry's
    ``nonpad`` length. ``offset`` is the cache length (a dim) or, with ``nonpad``, each entry's
    ``nonpad - sq`` (bottom-right alignment)."""
    if not causal and left < 0 and right < 0 and nonpad is None:
        return None
    rows = imp.graph.add("broadcast_in_dim", (imp.graph.add("iota", (imp.index(sq),), {"dtype": "i64"}), imp.index(sq), imp.index(skv)), {"dims": (0,)})
    cols = imp.graph.add("broadcast_in_dim", (imp.graph.add("iota", (imp.index(skv),), {"dtype": "i64"}), imp.index(sq), imp.index(skv)), {"dims": (1,)})
    if nonpad is not None:  # per batch entry: [batch, 1, sq, skv]
        batch = nonpad.shape[0]
        lengths = imp.graph.add("broadcast_in_dim", (nonpad, *imp.sizes([batch, 1, sq, skv])), {"dims": (0,)})
        start = elementwise(imp, "sub", [lengths, imp.graph.add("index_to_tensor", (imp.index(sq),), {"dtype": "i64"})], "i64")
    else:
        start = imp.graph.add("index_to_tensor", (imp.index(offset),), {"dtype": "i64"})
    ahead = elementwise(imp, "sub", [elementwise(imp, "add", [rows, start], "i64"), cols], "i64")  # query position - key
    allowed = []
    if causal:
        allowed.append(elementwise(imp, "ge", [ahead, 0], "i64"))
    if left >= 0:
        allowed.append(elementwise(imp, "le", [ahead, left], "i64"))
    if right >= 0:
        allowed.append(elementwise(imp, "ge", [ahead, -right], "i64"))
    if nonpad is not None:
        allowed.append(elementwise(imp, "lt", [broadcast_to(imp, cols, ahead.shape), imp.graph.add("broadcast_in_dim", (nonpad, *imp.sizes(ahead.shape)), {"dims": (0,)})], "i64"))
    out = allowed[0]
    for a in allowed[1:]:
        out = elementwise(imp, "logical_and", [out, a], "i1")
    return out


@onnx_op("Attention")
def _attention(
    imp: OnnxImporter, node: Any, q: Any, k: Any, v: Any, attn_mask: Any = None, past_key: Any = None, past_value: Any = None, nonpad_kv_seqlen: Any = None,
    is_causal: int = 0, kv_num_heads: int | None = None, q_num_heads: int | None = None, qk_matmul_output_mode: int = 0, scale: float | None = None,
    softcap: float = 0.0, softmax_precision: int | None = None, left_window_size: int = -1, right_window_size: int = -1,
) -> list[Node]:
    """ONNX Attention (opsets 23-25) as GEMMs, a bias and a softmax that disc fuses. The bias adds
    the mask (a bool mask as 0 / -inf; one shorter than the keys is padded with -inf) and -inf
    where the causal frontier, the window or the keys' padding forbid; a row with every key
    forbidden gives zeros. Outputs: the result, the keys and values with the cache prepended,
    and the scores as ``qk_matmul_output_mode`` picks (0 and 1: scaled and soft-capped, as
    ONNX's reference computes both; 2: with the bias; 3: after the softmax)."""
    q, k, v = imp.tensor(q), imp.tensor(k), imp.tensor(v)
    three_d = q.tensor_type.rank == 3
    if three_d:
        if q_num_heads is None or kv_num_heads is None:
            raise LoweringError("Attention on 3-d inputs needs q_num_heads and kv_num_heads")
        q, k, v = _split_heads(imp, q, q_num_heads), _split_heads(imp, k, kv_num_heads), _split_heads(imp, v, kv_num_heads)
    if q.tensor_type.rank != 4 or k.tensor_type.rank != 4 or v.tensor_type.rank != 4:
        raise LoweringError(f"Attention takes 3-d or 4-d Q, K, V (ranks {q.tensor_type.rank}, {k.tensor_type.rank}, {v.tensor_type.rank})")
    if (past_key is None) != (past_value is None):
        raise LoweringError("Attention: past_key and past_value come together")
    past = 0
    if past_key is not None:
        pk, pv = imp.tensor(past_key), imp.tensor(past_value)
        past = pk.shape[2]
        k, v = imp.graph.add("concat", (pk, k), {"axis": 2}), imp.graph.add("concat", (pv, v), {"axis": 2})
    present_k, present_v = k, v
    dtype = q.dtype
    sq, skv = q.shape[2], k.shape[2]
    hq, hk = _known_dim(q.shape[1]), _known_dim(k.shape[1])
    if hq is None or hk is None or hq % hk:
        raise LoweringError(f"Attention: query heads ({q.shape[1]}) must be a known multiple of key/value heads ({k.shape[1]})")
    if hq != hk:
        k, v = _repeat_heads(imp, k, hq // hk), _repeat_heads(imp, v, hq // hk)
    if scale is None:
        size = _known_dim(q.shape[3])
        if size is None:
            raise LoweringError(f"Attention without a scale needs a known head size (dim 3 of Q: {q.shape[3]})")
        scale = 1.0 / float(np.sqrt(size))
    root = float(np.sqrt(scale))  # Q and K each scaled by the root before the GEMM, as ONNX's reference (16-bit results follow it)
    qs, ks = elementwise(imp, "mul", [q, root], dtype), elementwise(imp, "mul", [k, root], dtype)
    scores = batched_matmul(imp, qs, imp.graph.add("transpose", (ks,), {"perm": (0, 1, 3, 2)}))
    if softcap > 0:
        scores = elementwise(imp, "mul", [imp.graph.add("tanh", (elementwise(imp, "div", [scores, softcap], dtype),)), softcap], dtype)
    raw_scores = scores

    bias = None
    if attn_mask is not None:
        mask = imp.tensor(attn_mask)
        missing = as_expr(skv) - mask.shape[-1]
        if not imp.graph.constraints.prove_equal(missing, 0):  # keys past the mask's end: forbidden
            fill = imp.graph.add("broadcast_in_dim", (scalar(imp, False if mask.dtype == "i1" else -np.inf, mask.dtype), *imp.sizes([*mask.shape[:-1], missing])), {"dims": ()})
            imp.graph.constraints.assume(missing, ">=", 0, "Attention: the mask may not be longer than the keys")
            mask = imp.graph.add("concat", (mask, fill), {"axis": mask.tensor_type.rank - 1})
        bias = select(imp, mask, 0.0, -np.inf, dtype) if mask.dtype == "i1" else convert(imp, mask, dtype)
    nonpad = convert(imp, imp.tensor(nonpad_kv_seqlen), "i64") if nonpad_kv_seqlen is not None else None
    allowed = _attention_allowed(imp, sq, skv, past, bool(is_causal), left_window_size, right_window_size, nonpad)
    if allowed is not None:
        forbid = select(imp, allowed, 0.0, -np.inf, dtype)
        bias = forbid if bias is None else elementwise(imp, "add", [bias, forbid], dtype)
    if bias is not None:
        scores = elementwise(imp, "add", [scores, bias], dtype)

    work = ELEM_TYPES.get(softmax_precision, dtype) if softmax_precision is not None else dtype
    x = convert(imp, scores, work)
    last = x.tensor_type.rank - 1
    peak = reduce(imp, x, [last], "max", True)
    peak = select(imp, imp.graph.add("isinf", (peak,)), 0.0, peak, work)  # an all -inf row: no inf - inf
    e = imp.graph.add("exp", (elementwise(imp, "sub", [x, peak], work),))
    total = reduce(imp, e, [last], "sum", True)
    probs = elementwise(imp, "div", [e, select(imp, elementwise(imp, "eq", [total, 0.0], work), 1.0, total, work)], work)
    if bias is not None:  # a row whose every key the bias forbids attends to nothing
        bias_peak = reduce(imp, bias, [bias.tensor_type.rank - 1], "max", True)
        none_left = elementwise(imp, "logical_and", [imp.graph.add("isinf", (bias_peak,)), elementwise(imp, "lt", [bias_peak, 0.0], dtype)], "i1")
        probs = select(imp, none_left, 0.0, probs, work)
    probs = convert(imp, probs, dtype)
    out = batched_matmul(imp, probs, v)
    if three_d:
        b, h, s, d = out.shape
        out = reshape(imp, imp.graph.add("transpose", (out,), {"perm": (0, 2, 1, 3)}), [b, s, as_expr(h) * d])
    qk = {0: raw_scores, 1: raw_scores, 2: scores, 3: probs}.get(qk_matmul_output_mode)
    if qk is None:
        raise LoweringError(f"Attention qk_matmul_output_mode={qk_matmul_output_mode} (ONNX allows 0 to 3)")
    return [out, present_k, present_v, qk]


@onnx_op("RotaryEmbedding")
def _rotary_embedding(imp: OnnxImporter, node: Any, x: Any, cos_cache: Any, sin_cache: Any, position_ids: Any = None, interleaved: int = 0, rotary_embedding_dim: int = 0, num_heads: int = 0) -> Node:
    """Rotary position embedding: the first ``rotary_embedding_dim`` features of each head turned
    as (x1, x2) pairs, halves or (``interleaved``) neighbours, by the cached cos/sin at each
    position (rows of the caches picked by ``position_ids`` when given); the rest pass."""
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    if rank == 4:  # [batch, heads, seq, size] -> [batch, seq, heads, size]
        work = imp.graph.add("transpose", (x,), {"perm": (0, 2, 1, 3)})
    elif rank == 3:
        if not num_heads:
            raise LoweringError("RotaryEmbedding on a 3-d input needs num_heads")
        b, s_, hidden = x.shape
        _require_divisible(imp, hidden, num_heads, f"RotaryEmbedding: the hidden dim must be divisible by num_heads={num_heads}")
        work = reshape(imp, x, [b, s_, num_heads, as_expr(hidden) // num_heads])
    else:
        raise LoweringError(f"RotaryEmbedding takes a 3-d or 4-d input, not rank {rank}")
    b, seq, heads, size = work.shape
    rd = rotary_embedding_dim or _known_dim(size)
    if rd is None or rd % 2:
        raise LoweringError(f"RotaryEmbedding needs an even, known rotated size (rotary_embedding_dim {rotary_embedding_dim}, head size {size})")
    cos, sin = imp.tensor(cos_cache), imp.tensor(sin_cache)
    if position_ids is not None:
        pos = reshape(imp, convert(imp, imp.tensor(position_ids), "i64"), [as_expr(b) * seq])
        cos, sin = (reshape(imp, imp.graph.add("index_select", (c, pos), {"axis": 0}), [b, seq, rd // 2]) for c in (cos, sin))
    cos, sin = (imp.graph.add("broadcast_in_dim", (c, *imp.sizes([b, seq, heads, rd // 2])), {"dims": (0, 1, 3)}) for c in (cos, sin))
    last = 3

    def part(t: Node, start: DimLike, stop: DimLike, step: int = 1) -> Node:
        return imp.graph.add("slice", (t, imp.index(start), imp.index(stop)), {"axis": last, "step": step})

    if interleaved:
        x1, x2 = part(work, 0, rd, 2), part(work, 1, rd, 2)
    else:
        x1, x2 = part(work, 0, rd // 2), part(work, rd // 2, rd)
    dt = x.dtype
    real = elementwise(imp, "sub", [elementwise(imp, "mul", [cos, x1], dt), elementwise(imp, "mul", [sin, x2], dt)], dt)
    imag = elementwise(imp, "add", [elementwise(imp, "mul", [sin, x1], dt), elementwise(imp, "mul", [cos, x2], dt)], dt)
    if interleaved:
        pairs = [reshape(imp, v, [b, seq, heads, rd // 2, 1]) for v in (real, imag)]
        turned = reshape(imp, imp.graph.add("concat", pairs, {"axis": 4}), [b, seq, heads, rd])
    else:
        turned = imp.graph.add("concat", (real, imag), {"axis": last})
    if not imp.graph.constraints.prove_equal(size, rd):
        turned = imp.graph.add("concat", (turned, part(work, rd, size)), {"axis": last})
    if rank == 3:
        return reshape(imp, turned, x.shape)
    return imp.graph.add("transpose", (turned,), {"perm": (0, 2, 1, 3)})


# -- spectral --------------------------------------------------------------------------------------------
def _dft_last(imp: OnnxImporter, re: Node, im: Node | None, n: int, inverse: bool, onesided: bool) -> tuple[Node, Node | None]:
    """The DFT of length ``n`` along the last axis as GEMMs with cosine and sine tables (float64
    tables, in the data's dtype): forward e^-i2pi jk/n, inverse e^+i2pi jk/n / n. ``onesided``
    keeps the first n//2 + 1 bins of a forward transform; an inverse one reads such bins (the
    rest mirrored) and gives a real signal, as numpy's irfft."""
    dt = re.dtype
    lead = list(re.shape[:-1])
    rows = product(lead) if lead else 1
    bins = re.shape[-1]

    def table(values: np.ndarray) -> Node:
        return imp.graph.add_constant(values.astype(numpy_dtype(dt)))

    def gemm(x: Node, t: np.ndarray) -> Node:
        flat = reshape(imp, x, [rows, x.shape[-1]])
        return reshape(imp, _matmul(imp, flat, table(t)), [*lead, t.shape[1]])

    if inverse and onesided:  # bins k < n//2 + 1 in, n real samples out
        k = np.arange(_known_dim(bins))[:, None]
        j = np.arange(n)[None, :]
        weight = np.where((k == 0) | (2 * k == n), 1.0, 2.0) / n
        theta = 2 * np.pi * k * j / n
        out = gemm(re, weight * np.cos(theta))
        if im is not None:
            out = elementwise(imp, "sub", [out, gemm(im, weight * np.sin(theta))], dt)
        return out, None
    j = np.arange(n)[:, None]
    k = np.arange(n // 2 + 1 if onesided else n)[None, :]
    theta = 2 * np.pi * j * k / n
    scale = 1.0 / n if inverse else 1.0
    sign = 1.0 if inverse else -1.0
    cos, sin = np.cos(theta) * scale, np.sin(theta) * scale * sign
    out_re, out_im = gemm(re, cos), gemm(re, sin)
    if im is not None:  # (a + ib)(c + id) with c = cos, d = sign * sin
        out_re = elementwise(imp, "sub", [out_re, gemm(im, sin)], dt)
        out_im = elementwise(imp, "add", [out_im, gemm(im, cos)], dt)
    return out_re, out_im


def _complex_parts(imp: OnnxImporter, x: Node) -> tuple[Node, Node | None]:
    """A [..., 1] real or [..., 2] complex tensor as its real and imaginary parts ([...])."""
    width = _known_dim(x.shape[-1])
    if width not in (1, 2):
        raise LoweringError(f"a signal's last dim must be 1 (real) or 2 (complex), not {x.shape[-1]}")
    last = x.tensor_type.rank - 1
    part = [reshape(imp, imp.graph.add("slice", (x, imp.index(i), imp.index(i + 1)), {"axis": last, "step": 1}), list(x.shape[:-1])) for i in range(width)]
    return part[0], part[1] if width == 2 else None


def _as_complex(imp: OnnxImporter, re: Node, im: Node | None) -> Node:
    parts = [reshape(imp, v, [*re.shape, 1]) for v in ((re,) if im is None else (re, im))]
    return parts[0] if im is None else imp.graph.add("concat", parts, {"axis": re.tensor_type.rank})


@onnx_op("DFT")
def _dft(imp: OnnxImporter, node: Any, x: Any, dft_length: Any = None, axis_in: Any = None, axis: int = 1, inverse: int = 0, onesided: int = 0) -> Node:
    x = imp.tensor(x)
    signal_rank = x.tensor_type.rank - 1
    a = _ints(axis_in, "DFT's axis")[0] if axis_in is not None else (axis if imp.opset < 20 else -2)
    a = normalize_axis(a, x.tensor_type.rank, "DFT")
    if a == signal_rank:
        raise LoweringError("DFT along the real/imaginary axis")
    size = _known_dim(x.shape[a])
    if size is None:
        raise LoweringError(f"DFT along axis {a}, whose length ({x.shape[a]}) is not known when the model is compiled")
    n = _ints(dft_length, "DFT's dft_length")[0] if dft_length is not None else (2 * (size - 1) if inverse and onesided else size)
    re, im = _complex_parts(imp, x)
    perm = [i for i in range(signal_rank) if i != a] + [a]
    back = [perm.index(i) for i in range(signal_rank)]
    re = imp.graph.add("transpose", (re,), {"perm": tuple(perm)})
    im = imp.graph.add("transpose", (im,), {"perm": tuple(perm)}) if im is not None else None
    if not (inverse and onesided) and size != n:  # numpy's n: cut or zero-pad the signal
        re, im = (None if v is None else _fit_last(imp, v, n) for v in (re, im))
    elif inverse and onesided and size != n // 2 + 1:
        re, im = (None if v is None else _fit_last(imp, v, n // 2 + 1) for v in (re, im))
    out_re, out_im = _dft_last(imp, re, im, n, bool(inverse), bool(onesided))
    out_re = imp.graph.add("transpose", (out_re,), {"perm": tuple(back)})
    out_im = imp.graph.add("transpose", (out_im,), {"perm": tuple(back)}) if out_im is not None else None
    return _as_complex(imp, out_re, out_im)


def _fit_last(imp: OnnxImporter, v: Node, n: int) -> Node:
    have = _known_dim(v.shape[-1])
    last = v.tensor_type.rank - 1
    if have > n:
        return imp.graph.add("slice", (v, imp.index(0), imp.index(n)), {"axis": last, "step": 1})
    high = [0] * v.tensor_type.rank
    high[-1] = n - have
    return imp.graph.add("pad", (v,), {"low": (0,) * v.tensor_type.rank, "high": tuple(high), "value": 0.0})


@onnx_op("STFT")
def _stft(imp: OnnxImporter, node: Any, signal: Any, frame_step: Any, window: Any = None, frame_length: Any = None, onesided: int = 1) -> Node:
    """Frames of ``frame_length`` every ``frame_step`` samples (a gather with a constant index
    table), windowed, each transformed: [batch, frames, bins, 2]."""
    x = imp.tensor(signal)
    step = _ints(frame_step, "STFT's frame_step")[0]
    win = imp.tensor(window) if window is not None else None
    length = _ints(frame_length, "STFT's frame_length")[0] if frame_length is not None else (_known_dim(win.shape[0]) if win is not None else None)
    total = _known_dim(x.shape[1])
    if length is None or total is None:
        raise LoweringError("STFT needs a frame length and a signal length known when the model is compiled")
    frames = (total - length) // step + 1
    re, im = _complex_parts(imp, x)
    starts = np.arange(frames)[:, None] * step + np.arange(length)[None, :]
    index = imp.graph.add_constant(starts.reshape(-1).astype(np.int64))
    batch = re.shape[0]
    re, im = (None if v is None else reshape(imp, imp.graph.add("index_select", (v, index), {"axis": 1}), [batch, frames, length]) for v in (re, im))
    if win is not None:
        re, im = (None if v is None else elementwise(imp, "mul", [v, convert(imp, win, v.dtype)], v.dtype) for v in (re, im))
    out_re, out_im = _dft_last(imp, re, im, length, False, bool(onesided) and im is None)
    return _as_complex(imp, out_re, out_im)


# -- quantization ----------------------------------------------------------------------------------------
_QUANT_RANGES = {"u8": (0, 255), "i8": (-128, 127), "i16": (-32768, 32767)}


def _per_axis(imp: OnnxImporter, v: Node, x: Node, axis: int, block_size: int) -> Node:
    """A scale or zero point spread over ``x``: one value (per tensor), one per element of ``axis``,
    or (``block_size`` > 0) one per block of that many elements along ``axis``."""
    rank = x.tensor_type.rank
    if v.tensor_type.rank == 0 or (v.tensor_type.rank == 1 and imp.graph.constraints.prove_is_one(v.shape[0]) and not block_size):
        return broadcast_to(imp, reshape(imp, v, []), x.shape)
    a = normalize_axis(axis, rank, "quantization axis")
    if not block_size:
        return imp.graph.add("broadcast_in_dim", (v, *imp.sizes(x.shape)), {"dims": (a,)})
    blocks = v.shape[a]  # [.., n / block, ..] -> each value repeated block times, cut to n
    wide = imp.graph.add("broadcast_in_dim", (v, *imp.sizes([*v.shape[: a + 1], block_size, *v.shape[a + 1 :]])), {"dims": tuple(i if i <= a else i + 1 for i in range(rank))})
    flat = reshape(imp, wide, [*v.shape[:a], as_expr(blocks) * block_size, *v.shape[a + 1 :]])
    return imp.graph.add("slice", (flat, imp.index(0), imp.index(x.shape[a])), {"axis": a, "step": 1})


def _quantize(imp: OnnxImporter, scaled: Node, zero: Node | None, out: str) -> Node:
    """round-half-even(scaled) + zero, saturated to ``out``'s range."""
    if out not in _QUANT_RANGES:
        raise LoweringError(f"quantization to {out} (disc quantizes to {', '.join(_QUANT_RANGES)})")
    q = convert(imp, imp.graph.add("round", (convert(imp, scaled, "f32"),)), "f32")
    if zero is not None:
        q = elementwise(imp, "add", [q, convert(imp, zero, "f32")], "f32")
    lo, hi = _QUANT_RANGES[out]
    q = elementwise(imp, "minimum", [elementwise(imp, "maximum", [q, float(lo)], "f32"), float(hi)], "f32")
    return convert(imp, q, out)


@onnx_op("QuantizeLinear")
def _quantize_linear(imp: OnnxImporter, node: Any, x: Any, scale: Any, zero_point: Any = None, axis: int = 1, saturate: int = 1, block_size: int = 0, output_dtype: int = 0, precision: int = 0) -> Node:
    x = imp.tensor(x)
    zero = imp.tensor(zero_point) if zero_point is not None else None
    out = zero.dtype if zero is not None else ELEM_TYPES.get(output_dtype, "u8") if output_dtype else "u8"
    if output_dtype and ELEM_TYPES.get(output_dtype) != out:
        raise LoweringError(f"QuantizeLinear to element type {output_dtype}, which disc does not run")
    s = _per_axis(imp, imp.tensor(scale), x, axis, block_size)
    work = ELEM_TYPES.get(precision, x.dtype) if precision else x.dtype
    scaled = elementwise(imp, "div", [convert(imp, x, work), convert(imp, s, work)], work)
    return _quantize(imp, scaled, _per_axis(imp, zero, x, axis, block_size) if zero is not None else None, out)


@onnx_op("DequantizeLinear")
def _dequantize_linear(imp: OnnxImporter, node: Any, x: Any, scale: Any, zero_point: Any = None, axis: int = 1, block_size: int = 0, output_dtype: int = 0) -> Node:
    x, s = imp.tensor(x), imp.tensor(scale)
    if x.dtype not in _QUANT_RANGES and x.dtype != "i32":
        raise LoweringError(f"DequantizeLinear of {x.dtype}")
    d = convert(imp, x, "f32")
    if zero_point is not None:
        d = elementwise(imp, "sub", [d, convert(imp, _per_axis(imp, imp.tensor(zero_point), x, axis, block_size), "f32")], "f32")
    out = ELEM_TYPES.get(output_dtype, s.dtype) if output_dtype else s.dtype
    return convert(imp, elementwise(imp, "mul", [d, convert(imp, _per_axis(imp, s, x, axis, block_size), "f32")], "f32"), out)


@onnx_op("DynamicQuantizeLinear")
def _dynamic_quantize_linear(imp: OnnxImporter, node: Any, x: Any) -> list[Node]:
    """uint8 with the scale and zero point that map [min(x, 0), max(x, 0)] onto [0, 255]."""
    x = imp.tensor(x)
    every = list(range(x.tensor_type.rank))
    hi = elementwise(imp, "maximum", [reshape(imp, reduce(imp, x, every, "max", True), []), 0.0], "f32")
    lo = elementwise(imp, "minimum", [reshape(imp, reduce(imp, x, every, "min", True), []), 0.0], "f32")
    span = select(imp, elementwise(imp, "eq", [hi, lo], "f32"), 1.0, elementwise(imp, "sub", [hi, lo], "f32"), "f32")
    scale = elementwise(imp, "div", [span, 255.0], "f32")
    zero = imp.graph.add("round", (elementwise(imp, "minimum", [elementwise(imp, "maximum", [elementwise(imp, "sub", [0.0, elementwise(imp, "div", [lo, scale], "f32")], "f32"), 0.0], "f32"), 255.0], "f32"),))
    y = _quantize(imp, elementwise(imp, "div", [x, scale], "f32"), zero, "u8")
    return [y, convert(imp, scale, x.dtype), convert(imp, zero, "u8")]


def _centred(imp: OnnxImporter, v: Any, zero: Any, axis_of_zero: int) -> Node:
    """An integer operand less its zero point (per tensor, or one per element of ``axis_of_zero``), as float64 (exact)."""
    t = convert(imp, imp.tensor(v), "f64")
    if zero is None:
        return t
    z = imp.tensor(zero)
    z = convert(imp, broadcast_to(imp, reshape(imp, z, []), t.shape) if z.tensor_type.rank == 0 or _known_dim(z.shape[0]) == 1 else imp.graph.add("broadcast_in_dim", (z, *imp.sizes(t.shape)), {"dims": (t.tensor_type.rank + axis_of_zero,)}), "f64")
    return elementwise(imp, "sub", [t, z], "f64")


@onnx_op("MatMulInteger")
def _matmul_integer(imp: OnnxImporter, node: Any, a: Any, b: Any, a_zero_point: Any = None, b_zero_point: Any = None) -> Node:
    """(a - a_zero) @ (b - b_zero) in int32, computed in float64 (exact for 8-bit operands)."""
    return convert(imp, _matmul(imp, _centred(imp, a, a_zero_point, -2), _centred(imp, b, b_zero_point, -1)), "i32")


@onnx_op("QLinearMatMul")
def _qlinear_matmul(imp: OnnxImporter, node: Any, a: Any, a_scale: Any, a_zero: Any, b: Any, b_scale: Any, b_zero: Any, y_scale: Any, y_zero: Any = None) -> Node:
    """The integer product, as MatMulInteger, times a_scale * b_scale / y_scale, requantized."""
    product_ = _matmul(imp, _centred(imp, a, a_zero, -2), _centred(imp, b, b_zero, -1))
    ratio = elementwise(imp, "div", [elementwise(imp, "mul", [imp.tensor(a_scale), imp.tensor(b_scale)], imp.tensor(a_scale).dtype), imp.tensor(y_scale)], imp.tensor(a_scale).dtype)
    scaled = elementwise(imp, "mul", [product_, convert(imp, ratio, "f64")], "f64")
    out = imp.tensor(y_zero).dtype if y_zero is not None else imp.tensor(a).dtype
    return _quantize(imp, scaled, imp.tensor(y_zero) if y_zero is not None else None, out)


def _centred_conv(imp: OnnxImporter, node: Any, x: Any, x_zero: Any, w: Any, w_zero: Any, attrs: dict) -> Node:
    """The convolution of (x - x_zero) by (w - w_zero, one per output channel), in float64 (exact)."""
    cx = _centred(imp, x, x_zero, 0)
    wt = convert(imp, imp.tensor(w), "f64")
    if w_zero is not None:
        z = imp.tensor(w_zero)
        spread = broadcast_to(imp, reshape(imp, z, []), wt.shape) if z.tensor_type.rank == 0 or _known_dim(z.shape[0]) == 1 else imp.graph.add("broadcast_in_dim", (z, *imp.sizes(wt.shape)), {"dims": (0,)})
        wt = elementwise(imp, "sub", [wt, convert(imp, spread, "f64")], "f64")
    return _conv(imp, node, cx, wt, None, **attrs)


@onnx_op("ConvInteger")
def _conv_integer(imp: OnnxImporter, node: Any, x: Any, w: Any, x_zero_point: Any = None, w_zero_point: Any = None, **attrs: Any) -> Node:
    return convert(imp, _centred_conv(imp, node, x, x_zero_point, w, w_zero_point, attrs), "i32")


@onnx_op("QLinearConv")
def _qlinear_conv(imp: OnnxImporter, node: Any, x: Any, x_scale: Any, x_zero: Any, w: Any, w_scale: Any, w_zero: Any, y_scale: Any, y_zero: Any = None, b: Any = None, **attrs: Any) -> Node:
    """The integer convolution plus the int32 bias, times x_scale * w_scale (per output channel) / y_scale, requantized."""
    acc = _centred_conv(imp, node, x, x_zero, w, w_zero, attrs)
    if b is not None:
        acc = elementwise(imp, "add", [acc, imp.graph.add("broadcast_in_dim", (convert(imp, imp.tensor(b), "f64"), *imp.sizes(acc.shape)), {"dims": (1,)})], "f64")
    ws = convert(imp, imp.tensor(w_scale), "f64")
    ws = broadcast_to(imp, reshape(imp, ws, []), acc.shape) if ws.tensor_type.rank == 0 or _known_dim(ws.shape[0]) == 1 else imp.graph.add("broadcast_in_dim", (ws, *imp.sizes(acc.shape)), {"dims": (1,)})
    ratio = elementwise(imp, "div", [elementwise(imp, "mul", [ws, convert(imp, imp.tensor(x_scale), "f64")], "f64"), convert(imp, imp.tensor(y_scale), "f64")], "f64")
    out = imp.tensor(y_zero).dtype if y_zero is not None else imp.tensor(x).dtype
    return _quantize(imp, elementwise(imp, "mul", [acc, ratio], "f64"), imp.tensor(y_zero) if y_zero is not None else None, out)


# -- recurrent layers ------------------------------------------------------------------------------------
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTIVATIONS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
_ACTIVATIONS = {"Tanh": "tanh", "Sigmoid": "sigmoid", "Relu": "relu"}


@onnx_op("RNN", "GRU", "LSTM")
def _recurrent(
    imp: OnnxImporter, node: Any, x: Any, w: Any, r: Any, b: Any = None, sequence_lens: Any = None, initial_h: Any = None, initial_c: Any = None, p: Any = None,
    activations: Sequence[str] | None = None, activation_alpha: Any = None, activation_beta: Any = None, clip: float | None = None,
    direction: str = "forward", hidden_size: int | None = None, layout: int = 0, linear_before_reset: int = 0, input_forget: int = 0,
) -> list[Node]:
    """RNN, GRU and LSTM unrolled over a sequence length known when the model is compiled (batch
    may vary): the input projection for every step in one GEMM, then per step the recurrent GEMM
    and the gates. ``sequence_lens`` holds a finished entry's state and zeroes its outputs."""
    kind = node.op_type
    gates = _GATES[kind]
    x, w, r = imp.tensor(x), imp.tensor(w), imp.tensor(r)
    if layout:
        x = imp.graph.add("transpose", (x,), {"perm": (1, 0, 2)})
    steps = _known_dim(x.shape[0])
    if steps is None:
        raise LoweringError(f"{kind} over a sequence of run-time length ({x.shape[0]}): disc unrolls recurrent layers over a known length")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise LoweringError(f"{kind} direction={direction!r}")
    if input_forget:
        raise LoweringError("LSTM with input_forget")
    dirs = 2 if direction == "bidirectional" else 1
    hidden = hidden_size or _known_dim(r.shape[2])
    names = list(activations) if activations else _DEFAULT_ACTIVATIONS[kind] * dirs
    if len(names) == len(_DEFAULT_ACTIVATIONS[kind]) and dirs == 2:
        names = names * 2
    for name in names:
        if name not in _ACTIVATIONS:
            raise LoweringError(f"{kind} activation {name!r} (disc takes {', '.join(_ACTIVATIONS)})")
    batch = x.shape[1]
    dt = x.dtype
    lens = convert(imp, imp.tensor(sequence_lens), "i64") if sequence_lens is not None else None

    def pick(t: Node, d: int) -> Node:  # direction d of a [dirs, ...] tensor
        return reshape(imp, imp.graph.add("slice", (t, imp.index(d), imp.index(d + 1)), {"axis": 0, "step": 1}), list(t.shape[1:]))

    def cols(t: Node, g: int) -> Node:  # gate g's columns of a [..., gates * hidden] tensor
        return imp.graph.add("slice", (t, imp.index(g * hidden), imp.index((g + 1) * hidden)), {"axis": t.tensor_type.rank - 1, "step": 1})

    def state(v: Any, d: int) -> Node:
        if v is None:
            return broadcast_to(imp, scalar(imp, 0.0, dt), [batch, hidden])
        return pick(imp.tensor(v), d)

    outs, last_h, last_c = [], [], []
    for d in range(dirs):
        act = [_ACTIVATIONS[n] for n in names[d * len(_DEFAULT_ACTIVATIONS[kind]) : (d + 1) * len(_DEFAULT_ACTIVATIONS[kind])]]
        wt = imp.graph.add("transpose", (pick(w, d),), {"perm": (1, 0)})  # [input, gates * hidden]
        rt = imp.graph.add("transpose", (pick(r, d),), {"perm": (1, 0)})
        bias = pick(imp.tensor(b), d) if b is not None else None
        wb = cols_bias = None  # the input and the recurrent halves of B
        if bias is not None:
            wb = imp.graph.add("slice", (bias, imp.index(0), imp.index(gates * hidden)), {"axis": 0, "step": 1})
            cols_bias = imp.graph.add("slice", (bias, imp.index(gates * hidden), imp.index(2 * gates * hidden)), {"axis": 0, "step": 1})
        flat = reshape(imp, x, [as_expr(x.shape[0]) * batch, x.shape[2]])
        projected = _matmul(imp, flat, wt)
        if wb is not None:  # (the recurrent bias Rb goes with the recurrent GEMM: GRU's reset gate scales it)
            projected = elementwise(imp, "add", [projected, wb], dt)
        projected = reshape(imp, projected, [x.shape[0], batch, gates * hidden])
        peep = pick(imp.tensor(p), d) if p is not None else None
        h, c = state(initial_h, d), state(initial_c, d)
        backwards = direction == "reverse" or d == 1
        order = reversed(range(steps)) if backwards else range(steps)
        ys: dict[int, Node] = {}
        for t in order:
            xt = reshape(imp, imp.graph.add("slice", (projected, imp.index(t), imp.index(t + 1)), {"axis": 0, "step": 1}), [batch, gates * hidden])
            if kind == "GRU":
                hr = _matmul(imp, h, rt)
                if cols_bias is not None:
                    hr = elementwise(imp, "add", [hr, cols_bias], dt)
                z = _gate(imp, act[0], elementwise(imp, "add", [cols(xt, 0), cols(hr, 0)], dt), clip)
                rr = _gate(imp, act[0], elementwise(imp, "add", [cols(xt, 1), cols(hr, 1)], dt), clip)
                if linear_before_reset:
                    cand_in = elementwise(imp, "add", [cols(xt, 2), elementwise(imp, "mul", [rr, cols(hr, 2)], dt)], dt)
                else:
                    rh = _matmul(imp, elementwise(imp, "mul", [rr, h], dt), cols(rt, 2))
                    if cols_bias is not None:
                        rh = elementwise(imp, "add", [rh, cols(cols_bias, 2)], dt)
                    cand_in = elementwise(imp, "add", [cols(xt, 2), rh], dt)
                cand = _gate(imp, act[1], cand_in, clip)
                new_h = elementwise(imp, "add", [elementwise(imp, "mul", [elementwise(imp, "sub", [1.0, z], dt), cand], dt), elementwise(imp, "mul", [z, h], dt)], dt)
                new_c = c
            else:
                pre = elementwise(imp, "add", [xt, _matmul(imp, h, rt)], dt)
                if cols_bias is not None:
                    pre = elementwise(imp, "add", [pre, cols_bias], dt)
                if kind == "RNN":
                    new_h, new_c = _gate(imp, act[0], pre, clip), c
                else:  # gates i, o, f, c; peepholes i, o, f

                    def peeped(g: int, k: int, cell: Node) -> Node:
                        v = cols(pre, g)
                        return v if peep is None else elementwise(imp, "add", [v, elementwise(imp, "mul", [cols(peep, k), cell], dt)], dt)

                    i = _gate(imp, act[0], peeped(0, 0, c), clip)
                    f = _gate(imp, act[0], peeped(2, 2, c), clip)
                    cand = _gate(imp, act[1], cols(pre, 3), clip)
                    new_c = elementwise(imp, "add", [elementwise(imp, "mul", [f, c], dt), elementwise(imp, "mul", [i, cand], dt)], dt)
                    o = _gate(imp, act[0], peeped(1, 1, new_c), clip)
                    new_h = elementwise(imp, "mul", [o, imp.graph.add(act[2], (new_c,))], dt)
            if lens is not None:  # an entry past its length keeps its state and outputs zeros
                live = reshape(imp, elementwise(imp, "gt", [lens, t], "i64"), [batch, 1])
                new_h, new_c = select(imp, live, new_h, h, dt), select(imp, live, new_c, c, dt)
                ys[t] = select(imp, live, new_h, 0.0, dt)
            else:
                ys[t] = new_h
            h, c = new_h, new_c
        outs.append(imp.graph.add("concat", [reshape(imp, ys[t], [1, 1, batch, hidden]) for t in range(steps)], {"axis": 0}) if steps > 1 else reshape(imp, ys[0], [1, 1, batch, hidden]))
        last_h.append(reshape(imp, h, [1, batch, hidden]))
        last_c.append(reshape(imp, c, [1, batch, hidden]))

    def joined(parts: list[Node], axis: int) -> Node:
        return parts[0] if len(parts) == 1 else imp.graph.add("concat", parts, {"axis": axis})

    y, yh, yc = joined(outs, 1), joined(last_h, 0), joined(last_c, 0)
    if layout:
        y = imp.graph.add("transpose", (y,), {"perm": (2, 0, 1, 3)})
        yh, yc = (imp.graph.add("transpose", (v,), {"perm": (1, 0, 2)}) for v in (yh, yc))
    return [y, yh, yc] if kind == "LSTM" else [y, yh]


def _gate(imp: OnnxImporter, op: str, x: Node, clip: float | None) -> Node:
    if clip is not None:
        x = elementwise(imp, "minimum", [elementwise(imp, "maximum", [x, -clip], x.dtype), clip], x.dtype)
    return imp.graph.add(op, (x,))


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
    _require_divisible(imp, channels, num_groups, f"GroupNormalization: channels (dim 1) must be divisible by num_groups={num_groups}")
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
    n = _known_dim(x.shape[axis])
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
            _require_divisible(imp, d, b, f"SpaceToDepth: dim {i} must be divisible by blocksize {b}")
        if mode not in ("DCR", "CRD"):
            raise LoweringError(f"SpaceToDepth mode {mode!r} (ONNX allows DCR and CRD)")
        blocks = reshape(imp, x, [n, c, h // b, b, w // b, b])
        moved = imp.graph.add("transpose", (blocks,), {"perm": (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)})
        return reshape(imp, moved, [n, c * b * b, h // b, w // b])
    _require_divisible(imp, c, b * b, f"DepthToSpace: channels (dim 1) must be divisible by blocksize^2 = {b * b}")
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
    positions = imp.graph.add("broadcast_in_dim", (imp.graph.add("iota", (imp.index(size),), {"dtype": "i64"}), *imp.sizes(shape)), {"dims": (a,)})
    spread = imp.graph.add("broadcast_in_dim", (idx, *imp.sizes(shape)), {"dims": tuple(i for i in range(rank) if i != a)})
    v = imp.tensor(values)
    off, on = (reshape(imp, imp.graph.add("slice", (v, imp.index(i), imp.index(i + 1)), {"axis": 0, "step": 1}), []) for i in (0, 1))
    return select(imp, imp.graph.add("eq", (positions, spread)), on, off, v.dtype)


@onnx_op("ReverseSequence")
def _reverse_sequence(imp: OnnxImporter, node: Any, x: Any, lens: Any, batch_axis: int = 1, time_axis: int = 0) -> Node:
    """Each batch entry's first ``lens[b]`` time steps reversed, the rest kept: a gather along
    time at ``lens[b] - 1 - t`` for t < lens[b], else t."""
    x = imp.tensor(x)
    shape = x.shape
    t = imp.graph.add("broadcast_in_dim", (imp.graph.add("iota", (imp.index(shape[time_axis]),), {"dtype": "i64"}), *imp.sizes(shape)), {"dims": (time_axis,)})
    n = imp.graph.add("broadcast_in_dim", (convert(imp, imp.tensor(lens), "i64"), *imp.sizes(shape)), {"dims": (batch_axis,)})
    back = elementwise(imp, "sub", [elementwise(imp, "sub", [n, 1], "i64"), t], "i64")
    index = select(imp, imp.graph.add("lt", (t, n)), back, t, "i64")
    return imp.graph.add("gather", (x, index), {"axis": time_axis})


@onnx_op("GatherND")
def _gather_nd(imp: OnnxImporter, node: Any, x: Any, indices: Any, batch_dims: int = 0) -> Node:
    """Slices of ``x`` at the index tuples of ``indices``' last axis, as one index_select on ``x``
    with its batch and indexed dims flattened: the flat index is the batch position and the
    tuple (negatives counted from the end) combined by those dims' strides."""
    data, index = imp.tensor(x), convert(imp, imp.tensor(indices), "i64")
    depth = _known_dim(index.shape[-1])
    if depth is None:
        raise LoweringError(f"GatherND: the index tuples' length (the last dim of indices, {index.shape[-1]}) must be known when the model is compiled")
    lead = batch_dims + depth
    if lead > data.tensor_type.rank:
        raise LoweringError(f"GatherND: batch_dims {batch_dims} + tuple length {depth} exceed the data's rank {data.tensor_type.rank}")
    spots = list(index.shape[:-1])
    flat = None
    for i in range(lead):
        if i < batch_dims:
            part = imp.graph.add("broadcast_in_dim", (imp.graph.add("iota", (imp.index(data.shape[i]),), {"dtype": "i64"}), *imp.sizes(spots)), {"dims": (i,)})
        else:
            j = i - batch_dims
            part = reshape(imp, imp.graph.add("slice", (index, imp.index(j), imp.index(j + 1)), {"axis": index.tensor_type.rank - 1, "step": 1}), spots)
            size = imp.graph.add("broadcast_in_dim", (imp.graph.add("index_to_tensor", (imp.index(data.shape[i]),), {"dtype": "i64"}), *imp.sizes(spots)), {"dims": ()})
            part = select(imp, elementwise(imp, "lt", [part, 0], "i64"), elementwise(imp, "add", [part, size], "i64"), part, "i64")
        if flat is None:
            flat = part
        else:
            size = imp.graph.add("broadcast_in_dim", (imp.graph.add("index_to_tensor", (imp.index(data.shape[i]),), {"dtype": "i64"}), *imp.sizes(spots)), {"dims": ()})
            flat = elementwise(imp, "add", [elementwise(imp, "mul", [flat, size], "i64"), part], "i64")
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


def _wrapped_index(imp: OnnxImporter, index: Node, size: DimLike) -> Node:
    """A negative index counted from the end of a dim of ``size``."""
    index = convert(imp, index, "i64")
    n = imp.graph.add("index_to_tensor", (imp.index(size),), {"dtype": "i64"})
    return select(imp, elementwise(imp, "lt", [index, 0], "i64"), elementwise(imp, "add", [index, n], "i64"), index, "i64")


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
    depth = _known_dim(index.shape[-1])
    if depth is None or depth > data.tensor_type.rank:
        raise LoweringError(f"ScatterND: the index tuples' length ({index.shape[-1]}) must be known and at most the data's rank {data.tensor_type.rank}")
    spots = list(index.shape[:-1])
    rest = list(data.shape[depth:])
    flat = None
    for i in range(depth):
        part = reshape(imp, imp.graph.add("slice", (index, imp.index(i), imp.index(i + 1)), {"axis": index.tensor_type.rank - 1, "step": 1}), spots)
        part = _wrapped_index(imp, part, data.shape[i])
        if flat is None:
            flat = part
        else:
            size = imp.graph.add("index_to_tensor", (imp.index(data.shape[i]),), {"dtype": "i64"})
            flat = elementwise(imp, "add", [elementwise(imp, "mul", [flat, size], "i64"), part], "i64")
    count = product(spots)
    rows = reshape(imp, data, [product(data.shape[:depth]), *rest])
    values = reshape(imp, upd, [count, *rest])
    where = imp.graph.add("broadcast_in_dim", (reshape(imp, flat, [count]), *imp.sizes(values.shape)), {"dims": (0,)})
    return reshape(imp, _scatter(imp, node, rows, where, values, 0, reduction), data.shape)


@onnx_op("Expand")
def _expand(imp: OnnxImporter, node: Any, x: Any, shape: Any) -> Node:
    x = imp.tensor(x)
    target = _dims_of(shape, "Expand's shape")
    return broadcast_to(imp, x, broadcast_shapes(imp, [x.shape, target]))


@onnx_op("ConstantOfShape")
def _constant_of_shape(imp: OnnxImporter, node: Any, shape: Any, value: Any = None) -> Node:
    fill = value if value is not None else np.zeros((1,), np.float32)
    dims = _dims_of(shape, "ConstantOfShape's shape")
    sizes = [_known_dim(d) for d in dims]
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


# -- convolution and pooling -----------------------------------------------------------------------------
def _explicit_pads(imp: OnnxImporter, node: Any, spatial: Sequence[DimLike], kernel: Sequence[int], strides: Any, dilations: Any, pads: Any, auto_pad: str) -> list[int]:
    """The begin and end pads (ONNX's ``pads`` layout) that ``auto_pad`` asks for. SAME pads so
    that out = ceil(in / stride): a total of (out - 1) * stride + extent - in, the odd one at the
    end (SAME_UPPER) or the beginning (SAME_LOWER). With stride 1 that is extent - 1 for any in;
    with a larger stride it depends on the dim, which must then be known."""
    n = len(kernel)
    if auto_pad in ("NOTSET", "VALID"):
        return list(pads) if pads is not None and auto_pad == "NOTSET" else [0] * (2 * n)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise LoweringError(f"{node.op_type} with auto_pad={auto_pad!r} (ONNX allows NOTSET, VALID, SAME_UPPER, SAME_LOWER)")
    strides, dilations = list(strides or [1] * n), list(dilations or [1] * n)
    low, high = [], []
    for i in range(n):
        extent = (kernel[i] - 1) * dilations[i] + 1
        if strides[i] == 1:
            total = extent - 1
        else:
            size = _known_dim(spatial[i])
            if size is None:
                raise LoweringError(f"{node.op_type} with auto_pad={auto_pad} and stride {strides[i]} on spatial dim {i} ({spatial[i]}), which is not known when the model is compiled")
            total = max((-(-size // strides[i]) - 1) * strides[i] + extent - size, 0)
        small = total // 2
        low.append(small if auto_pad == "SAME_UPPER" else total - small)
        high.append(total - low[-1])
    return low + high


def _require_divisible(imp: OnnxImporter, d: DimLike, k: int, why: str) -> None:
    """``d % k == 0``: proven now, or checked when the program runs (a known dim that fails is an
    error now)."""
    c = imp.graph.constraints
    if c.prove_divisible(d, k):
        return
    if _known_dim(d) is not None:
        raise LoweringError(f"{why}; it is {d}")
    c.assume(d, "%", k, why)


def _known_dim(d: DimLike) -> int | None:
    if isinstance(d, int):
        return d
    e = as_expr(d)
    return e.const_value if e.is_const else None


@onnx_op("Conv")
def _conv(imp: OnnxImporter, node: Any, x: Any, w: Any, b: Any = None, dilations: Any = None, group: int = 1, kernel_shape: Any = None, pads: Any = None, strides: Any = None, auto_pad: str = "NOTSET") -> Node:
    x, w = imp.tensor(x), imp.tensor(w)
    n = w.tensor_type.rank - 2
    kernel = [_known_dim(d) for d in w.shape[2:]]
    if None in kernel:
        raise LoweringError(f"Conv with a kernel of run-time size {w.shape[2:]}")
    pads = _explicit_pads(imp, node, x.shape[2:], kernel, strides, dilations, pads, auto_pad)
    if pads[:n] != pads[n:]:  # the convolution pads symmetrically: the uneven part goes in a pad first
        extra_low = [max(lo - hi, 0) for lo, hi in zip(pads[:n], pads[n:])]
        extra_high = [max(hi - lo, 0) for lo, hi in zip(pads[:n], pads[n:])]
        x = imp.graph.add("pad", (x,), {"low": (0, 0, *extra_low), "high": (0, 0, *extra_high), "value": 0.0})
        pads = [min(lo, hi) for lo, hi in zip(pads[:n], pads[n:])] * 2
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



@onnx_op("ConvTranspose")
def _conv_transpose(
    imp: OnnxImporter, node: Any, x: Any, w: Any, b: Any = None, auto_pad: str = "NOTSET", dilations: Any = None, group: int = 1, kernel_shape: Any = None,
    output_padding: Any = None, output_shape: Any = None, pads: Any = None, strides: Any = None,
) -> Node:
    """The transposed convolution at its full size, (in - 1) * stride + extent, then cut to ONNX's
    output: ``pads`` removed from each end, the end extended by ``output_padding``. SAME pads
    make out = in * stride (the odd one at the end for SAME_UPPER). An ``output_shape`` given with
    explicit pads keeps the full result's start and cuts or extends its end, as ONNX's reference."""
    x, w = imp.tensor(x), imp.tensor(w)
    n = w.tensor_type.rank - 2
    kernel = [_known_dim(d) for d in w.shape[2:]]
    if None in kernel:
        raise LoweringError(f"ConvTranspose with a kernel of run-time size {w.shape[2:]}")
    strides, dilations = list(strides or [1] * n), list(dilations or [1] * n)
    extra = list(output_padding or [0] * n)[:n]
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    fit = None
    if pads is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        low, high = [], []
        for i in range(n):
            if output_shape is not None:
                size = _known_dim(x.shape[2 + i])
                if size is None:
                    raise LoweringError(f"ConvTranspose with output_shape and auto_pad={auto_pad} on spatial dim {i} ({x.shape[2 + i]}), which is not known when the model is compiled")
                total = strides[i] * (size - 1) + extra[i] + extents[i] - int(output_shape[i])
            else:  # out = in * stride: the total does not depend on in
                total = extra[i] + extents[i] - strides[i]
            small = total // 2
            low.append(small if auto_pad == "SAME_UPPER" else total - small)
            high.append(total - low[-1])
    elif auto_pad in ("NOTSET", "VALID"):
        pads = list(pads) if pads is not None and auto_pad == "NOTSET" else [0] * (2 * n)
        low, high = pads[:n], pads[n:]
        fit = [int(v) for v in output_shape] if output_shape is not None else None
    else:
        raise LoweringError(f"ConvTranspose with auto_pad={auto_pad!r} (ONNX allows NOTSET, VALID, SAME_UPPER, SAME_LOWER)")
    # The op itself trims ``both`` from each end; output_padding re-extends the end into the full
    # result (zeros only past its end), so the end's trim is the pad less output_padding.
    both = [max(min(lo, hi - e), 0) for lo, hi, e in zip(low, high, extra)]
    attrs = {"stride": tuple(strides), "padding": tuple(both), "dilation": tuple(dilations), "groups": int(group), "transposed": True, "output_padding": (0,) * n}
    out = imp.graph.add("convolution", (x, w), attrs)
    for i in range(n):
        axis = 2 + i
        size = as_expr(out.shape[axis])
        lo = low[i] - both[i]  # > 0: cut from the start; < 0: zeros added there
        if fit is None:
            hi = high[i] - both[i] - extra[i]  # the same at the end
        else:
            cut = _known_dim(size - lo - fit[i])
            if cut is None:
                raise LoweringError(f"ConvTranspose with output_shape on spatial dim {i}, whose input size ({x.shape[axis]}) is not known when the model is compiled")
            hi = cut
        if lo > 0 or hi > 0:
            start, stop = max(lo, 0), size - max(hi, 0)
            out = imp.graph.add("slice", (out, imp.index(start), imp.index(stop)), {"axis": axis, "step": 1})
        if lo < 0 or hi < 0:
            low_pad, high_pad = [0] * (n + 2), [0] * (n + 2)
            low_pad[axis], high_pad[axis] = max(-lo, 0), max(-hi, 0)
            out = imp.graph.add("pad", (out,), {"low": tuple(low_pad), "high": tuple(high_pad), "value": 0.0})
    if b is None:
        return out
    return imp.graph.add("add", (out, imp.graph.add("broadcast_in_dim", (imp.tensor(b), *imp.sizes(out.shape)), {"dims": (1,)})))


# -- resize ---------------------------------------------------------------------------------------------
_RESIZE_MODES = {"nearest", "linear", "cubic"}
_COORDINATE_MODES = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"}
_NEAREST_MODES = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}


def _resized_dim(node: Any, size: DimLike, scale: float) -> DimLike:
    """floor(size * scale), as ONNX computes an output size from a scale."""
    n = _known_dim(size)
    if n is not None:
        return int(scale * n)
    if float(scale).is_integer():
        return as_expr(size) * int(scale)
    if (1.0 / scale).is_integer():
        return as_expr(size) // int(1.0 / scale)
    raise LoweringError(f"{node.op_type}: scale {scale} of a dim ({size}) not known when the model is compiled (only whole multiples and 1/k scales stay symbolic)")


@onnx_op("Resize", "Upsample")
def _resize(
    imp: OnnxImporter, node: Any, x: Any, roi: Any = None, scales: Any = None, sizes: Any = None, mode: str = "nearest", coordinate_transformation_mode: str = "half_pixel",
    nearest_mode: str = "round_prefer_floor", cubic_coeff_a: float = -0.75, exclude_outside: int = 0, extrapolation_value: float = 0.0, antialias: int = 0,
    axes: Any = None, keep_aspect_ratio_policy: str = "stretch",
) -> Node:
    """Resize as one pass per resized axis, innermost first (ONNX's reference recursion): each
    output position's source coordinate (a float64 vector over the axis), then the nearest
    source element, or 2 (linear) or 4 (cubic) neighbours clamped to the edge, gathered and
    weighted. tf_crop_and_resize puts ``extrapolation_value`` where the coordinate leaves the input."""
    if node.op_type == "Upsample":  # (opset 9: Upsample(X, scales), asymmetric coordinates)
        roi, scales, coordinate_transformation_mode = None, roi, "asymmetric"
        mode = {"bilinear": "linear"}.get(mode, mode)
    for what, value, allowed in (("mode", mode, _RESIZE_MODES), ("coordinate_transformation_mode", coordinate_transformation_mode, _COORDINATE_MODES), ("nearest_mode", nearest_mode, _NEAREST_MODES)):
        if value not in allowed:
            raise LoweringError(f"Resize {what}={value!r} (ONNX allows {', '.join(sorted(allowed))})")
    if imp.opset < 11 and node.op_type == "Resize":
        coordinate_transformation_mode = "asymmetric"  # opset 10's Resize(X, scales)
        scales, roi = roi, None
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    chosen = [normalize_axis(a, rank, "Resize") for a in axes] if axes is not None else list(range(rank))
    if mode != "nearest" and x.dtype not in FLOAT_DTYPES:
        raise LoweringError(f"Resize mode {mode!r} on {x.dtype} data (disc interpolates floats)")

    def known_floats(v: Any, what: str) -> list[float] | None:
        if v is None:
            return None
        k = _known(v)
        if k is None and isinstance(v, Node) and v.op == "input":
            raise NeedsValue(f"Resize's {what}", v.name)
        if k is None:
            raise LoweringError(f"Resize's {what} must be known when the model is compiled (a constant), not computed at run time")
        return [float(f) for f in np.asarray(k, np.float64).reshape(-1)] or None

    scale_list, size_list = known_floats(scales, "scales"), known_floats(sizes, "sizes")
    if (scale_list is None) == (size_list is None):
        raise LoweringError("Resize takes exactly one of scales and sizes")
    ins = [x.shape[a] for a in chosen]
    if size_list is not None:
        outs: list[DimLike] = [int(v) for v in size_list]
        if keep_aspect_ratio_policy == "stretch":
            ratios: list[Any] = [None] * len(chosen)  # out / in, computed where the dims are known
        else:
            known_in = [_known_dim(d) for d in ins]
            if None in known_in:
                raise LoweringError(f"Resize keep_aspect_ratio_policy={keep_aspect_ratio_policy!r} on dims {ins} not known when the model is compiled")
            picks = [o / i for o, i in zip(outs, known_in)]
            one = min(picks) if keep_aspect_ratio_policy == "not_larger" else max(picks)
            ratios = [one] * len(chosen)
            outs = [int(np.floor(one * i + 0.5)) for i in known_in]
    else:
        ratios = list(scale_list)
        outs = [_resized_dim(node, d, r) for d, r in zip(ins, ratios)]
    if len(outs) != len(chosen):
        raise LoweringError(f"Resize: {len(outs)} scales or sizes for {len(chosen)} axes")
    roi_list = known_floats(roi, "roi") if coordinate_transformation_mode == "tf_crop_and_resize" else None
    if antialias and mode != "nearest" and any(r is None or r < 1 for r in ratios):
        raise LoweringError("Resize with antialias when downsampling")

    out = x
    for j in reversed(range(len(chosen))):
        a, n_in, n_out, ratio = chosen[j], ins[j], outs[j], ratios[j]
        crop = (roi_list[j], roi_list[j + len(chosen)]) if roi_list is not None else None
        if crop is None and ratio in (None, 1.0) and imp.graph.constraints.prove_equal(n_in, n_out):
            continue  # the identity on this axis, in every coordinate mode but cropping
        out = _resize_axis(imp, out, a, n_in, n_out, ratio, mode, coordinate_transformation_mode, nearest_mode, cubic_coeff_a, bool(exclude_outside), extrapolation_value, crop)
    return out


def _resize_axis(imp: OnnxImporter, x: Node, axis: int, n_in: DimLike, n_out: DimLike, ratio: float | None, mode: str, coords: str, nearest_mode: str, a: float, exclude_outside: bool, extrapolation: float, crop: tuple[float, float] | None) -> Node:
    def f64(v: Any) -> Node:
        return convert(imp, imp.graph.add("index_to_tensor", (imp.index(v),), {"dtype": "i64"}), "f64") if not isinstance(v, float) else scalar(imp, v, "f64")

    def op(name: str, *xs: Any) -> Node:
        return elementwise(imp, name, list(xs), "f64")

    o = convert(imp, imp.graph.add("iota", (imp.index(n_out),), {"dtype": "i64"}), "f64")
    size_in, size_out = f64(n_in), f64(n_out)
    scale = scalar(imp, ratio, "f64") if ratio is not None else op("div", size_out, size_in)
    width = op("mul", scale, size_in)  # the output width as a float (not the integer size)
    centre = op("sub", op("div", op("add", o, 0.5), scale), 0.5)
    if coords == "half_pixel":
        pos = centre
    elif coords == "half_pixel_symmetric":
        half = op("div", size_in, 2.0)
        pos = op("add", op("mul", half, op("sub", 1.0, op("div", size_out, width))), centre)
    elif coords == "pytorch_half_pixel":
        pos = select(imp, op("eq", width, 1.0), -0.5, centre, "f64")
    elif coords == "asymmetric":
        pos = op("div", o, scale)
    elif coords == "align_corners":
        pos = select(imp, op("eq", width, 1.0), 0.0, op("div", op("mul", o, op("sub", size_in, 1.0)), op("sub", width, 1.0)), "f64")
    else:
        start, end = crop
        span = op("sub", size_in, 1.0)
        single = op("add", op("mul", (end - start) / 2, span), op("mul", start, span))
        spread = op("add", op("div", op("mul", op("mul", o, end - start), span), op("sub", width, 1.0)), op("mul", start, span))
        pos = select(imp, op("eq", width, 1.0), single, spread, "f64")

    last = imp.graph.add("index_to_tensor", (imp.index(as_expr(n_in) - 1),), {"dtype": "i64"})

    def clamped(index: Node) -> Node:
        return elementwise(imp, "minimum", [elementwise(imp, "maximum", [index, 0], "i64"), last], "i64")

    def along(v: Node, like: Node) -> Node:
        return imp.graph.add("broadcast_in_dim", (v, *imp.sizes(like.shape)), {"dims": (axis,)})

    floor = imp.graph.add("floor", (pos,))
    if mode == "nearest":
        # An integral coordinate picks itself; otherwise the rounding nearest_mode names.
        rounded = {"round_prefer_floor": lambda: imp.graph.add("ceil", (op("sub", pos, 0.5),)), "round_prefer_ceil": lambda: imp.graph.add("floor", (op("add", pos, 0.5),)), "floor": lambda: floor, "ceil": lambda: imp.graph.add("ceil", (pos,))}[nearest_mode]()
        rounded = select(imp, op("eq", pos, floor), pos, rounded, "f64")
        out = imp.graph.add("index_select", (x, clamped(convert(imp, rounded, "i64"))), {"axis": axis})
    else:
        r = op("sub", pos, floor)
        base = convert(imp, floor, "i64")
        if mode == "linear":
            offsets, weights = [0, 1], [op("sub", 1.0, r), r]
        else:
            def cubic(t: Node) -> Node:  # Keys' kernel at distance t (|t| <= 2)
                near = op("add", op("mul", op("mul", op("sub", op("mul", t, a + 2), a + 3), t), t), 1.0)
                far = op("sub", op("mul", op("add", op("mul", op("sub", op("mul", t, a), 5 * a), t), 8 * a), t), 4 * a)
                return select(imp, op("le", t, 1.0), near, far, "f64")

            offsets = [-1, 0, 1, 2]
            weights = [cubic(op("add", r, 1.0)), cubic(r), cubic(op("sub", 1.0, r)), cubic(op("sub", 2.0, r))]
        indices = [elementwise(imp, "add", [base, k], "i64") for k in offsets]
        if exclude_outside:
            inside = [convert(imp, elementwise(imp, "logical_and", [elementwise(imp, "ge", [i, 0], "i64"), elementwise(imp, "le", [i, last], "i64")], "i1"), "f64") for i in indices]
            weights = [op("mul", w, m) for w, m in zip(weights, inside)]
            total = weights[0]
            for w in weights[1:]:
                total = op("add", total, w)
            weights = [op("div", w, total) for w in weights]
        out = None
        for i, w in zip(indices, weights):
            tap = imp.graph.add("index_select", (x, clamped(i)), {"axis": axis})
            term = elementwise(imp, "mul", [tap, along(convert(imp, w, x.dtype), tap)], x.dtype)
            out = term if out is None else elementwise(imp, "add", [out, term], x.dtype)
    if crop is not None:
        outside = elementwise(imp, "logical_or", [op("lt", pos, 0.0), op("gt", pos, op("sub", size_in, 1.0))], "i1")
        out = select(imp, along(outside, out), extrapolation, out, out.dtype)
    return out


# -- pooling ---------------------------------------------------------------------------------------------
def _pool_attrs(imp: OnnxImporter, node: Any, x: Node, kernel_shape: Sequence[int], strides: Any, pads: Any, dilations: Any, auto_pad: str) -> dict:
    n = len(kernel_shape)
    rank = x.tensor_type.rank
    lead = rank - n
    pads = _explicit_pads(imp, node, x.shape[lead:], kernel_shape, strides, dilations, pads, auto_pad)
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
    attrs = _pool_attrs(imp, node, x, kernel_shape, strides, pads, dilations, auto_pad)
    return imp.graph.add("reduce_window", (x,), {"kind": "max", "ceil_mode": bool(ceil_mode), **attrs})


@onnx_op("AveragePool")
def _avg_pool(imp: OnnxImporter, node: Any, x: Any, kernel_shape: Sequence[int] = (), strides: Any = None, pads: Any = None, dilations: Any = None, ceil_mode: int = 0, auto_pad: str = "NOTSET", count_include_pad: int = 0) -> Node:
    x = imp.tensor(x)
    attrs = _pool_attrs(imp, node, x, kernel_shape, strides, pads, dilations, auto_pad)
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


@onnx_op("LpPool")
def _lp_pool(imp: OnnxImporter, node: Any, x: Any, kernel_shape: Sequence[int] = (), p: int = 2, strides: Any = None, pads: Any = None, dilations: Any = None, ceil_mode: int = 0, auto_pad: str = "NOTSET") -> Node:
    """(sum of |x|^p over the window)^(1/p); padding adds zeros, which add nothing."""
    x = imp.tensor(x)
    attrs = _pool_attrs(imp, node, x, kernel_shape, strides, pads, dilations, auto_pad)
    powered = elementwise(imp, "mul", [x, x], x.dtype) if p == 2 else elementwise(imp, "pow", [imp.graph.add("abs", (x,)), float(p)], x.dtype)
    total = imp.graph.add("reduce_window", (powered,), {"kind": "sum", "ceil_mode": bool(ceil_mode), **attrs})
    return imp.graph.add("sqrt", (total,)) if p == 2 else elementwise(imp, "pow", [total, 1.0 / p], x.dtype)


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


@onnx_op("CumProd")
def _cumprod(imp: OnnxImporter, node: Any, x: Any, axis: Any, exclusive: int = 0, reverse: int = 0) -> Node:
    """Running products along ``axis`` by doubling: after the round with shift d each element
    holds the product of the 2d elements ending at it (ones shifted in), so a known length n
    takes ceil(log2 n) rounds."""
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    a = normalize_axis(_ints(axis, "CumProd's axis")[0], rank, "CumProd")
    n = _known_dim(x.shape[a])
    if n is None:
        raise LoweringError(f"CumProd along axis {a}, whose length ({x.shape[a]}) is not known when the model is compiled")
    one = 1.0 if x.dtype in FLOAT_DTYPES else 1

    def shifted(t: Node, d: int) -> Node:
        low, high = [0] * rank, [0] * rank
        low[a], high[a] = d, -d
        return imp.graph.add("pad", (t,), {"low": tuple(low), "high": tuple(high), "value": one})

    if reverse:
        x = flip(imp, x, a)
    if exclusive and n:
        x = shifted(x, 1)
    d = 1
    while d < n:
        x = elementwise(imp, "mul", [x, shifted(x, d)], x.dtype)
        d *= 2
    return flip(imp, x, a) if reverse else x


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
        if _known_dim(n) is not None:
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
        have = _known_dim(x.shape[a])
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


@onnx_op("HannWindow", "HammingWindow", "BlackmanWindow")
def _window(imp: OnnxImporter, node: Any, size: Any, output_datatype: int = 1, periodic: int = 1) -> np.ndarray:
    """The window for a size known when the model is compiled (a constant or the caller's value),
    computed as ONNX defines it: n over N (periodic) or N - 1 (symmetric)."""
    n = _ints(size, f"{node.op_type}'s size")[0]
    out = ELEM_TYPES.get(output_datatype)
    if out is None or out == "bf16":
        raise LoweringError(f"{node.op_type} to element type {output_datatype}")
    k = np.arange(n, dtype=np.float64)
    span = n if periodic else n - 1
    if node.op_type == "HannWindow":
        w = np.sin(k * np.pi / span) ** 2
    elif node.op_type == "HammingWindow":
        w = 25.0 / 46.0 - np.cos(k * np.pi * 2 / span) * (1 - 25.0 / 46.0)
    else:
        w = 0.42 - 0.5 * np.cos(k * np.pi * 2 / span) + 0.08 * np.cos(k * np.pi * 4 / span)
    return w.astype(numpy_dtype(out))


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


TOPK_UNROLLED = 64  # TopK runs as k selections; a larger k is refused rather than unrolled


@onnx_op("TopK")
def _top_k(imp: OnnxImporter, node: Any, x: Any, k: Any, axis: int = -1, largest: int = 1, sorted: int = 1) -> list[Node]:
    """The k largest (or smallest) elements along ``axis`` in order, ties by the lower index, and
    their indices: k rounds that each take the best element not taken yet (NaN counts as the
    largest, as in PyTorch)."""
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    a = normalize_axis(axis, rank, "TopK")
    count = _ints(k, "TopK's k")[0]
    if count > TOPK_UNROLLED:
        raise LoweringError(f"TopK with k={count}: disc unrolls TopK as k selections, up to k={TOPK_UNROLLED}")
    c = imp.graph.constraints
    if not c.prove_ge(x.shape[a], count):
        if _known_dim(x.shape[a]) is not None:
            raise LoweringError(f"TopK: k={count} is larger than axis {a} ({x.shape[a]})")
        c.assume(x.shape[a], ">=", count, f"TopK: axis {a} must have at least k={count} elements")
    if count == 0:
        raise LoweringError("TopK with k=0")
    floats = x.dtype in FLOAT_DTYPES
    positions = imp.graph.add("broadcast_in_dim", (imp.graph.add("iota", (imp.index(x.shape[a]),), {"dtype": "i64"}), *imp.sizes(x.shape)), {"dims": (a,)})
    taken = broadcast_to(imp, scalar(imp, False, "i1"), x.shape)
    values, indices = [], []
    worst = (-np.inf if largest else np.inf) if floats else (np.iinfo(numpy_dtype(x.dtype)).min if largest else np.iinfo(numpy_dtype(x.dtype)).max)
    for _ in range(count):
        open_ = select(imp, taken, worst, x, x.dtype)
        best = reduce(imp, open_, [a], "max" if largest else "min", True)
        hit = elementwise(imp, "eq", [x, best], x.dtype)
        if floats:  # a NaN is the best there is (max/min propagate it); x == NaN never holds
            nan = imp.graph.add("isnan", (x,))
            hit = elementwise(imp, "logical_or", [hit, elementwise(imp, "logical_and", [nan, broadcast_to(imp, imp.graph.add("isnan", (best,)), x.shape)], "i1")], "i1")
        hit = elementwise(imp, "logical_and", [hit, imp.graph.add("logical_not", (taken,))], "i1")
        first = imp.graph.add("argreduce", (convert(imp, hit, "i32"),), {"axis": a, "kind": "argmax", "keepdim": True, "last": False})
        indices.append(first)
        values.append(imp.graph.add("gather", (x, first), {"axis": a}))
        taken = elementwise(imp, "logical_or", [taken, elementwise(imp, "eq", [positions, broadcast_to(imp, first, x.shape)], "i64")], "i1")
    join = (lambda vs: vs[0]) if count == 1 else (lambda vs: imp.graph.add("concat", vs, {"axis": a}))
    return [join(values), join(indices)]


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
