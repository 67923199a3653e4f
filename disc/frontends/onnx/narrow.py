"""ONNX's narrow storage types, carried in the IR's 8-bit dtypes (the IR has no narrow dtype).

The float formats FLOAT8E4M3FN (17), FLOAT8E4M3FNUZ (18), FLOAT8E5M2 (19), FLOAT8E5M2FNUZ (20),
FLOAT4E2M1 (23) and FLOAT8E8M0 (24) travel as their bit pattern in a ``u8`` tensor; the
integer formats INT4 (22) and INT2 (26) as their value in ``i8``, UINT4 (21) and UINT2 (25) as
their value in ``u8``. The importer holds such a value as a ``Carried`` (the carrier and its
ONNX element type), which ``ArrayBuilder.tensor`` refuses: only Cast, CastLike,
QuantizeLinear, DequantizeLinear and Identity take one (``route``); any other op is an error
naming the op and the type, never bits read as numbers.

Decoding a float format is a gather from its table of values (float32, built here from the bit
layout), indexed by the bits. Encoding is elementwise arithmetic, exact: the exponent of |x|
by comparisons against powers of two, the quantum 2^(e - m), round half to even, then the
format's overflow rule (saturate, NaN or inf), and the code assembled as an integer
(sign * 2^(bits-1) + exponent field * 2^m + mantissa) converted to ``u8``.

At the program's edges (``CarrierRunner``, under ``OnnxProgram``) an ``ml_dtypes`` array (what
onnx's ``numpy_helper.to_array`` gives) becomes its carrier (``.view(uint8)`` for a float
format's bits, ``.astype(int8 / uint8)`` for an integer format's value) and a carried output
becomes the ``ml_dtypes`` array again; a carrier array given as such is taken as it is. A torch
tensor of torch's float8 dtypes is viewed as its bits, and given back so; the integer formats
stay carriers in torch. A saved program takes and gives the carriers (as bf16 travels as
uint16 bits).

Encodings follow ONNX's reference (ml_dtypes): a float64 is rounded to float32 first; a float
cast to an integer format is truncated and wraps (NaN, inf and values past int32 give 0);
QuantizeLinear to one rounds half to even, adds the zero point and saturates (NaN gives the
lowest value).

Not reproduced: the sign and payload of a NaN input (IR arithmetic cannot see them), so a NaN
encodes as the format's positive quiet NaN (0x7F E4M3FN, 0x7E E5M2, 0x80 the FNUZ formats,
0xFF E8M0, and 0x8 FLOAT4E2M1, as ml_dtypes maps a positive NaN there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from disc.ir.builder import GraphBuilder, LoweringError, convert, elementwise, reshape, select
from disc.ir.graph import Node
from disc.ir.types import FLOAT_DTYPES, promote
from disc.shape.expr import product


@dataclass(frozen=True)
class FloatFormat:
    """A small float format: ``bits`` wide, ``exp`` exponent and ``man`` mantissa bits, ``bias``."""

    name: str
    bits: int
    exp: int
    man: int
    bias: int
    unsigned_zero: bool  # FNUZ: no -0; the code 0x80 is the NaN
    has_inf: bool  # IEEE-like: the top exponent field holds inf and NaNs
    nan_code: int | None  # the positive NaN's code (None: the format has no NaN)

    @property
    def sign_bit(self) -> int:
        return 1 << (self.bits - 1)

    @property
    def emin(self) -> int:
        """The exponent of the smallest normal (the subnormals' quantum is 2^(emin - man))."""
        return 1 - self.bias

    @property
    def max_code(self) -> int:
        """The code of the largest finite value."""
        top = (1 << (self.bits - 1)) - 1  # all bits but the sign
        if self.has_inf:
            return (((1 << self.exp) - 1) << self.man) - 1  # below the all-ones field (inf, NaNs)
        if self.nan_code is not None and not self.unsigned_zero:
            return top - 1  # (E4M3FN: all ones is the NaN)
        return top

    @property
    def emax(self) -> int:
        return (self.max_code >> self.man) - self.bias

    def value(self, code: int) -> float:
        """The value of ``code``, from the bit layout."""
        sign = -1.0 if code & self.sign_bit else 1.0
        field = (code >> self.man) & ((1 << self.exp) - 1)
        mant = code & ((1 << self.man) - 1)
        if self.unsigned_zero and code == self.sign_bit:
            return float("nan")
        if self.nan_code is not None and not self.unsigned_zero and (code & ~self.sign_bit) > self.max_code:
            return sign * float("inf") if self.has_inf and mant == 0 else float("nan")
        if field == 0:
            return sign * mant * 2.0 ** (self.emin - self.man)
        return sign * (1 + mant / 2.0**self.man) * 2.0 ** (field - self.bias)


@dataclass(frozen=True)
class IntFormat:
    name: str
    bits: int
    signed: bool

    @property
    def lo(self) -> int:
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def hi(self) -> int:
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1

    @property
    def carrier(self) -> str:
        return "i8" if self.signed else "u8"


E8M0 = "FLOAT8E8M0"  # exponent only: 2^(code - 127), 0xFF the NaN

FORMATS: dict[int, Any] = {
    17: FloatFormat("FLOAT8E4M3FN", 8, 4, 3, 7, False, False, 0x7F),
    18: FloatFormat("FLOAT8E4M3FNUZ", 8, 4, 3, 8, True, False, 0x80),
    19: FloatFormat("FLOAT8E5M2", 8, 5, 2, 15, False, True, 0x7E),
    20: FloatFormat("FLOAT8E5M2FNUZ", 8, 5, 2, 16, True, False, 0x80),
    21: IntFormat("UINT4", 4, False),
    22: IntFormat("INT4", 4, True),
    23: FloatFormat("FLOAT4E2M1", 4, 2, 1, 1, False, False, None),
    24: E8M0,
    25: IntFormat("UINT2", 2, False),
    26: IntFormat("INT2", 2, True),
}
ML_DTYPES = {17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4_e2m1fn", 24: "float8_e8m0fnu", 25: "uint2", 26: "int2"}
TORCH_DTYPES = {17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz", 24: "float8_e8m0fnu"}
# What a float4 NaN encodes as: ml_dtypes maps a positive NaN to 0x8 (the format has no NaN).
_FLOAT4_NAN = 0x8
TAKES = ("Cast", "CastLike", "QuantizeLinear", "DequantizeLinear", "Identity")


def type_name(elem: int) -> str:
    f = FORMATS[elem]
    return f if isinstance(f, str) else f.name


def carrier(elem: int) -> str:
    """The IR dtype a value of ONNX element type ``elem`` travels in."""
    f = FORMATS[elem]
    return f.carrier if isinstance(f, IntFormat) else "u8"


@dataclass
class Carried:
    """A value of a narrow ONNX type: ``value`` (a Node or a numpy array) holds it in ``carrier(elem)``."""

    value: Any
    elem: int


def _ml_dtype(elem: int) -> Any:
    import ml_dtypes  # (installed with onnx)

    return np.dtype(getattr(ml_dtypes, ML_DTYPES[elem]))


def elem_of_numpy(dtype: Any) -> int | None:
    """The narrow ONNX element type of an ``ml_dtypes`` numpy dtype, None for any other."""
    name = getattr(dtype, "name", "")
    for elem, ml in ML_DTYPES.items():
        if name == ml:
            return elem
    return None


def to_carrier(name: str, v: Any, elem: int) -> Any:
    """A caller's array of ONNX type ``elem`` (the ``ml_dtypes`` array, a torch float8 tensor, or
    already its carrier) as the carrier."""
    from disc.errors import InputError

    want = carrier(elem)
    if hasattr(v, "detach"):  # a torch tensor
        import torch

        if str(v.dtype) == f"torch.{TORCH_DTYPES.get(elem)}":
            return v.view(torch.uint8)
        if str(v.dtype) == ("torch.int8" if want == "i8" else "torch.uint8"):
            return v
        raise InputError(f"input {name!r} is {type_name(elem)} in the model; a torch tensor of it is a torch.{TORCH_DTYPES.get(elem, want)} or its carrier ({want}), not {v.dtype}")
    a = np.asarray(v)
    as_numpy = np.dtype("int8" if want == "i8" else "uint8")
    if a.dtype == _ml_dtype(elem):  # an integer format's value; a float format's bits
        return a.astype(as_numpy) if isinstance(FORMATS[elem], IntFormat) else a.view(np.uint8)
    if a.dtype == as_numpy:
        return a
    raise InputError(f"input {name!r} is {type_name(elem)} in the model: give an ml_dtypes.{ML_DTYPES[elem]} array (or its carrier, {want}), not {a.dtype}")


def from_carrier(a: Any, elem: int) -> Any:
    """A carried output as the ``ml_dtypes`` array of its ONNX type; a torch tensor as torch's
    float8 dtype where torch has it, else its carrier (the integer formats)."""
    if hasattr(a, "detach"):
        import torch

        dtype = getattr(torch, TORCH_DTYPES.get(elem, ""), None)
        return a.view(dtype) if dtype is not None else a
    if isinstance(FORMATS[elem], IntFormat):
        return a.astype(_ml_dtype(elem))
    return a.view(_ml_dtype(elem))


def carried(v: Any) -> Any:
    """``v`` as the importer should hold it: an ``ml_dtypes`` array (an initializer, a Constant)
    becomes a Carried of its carrier; anything else is returned as it is."""
    if isinstance(v, np.ndarray):
        elem = elem_of_numpy(v.dtype)
        if elem is not None:
            return Carried(to_carrier("constant", v, elem), elem)
    return v


def output_value(v: Any) -> tuple[Any, int | None]:
    """A graph output's value for the IR and its narrow ONNX type (None if it has none)."""
    v = carried(v)
    if isinstance(v, Carried):
        return v.value, v.elem
    return v, None


# -- routing --------------------------------------------------------------------------------------
def route(node: Any, fn: Callable[..., Any], operands: list[Any], attrs: dict[str, Any]) -> tuple[Callable[..., Any], list[Any]]:
    """The lowering of ``node``: ``fn``, or this module's where a narrow type is involved.
    Constants of narrow types become Carried; an op outside ``TAKES`` given one is refused."""
    operands = [carried(v) for v in operands]
    held = [v for v in operands if isinstance(v, Carried)]
    op = node.op_type
    if held and op not in TAKES:
        names = sorted({type_name(v.elem) for v in held})
        raise LoweringError(f"{op} of a {' and '.join(names)} value: disc carries ONNX's narrow types only through {', '.join(TAKES)}")
    if op == "Cast" and (held or attrs.get("to") in FORMATS):
        return _cast, operands
    if op == "CastLike" and held:
        return _cast_like, operands
    if op == "QuantizeLinear" and (held or attrs.get("output_dtype") in FORMATS):
        return _quantize_linear, operands
    if op == "DequantizeLinear" and held:
        return _dequantize_linear, operands
    return fn, operands


# -- decoding --------------------------------------------------------------------------------------
def table(elem: int) -> np.ndarray:
    """The float32 value of every code of float format ``elem``, indexed by the code."""
    f = FORMATS[elem]
    if f == E8M0:
        exponents = np.arange(255) - 127  # (2^-127 is a float32 subnormal: exact)
        return np.append(np.ldexp(1.0, exponents), np.nan).astype(np.float32)
    return np.array([f.value(c) for c in range(1 << f.bits)], np.float32)


def _node(imp: Any, v: Any) -> Node:
    return imp.tensor(v.value if isinstance(v, Carried) else v)


def decode(imp: Any, v: Carried) -> Node:
    """A carried value as numbers: float32 for the float formats (exact), the carrier for the integer ones."""
    x = _node(imp, v)
    if isinstance(FORMATS[v.elem], IntFormat):
        return x
    flat = reshape(imp, convert(imp, x, "i64"), [product(x.shape)])
    values = imp.graph.add("index_select", (imp.graph.add_constant(table(v.elem)), flat), {"axis": 0})
    return reshape(imp, values, list(x.shape))


def _as_number(imp: Any, v: Any) -> Node:
    return decode(imp, v) if isinstance(v, Carried) else imp.tensor(v)


# -- encoding --------------------------------------------------------------------------------------
def _binade(imp: GraphBuilder, ax: Node, lo: int, hi: int, w: str) -> tuple[Node, Node]:
    """(e, 2^e) for ``ax`` >= 0, both exact in ``w``: e = floor(log2 ax) clamped to [lo, hi] (lo for
    ax below 2^lo, 0 or NaN). By comparisons against powers of two: a first pass picks the block
    of 16 binades, a second the binade within it (after scaling ax exactly into [1, 2^16))."""
    e: Any = float(lo)
    p: Any = 2.0**lo
    s: Any = 2.0**-lo
    start = lo + 16
    while start <= hi:
        c = elementwise(imp, "ge", [ax, 2.0**start], w)
        e, p, s = select(imp, c, float(start), e, w), select(imp, c, 2.0**start, p, w), select(imp, c, 2.0**-start, s, w)
        start += 16
    last = lo + 16 * ((hi - lo) // 16)
    y = elementwise(imp, "mul", [ax, s], w)  # (inf where ax is huge: then e clamps to hi)
    steps = min(15, hi - lo)
    e2: Any = 0.0
    p2: Any = 1.0
    for k in range(1, steps + 1):
        c = elementwise(imp, "ge", [y, 2.0**k], w)
        e2, p2 = select(imp, c, float(k), e2, w), select(imp, c, 2.0**k, p2, w)
    e = elementwise(imp, "add", [e, e2], w)
    p = elementwise(imp, "mul", [p, p2], w)
    if last + steps > hi:
        over = elementwise(imp, "gt", [e, float(hi)], w)
        e, p = select(imp, over, float(hi), e, w), select(imp, over, 2.0**hi, p, w)
    return e, p


def encode_float(imp: GraphBuilder, x: Node, f: FloatFormat, saturate: bool) -> Node:
    """The code of each element of ``x`` in float format ``f`` (u8): round half to even, then the
    format's rule for overflow (``saturate``: the largest finite value; else NaN, or inf where the
    format has one), -0 kept where the format has it. From float32: a float64 (or an integer) is
    rounded to float32 first, as ml_dtypes converts (ONNX's reference)."""
    w = "f32"
    x = convert(imp, x, w)
    ax = imp.graph.add("abs", (x,))
    e, p = _binade(imp, ax, f.emin, f.emax, w)
    quantum = elementwise(imp, "mul", [p, 2.0**-f.man], w)
    mantissa = imp.graph.add("round", (elementwise(imp, "div", [ax, quantum], w),))  # exact division: round half to even
    mag = elementwise(imp, "add", [mantissa, elementwise(imp, "mul", [elementwise(imp, "sub", [e, float(f.emin)], w), float(1 << f.man)], w)], w)
    # (a mantissa rounded up to 2^(man+1) gives the next binade's code: the sum carries into the field)
    negative = elementwise(
        imp,
        "logical_or",
        [
            elementwise(imp, "lt", [x, 0.0], w),
            elementwise(imp, "logical_and", [elementwise(imp, "eq", [x, 0.0], w), elementwise(imp, "lt", [elementwise(imp, "div", [1.0, x], w), 0.0], w)], "i1"),
        ],
        "i1",
    )
    if f.unsigned_zero:  # no -0: a value rounding to 0 is +0
        negative = elementwise(imp, "logical_and", [negative, elementwise(imp, "ne", [mag, 0.0], w)], "i1")
    sign = select(imp, negative, float(f.sign_bit), 0.0, w)
    over = elementwise(imp, "gt", [mag, float(f.max_code)], w)  # (inf too)
    if saturate or f.nan_code is None:
        over_code = elementwise(imp, "add", [sign, float(f.max_code)], w)
    elif f.unsigned_zero:
        over_code = float(f.sign_bit)  # the NaN
    elif f.has_inf:
        over_code = elementwise(imp, "add", [sign, float(f.max_code + 1)], w)  # inf
    else:
        over_code = elementwise(imp, "add", [sign, float(f.nan_code)], w)  # (E4M3FN: -NaN for -inf, as the spec's table)
    code = select(imp, over, over_code, elementwise(imp, "add", [sign, mag], w), w)
    code = select(imp, imp.graph.add("isnan", (x,)), float(_FLOAT4_NAN if f.nan_code is None else f.nan_code), code, w)
    return convert(imp, code, "u8")


def encode_e8m0(imp: GraphBuilder, x: Node, saturate: bool, round_mode: str) -> Node:
    """FLOAT8E8M0's code of |x| as float32 (as ONNX's reference: the sign is not looked at): its
    biased exponent, plus one where ``round_mode`` rounds the mantissa up ("up": any fraction;
    "nearest": half or more, strictly more below the normals; "down": never), that one left off
    at 2^127 with ``saturate``; NaN and inf are 0xFF."""
    if round_mode not in ("up", "down", "nearest"):
        raise LoweringError(f"Cast to FLOAT8E8M0 with round_mode {round_mode!r}; ONNX takes 'up', 'down' or 'nearest'")
    ax = imp.graph.add("abs", (convert(imp, convert(imp, x, "f32"), "f64"),))
    e, p = _binade(imp, ax, -126, 127, "f64")
    normal = elementwise(imp, "ge", [ax, 2.0**-126], "f64")
    biased = select(imp, normal, elementwise(imp, "add", [e, 127.0], "f64"), 0.0, "f64")
    if round_mode == "down":
        code = biased
    else:
        if round_mode == "up":
            up = select(imp, normal, elementwise(imp, "ne", [ax, p], "f64"), elementwise(imp, "gt", [ax, 0.0], "f64"), "i1")
        else:
            up = select(imp, normal, elementwise(imp, "ge", [ax, elementwise(imp, "mul", [p, 1.5], "f64")], "f64"), elementwise(imp, "gt", [ax, 2.0**-127], "f64"), "i1")
        if saturate:
            up = elementwise(imp, "logical_and", [up, elementwise(imp, "ne", [biased, 254.0], "f64")], "i1")
        code = elementwise(imp, "add", [biased, convert(imp, up, "f64")], "f64")
    special = elementwise(imp, "logical_or", [imp.graph.add("isnan", (ax,)), imp.graph.add("isinf", (ax,))], "i1")
    return convert(imp, select(imp, special, 255.0, code, "f64"), "u8")


def encode_int(imp: GraphBuilder, x: Node, f: IntFormat) -> Node:
    """Integer format ``f`` of ``x`` as ml_dtypes casts (ONNX's reference): an integer keeps its low
    bits (two's complement); a float is truncated to an int32 and then so, NaN, inf and values
    outside int32 giving 0."""
    size = 1 << f.bits
    if x.dtype in FLOAT_DTYPES:
        v = convert(imp, x, "f64")
        t = select(imp, elementwise(imp, "lt", [v, 0.0], "f64"), imp.graph.add("ceil", (v,)), imp.graph.add("floor", (v,)), "f64")
        outside = elementwise(imp, "logical_not", [elementwise(imp, "lt", [imp.graph.add("abs", (t,)), 2.0**31], "f64")], "i1")  # (NaN too)
        t = select(imp, outside, 0.0, t, "f64")
        low = elementwise(imp, "sub", [t, elementwise(imp, "mul", [imp.graph.add("floor", (elementwise(imp, "div", [t, float(size)], "f64"),)), float(size)], "f64")], "f64")
        if f.signed:
            low = select(imp, elementwise(imp, "ge", [low, float(size // 2)], "f64"), elementwise(imp, "sub", [low, float(size)], "f64"), low, "f64")
        return convert(imp, low, f.carrier)
    low = elementwise(imp, "bitwise_and", [convert(imp, x, "i64"), size - 1], "i64")
    if f.signed:
        low = select(imp, elementwise(imp, "ge", [low, size // 2], "i64"), elementwise(imp, "sub", [low, size], "i64"), low, "i64")
    return convert(imp, low, f.carrier)


def encode(imp: GraphBuilder, x: Node, elem: int, saturate: bool = True, round_mode: str = "up") -> Node:
    """``x`` (numbers) as ONNX type ``elem``'s carrier."""
    f = FORMATS[elem]
    if f == E8M0:
        return encode_e8m0(imp, x, saturate, round_mode)
    if isinstance(f, IntFormat):
        return encode_int(imp, x, f)
    return encode_float(imp, x, f, saturate)


# -- the ops ------------------------------------------------------------------------------------------
def _cast_to(imp: Any, x: Any, to: int, saturate: int, round_mode: str) -> Any:
    from disc.frontends.onnx.importer import ELEM_TYPES

    if isinstance(x, Carried) and x.elem == to:
        return x
    if to in FORMATS:
        if isinstance(x, Carried) and isinstance(FORMATS[x.elem], IntFormat) and isinstance(FORMATS[to], IntFormat):
            return Carried(encode(imp, _node(imp, x), to), to)  # (an integer carrier: its low bits)
        return Carried(encode(imp, _as_number(imp, x), to, bool(saturate), round_mode), to)
    if to not in ELEM_TYPES:
        raise LoweringError(f"Cast to element type {to}, which disc does not run")
    return convert(imp, decode(imp, x), ELEM_TYPES[to])


def _cast(imp: Any, node: Any, x: Any, to: int, saturate: int = 1, round_mode: str = "up") -> Any:
    return _cast_to(imp, x, to, saturate, round_mode)


def _cast_like(imp: Any, node: Any, x: Any, like: Any, saturate: int = 1) -> Any:
    from disc.frontends.onnx.importer import ELEM_TYPES

    if isinstance(like, Carried):
        return _cast_to(imp, x, like.elem, saturate, "up")
    target = imp.tensor(like).dtype
    to = next(k for k, v in ELEM_TYPES.items() if v == target)
    return _cast_to(imp, x, to, saturate, "up")


def _quantize_linear(imp: Any, node: Any, x: Any, scale: Any, zero_point: Any = None, axis: int = 1, saturate: int = 1, block_size: int = 0, output_dtype: int = 0, precision: int = 0) -> Any:
    from disc.frontends.onnx.importer import ELEM_TYPES
    from disc.frontends.onnx.ops.quantization import _per_axis

    out = zero_point.elem if isinstance(zero_point, Carried) else output_dtype
    if output_dtype and output_dtype != out:
        raise LoweringError(f"QuantizeLinear: output_dtype {output_dtype} and the zero point's type {out} differ")
    f = FORMATS.get(out)
    if f is None or f == E8M0:
        raise LoweringError(f"QuantizeLinear to element type {out}, which disc does not quantize to")
    if isinstance(x, Carried) or isinstance(scale, Carried):
        raise LoweringError("QuantizeLinear of a narrow-typed input or scale")
    x, s = imp.tensor(x), imp.tensor(scale)
    work = ELEM_TYPES[precision] if precision else promote(x.dtype, s.dtype)
    y = elementwise(imp, "div", [convert(imp, x, work), convert(imp, _per_axis(imp, s, x, axis, block_size), work)], work)
    if isinstance(f, FloatFormat) and f.bits == 8:  # (the zero point of a float8 must be 0: not added, as the reference)
        return Carried(encode_float(imp, y, f, bool(saturate)), out)
    if isinstance(f, FloatFormat):  # float4: y + zero point, rounded once
        w = promote(work, "f32")
        y = convert(imp, y, w)
        if zero_point is not None:
            y = elementwise(imp, "add", [y, convert(imp, _per_axis(imp, decode(imp, zero_point), x, axis, block_size), w)], w)
        return Carried(encode_float(imp, y, f, True), out)
    w = "f64" if work == "f64" else "f32"
    q = imp.graph.add("round", (convert(imp, y, w),))  # half to even
    if zero_point is not None:
        q = elementwise(imp, "add", [q, convert(imp, _per_axis(imp, _node(imp, zero_point), x, axis, block_size), w)], w)
    q = elementwise(imp, "minimum", [elementwise(imp, "maximum", [q, float(f.lo)], w), float(f.hi)], w)
    q = select(imp, imp.graph.add("isnan", (q,)), float(f.lo), q, w)
    return Carried(convert(imp, q, f.carrier), out)


def _dequantize_linear(imp: Any, node: Any, x: Any, scale: Any, zero_point: Any = None, axis: int = 1, block_size: int = 0, output_dtype: int = 0) -> Node:
    """(x - zero point) * scale, x decoded to float32; the zero point of a float format is not
    used (it must be 0), as ONNX's reference."""
    from disc.frontends.onnx.importer import ELEM_TYPES
    from disc.frontends.onnx.ops.quantization import _per_axis

    if not isinstance(x, Carried) or isinstance(scale, Carried):
        raise LoweringError("DequantizeLinear: a narrow-typed zero point with an input of another type, or a narrow-typed scale")
    if isinstance(zero_point, Carried) and zero_point.elem != x.elem:
        raise LoweringError(f"DequantizeLinear: the input is {type_name(x.elem)}, its zero point {type_name(zero_point.elem)}")
    s = imp.tensor(scale)
    d = convert(imp, decode(imp, x), "f32")
    if zero_point is not None and isinstance(FORMATS[x.elem], IntFormat):
        d = elementwise(imp, "sub", [d, convert(imp, _per_axis(imp, _node(imp, zero_point), d, axis, block_size), "f32")], "f32")
    w = promote("f32", s.dtype)
    y = elementwise(imp, "mul", [convert(imp, d, w), convert(imp, _per_axis(imp, s, d, axis, block_size), w)], w)
    if output_dtype and output_dtype not in ELEM_TYPES:
        raise LoweringError(f"DequantizeLinear to element type {output_dtype}, which disc does not run")
    return convert(imp, y, ELEM_TYPES[output_dtype] if output_dtype else s.dtype)


# -- the program's edges ------------------------------------------------------------------------------
def carry_edges(imp: Any, inputs: list[str], outputs: list[str]) -> None:
    """Once the nodes are lowered: the narrow types of the program's inputs and outputs
    (``imp.narrow_inputs``, ``imp.narrow_outputs``, None where a value has none), and each
    carried output replaced by its carrier for the graph."""
    imp.narrow_inputs = [v.elem if isinstance(v := imp.values.get(n), Carried) else None for n in inputs]
    imp.narrow_outputs = []
    for name in outputs:
        value, elem = output_value(imp.values[name])
        imp.values[name] = value
        imp.narrow_outputs.append(elem)


class CarrierRunner:
    """A runner whose program takes and gives ONNX's narrow types as their carriers: ``ml_dtypes``
    arrays in (or the carriers), ``ml_dtypes`` arrays out. Saved, the program keeps the carriers."""

    def __init__(self, runner: Any, inputs: list[int | None], outputs: list[int | None]) -> None:
        self.runner, self.inputs, self.outputs = runner, inputs, outputs

    def run(self, names: list[str], values: list[Any]) -> list[Any]:
        values = [to_carrier(n, v, elem) if elem is not None else v for n, v, elem in zip(names, values, self.inputs)]
        outs = self.runner.run(names, values)
        return [from_carrier(o, elem) if elem is not None else o for o, elem in zip(outs, self.outputs)]

    def save(self, folder: Any) -> Any:
        return self.runner.save(folder)


def wrap_runner(runner: Any, imp: Any) -> Any:
    """``runner`` converting the narrow types at the program's edges, where it has any."""
    ins, outs = getattr(imp, "narrow_inputs", []), getattr(imp, "narrow_outputs", [])
    if not any(e is not None for e in [*ins, *outs]):
        return runner
    groups = getattr(imp, "output_groups", None) or [None] * len(outs)
    flat: list[int | None] = []
    for elem, k in zip(outs, groups):  # (a sequence output is k outputs of the program)
        flat += [elem] if k is None else [None] * k
    return CarrierRunner(runner, ins, flat)
