"""Elementwise ops, activations, casts, and the compile-time folding of shape arithmetic
(integer ops on shape values and constants, comparisons decided by the constraints)."""

from __future__ import annotations

from typing import Any

import numpy as np

from disc.frontends.arrays import NeedsValue, known_array
from disc.frontends.arrays import dim_arith as _dim_arith
from disc.frontends.arrays import known as _known
from disc.frontends.onnx.importer import ELEM_TYPES, DimValue, OnnxImporter, ShapeValue
from disc.frontends.onnx.ops import onnx_op
from disc.ir.builder import (
    LoweringError,
    convert,
    elementwise,
    reshape,
    select,
)
from disc.ir.graph import Node
from disc.ir.types import FLOAT_DTYPES, numpy_dtype
from disc.shape.expr import DimLike, as_expr

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
    return _dim_arith(imp, op, a, b)


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
    if op == "pow" and kb is not None and kb.size == 1 and float(kb.reshape(-1)[0]) in (2.0, 3.0) and x.dtype in ("f32", "f64"):
        # x^2 and x^3 (GELU's tanh form, variances) as products, as PyTorch's kernels (and disc's
        # PyTorch frontend) compute them: a libm pow per element made GPT-2's exported MLP 2x slower.
        square = elementwise(imp, "mul", [x, x], x.dtype)
        return square if float(kb.reshape(-1)[0]) == 2.0 else elementwise(imp, "mul", [square, x], x.dtype)
    if op in _LOGICAL.values():
        dtype = "i1"
    else:
        dtype = x.dtype
        if x.dtype != y.dtype and op == "pow":  # Pow alone may mix types: the result is the base's
            return _mixed_pow(imp, x, y)
        if x.dtype != y.dtype:
            raise LoweringError(f"{node.op_type}: operand dtypes differ ({x.dtype}, {y.dtype}); ONNX requires one type")
    return elementwise(imp, op, [x, y], dtype)


@onnx_op("BitShift")
def _bit_shift(imp: OnnxImporter, node: Any, x: Any, y: Any, direction: str = "") -> Node:
    if direction not in ("LEFT", "RIGHT"):
        raise LoweringError(f"BitShift: direction is {direction!r}; ONNX takes 'LEFT' or 'RIGHT'")
    a, b = imp.tensor(x), imp.tensor(y)
    if a.dtype != b.dtype:
        raise LoweringError(f"BitShift: operand dtypes differ ({a.dtype}, {b.dtype}); ONNX requires one type")
    return elementwise(imp, "shift_left" if direction == "LEFT" else "shift_right", [a, b], a.dtype)


@onnx_op("BitCast")
def _bit_cast(imp: OnnxImporter, node: Any, x: Any, to: int) -> Node:
    if to not in ELEM_TYPES:
        raise LoweringError(f"BitCast to element type {to}, which disc does not run")
    return imp.graph.add("bitcast", (imp.tensor(x),), {"dtype": ELEM_TYPES[to]})


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


@onnx_op("If")
def _if(imp: OnnxImporter, node: Any, cond: Any, then_branch: Any = None, else_branch: Any = None) -> list[Any]:
    """A condition known at compile time (a shape test) lowers the branch it picks; one known only
    at run time lowers both and selects between their results, which must then have one shape."""
    k = _known(cond)
    if k is not None:
        return imp.run_subgraph(then_branch if bool(np.asarray(k).reshape(-1)[0]) else else_branch)
    chosen = imp.tensor(cond)
    if chosen.tensor_type.rank > 1 or (chosen.tensor_type.rank == 1 and not imp.graph.constraints.prove_is_one(chosen.shape[0])):
        raise LoweringError(f"If's condition must hold one element, not shape {chosen.shape}")
    flag = reshape(imp, convert(imp, chosen, "i1"), [])
    outs = []
    for a, b in zip(imp.run_subgraph(then_branch), imp.run_subgraph(else_branch), strict=True):
        x, y = imp.tensor(a), imp.tensor(b)
        if x.dtype != y.dtype or not imp.graph.constraints.prove_same_shape(x.shape, y.shape):
            raise LoweringError(f"If on a condition known only at run time, whose branches give {x.dtype}{list(x.shape)} and {y.dtype}{list(y.shape)}: disc selects between branches of one type")
        outs.append(select(imp, flag, x, y, x.dtype))
    return outs


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
    mode = bool(known_array(training_mode, "Dropout's training_mode")[0]) if training_mode is not None else False
    if mode:  # dropping nothing is the identity; dropping something would need ONNX's random stream
        drop = float(known_array(ratio, "Dropout's ratio")[0]) if ratio is not None else 0.5
        if drop != 0:
            raise LoweringError(f"Dropout in training mode with ratio {drop} (disc runs it with ratio 0 or in inference)")
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
