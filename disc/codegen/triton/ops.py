"""Triton for each elementwise op: the GPU counterpart of ``codegen/cpu/ops.py``.

Entries format operand expressions into a Triton expression; ``disc_*``
helpers are in ``prelude.py``. Ops whose Triton form depends on the dtype
(integer division truncates, float division does not) are listed per kind.
"""

from __future__ import annotations

# The type a kernel computes each IR dtype in: 16-bit floats are loaded, widened to f32, computed
# and rounded once at the store (or at an explicit convert), as eager's fused kernels do inside.
TL_TYPES = {
    "f16": "tl.float32",
    "bf16": "tl.float32",
    "f32": "tl.float32",
    "f64": "tl.float64",
    "i64": "tl.int64",
    "i32": "tl.int32",
    "i16": "tl.int16",
    "i8": "tl.int8",
    "u8": "tl.uint8",
    "u16": "tl.uint16",
    "u32": "tl.uint32",
    "u64": "tl.uint64",
    "i1": "tl.int1",
}
# Dtypes computed in a wider one, and the rounding of an f32 value to each (where a value is stored,
# or converted explicitly).
TL_STORAGE = {"f16": "({0}).to(tl.float16)", "bf16": "disc_round_bf16({0})"}
FLOATS = ("f16", "bf16", "f32", "f64")

UNARY = {
    "neg": "(-{0})",
    "abs": "tl.abs({0})",
    "sign": "disc_sign({0})",
    "exp": "tl.exp({0})",
    "expm1": "disc_expm1({0})",
    "log": "tl.log({0})",
    "log1p": "disc_log1p({0})",
    "log2": "tl.log2({0})",
    "log10": "(tl.log2({0}) * 0.30102999566398120)",
    "sinh": "disc_sinh({0})",
    "cosh": "disc_cosh({0})",
    "asinh": "disc_asinh({0})",
    "acosh": "disc_acosh({0})",
    "atanh": "disc_atanh({0})",
    "sqrt": "tl.sqrt({0})",
    "rsqrt": "(1.0 / tl.sqrt({0}))",
    "reciprocal": "(1.0 / {0})",
    "tanh": "disc_tanh({0})",
    "sigmoid": "tl.sigmoid({0})",
    "sin": "tl.sin({0})",
    "cos": "tl.cos({0})",
    "erf": "tl.erf({0})",
    "floor": "tl.floor({0})",
    "ceil": "tl.ceil({0})",
    "round": "disc_round({0})",
    "relu": "disc_relu({0})",
    "logical_not": "({0} == 0)",
    "isnan": "({0} != {0})",
    "isinf": "(tl.abs({0}) == float(\"inf\"))",
    "gelu": "disc_gelu({0})",
    "gelu_tanh": "disc_gelu_tanh({0})",
    "silu": "disc_silu({0})",
}
# Integer operands: these have another form than for floats.
UNARY_INT = {"isinf": "({0} != {0})", "bitwise_not": "(~{0})", "abs": "tl.where({0} < 0, -{0}, {0})", "floor": "{0}", "ceil": "{0}", "round": "{0}"}

BINARY = {
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "div": "({0} / {1})",
    "floor_div": "disc_floor_div_f({0}, {1})",
    "remainder": "disc_remainder({0}, {1})",
    "fmod": "disc_fmod({0}, {1})",
    "pow": "disc_pow({0}, {1})",
    "maximum": "disc_max({0}, {1})",
    "minimum": "disc_min({0}, {1})",
    "logical_and": "(({0} != 0) & ({1} != 0))",
    "logical_or": "(({0} != 0) | ({1} != 0))",
    "logical_xor": "(({0} != 0) ^ ({1} != 0))",
    "bitwise_and": "({0} & {1})",
    "bitwise_or": "({0} | {1})",
    "bitwise_xor": "({0} ^ {1})",
    "shift_left": "disc_shift_left({0}, {1})",
    "shift_right": "disc_shift_right({0}, {1})",
    "eq": "({0} == {1})",
    "ne": "({0} != {1})",
    "lt": "({0} < {1})",
    "le": "({0} <= {1})",
    "gt": "({0} > {1})",
    "ge": "({0} >= {1})",
}
# Integer division truncates, as the reference's (and C's); Triton's // on integers does exactly that.
BINARY_INT = {"div": "({0} // {1})", "floor_div": "disc_floor_div({0}, {1})", "maximum": "tl.maximum({0}, {1})", "minimum": "tl.minimum({0}, {1})"}

# Reductions: the identity and the combining function for tl.reduce (sum uses tl.sum).
REDUCE_INIT = {"sum": "0", "prod": "1", "max": 'float("-inf")', "min": 'float("inf")', "any": "0", "all": "1"}
REDUCE_INIT_INT = {"max": "{lowest}", "min": "{highest}"}
REDUCE_COMBINE = {"sum": "disc_add", "prod": "disc_mul", "max": "disc_max", "min": "disc_min", "any": "disc_max", "all": "disc_min"}
INT_LIMITS = {"i64": (-(2**63), 2**63 - 1), "i32": (-(2**31), 2**31 - 1), "i16": (-(2**15), 2**15 - 1), "i8": (-128, 127), "u8": (0, 255), "i1": (0, 1),
              "u16": (0, 2**16 - 1), "u32": (0, 2**32 - 1), "u64": (0, 2**64 - 1)}  # fmt: skip


def unary(op: str, dtype: str) -> str | None:
    """The format string of unary ``op`` on an operand of ``dtype``, or None if it has no Triton form."""
    if dtype == "i1" and op == "bitwise_not":
        return "({0} == 0)"  # ~ on int1 widens first in the interpreter: ~1 is -2, still true
    if dtype not in FLOATS and op in UNARY_INT:
        return UNARY_INT[op]
    return UNARY.get(op)


def binary(op: str, dtype: str) -> str | None:
    if dtype not in FLOATS and op in BINARY_INT:
        return BINARY_INT[op]
    return BINARY.get(op)


def literal(value: object, dtype: str) -> str:
    """A Triton (Python) literal of ``value`` in ``dtype``; inf and nan spelled so ``triton.jit`` folds them."""
    if dtype == "i1":
        return "1" if value else "0"
    if dtype in FLOATS:
        v = float(value)  # type: ignore[arg-type]
        if v != v:
            return 'float("nan")'
        if v in (float("inf"), float("-inf")):
            return f'float("{"-" if v < 0 else ""}inf")'
        return repr(v)
    return str(int(value))  # type: ignore[call-overload]


def reduce_init(kind: str, dtype: str) -> str:
    if dtype not in FLOATS and kind in REDUCE_INIT_INT:
        lo, hi = INT_LIMITS[dtype]
        return REDUCE_INIT_INT[kind].format(lowest=lo, highest=hi)
    return REDUCE_INIT[kind]
