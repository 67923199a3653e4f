"""Elementwise ops: unary, binary, compare, select and convert.

As in HLO, operands of an elementwise op have the same shape and dtype;
broadcasting and promotion are explicit ops the frontend inserts. The shape
rule records "operand dims are equal" as a constraint (proven, or checked at
run time), which is where most dim equalities of a program come from.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from disc.ir.lazy_torch import deferred, torch
from disc.ir.registry import ELEMENTWISE, ShapeContext, ShapeRuleError, dtype_from_attr, register, tensor
from disc.ir.types import FLOAT_DTYPES, ITEMSIZE, Type, torch_dtype


def same_shape_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    ts = [tensor(t, ctx.op) for t in types]
    ref = ts[0]
    for i, t in enumerate(ts[1:], 1):
        if t.rank != ref.rank:
            raise ShapeRuleError(f"{ctx.op}: operand {i} has rank {t.rank}, operand 0 has rank {ref.rank}")
        for axis, (a, b) in enumerate(zip(ref.shape, t.shape)):
            ctx.equal(a, b, f"operand {i} dim {axis} must equal operand 0 dim {axis}")
    return ref.shape


def _same_dtype(types: Sequence[Type], attrs: Mapping[str, Any]) -> str:
    dtypes = {tensor(t, "elementwise").dtype for t in types}
    if len(dtypes) != 1:
        raise ShapeRuleError(f"elementwise operands must share a dtype, got {sorted(dtypes)}")
    return dtypes.pop()


def _float_dtype(types: Sequence[Type], attrs: Mapping[str, Any]) -> str:
    dt = _same_dtype(types, attrs)
    if dt not in FLOAT_DTYPES:
        raise ShapeRuleError(f"operand must be floating point, got {dt}")
    return dt


def _bool(types: Sequence[Type], attrs: Mapping[str, Any]) -> str:
    _same_dtype(types, attrs)
    return "i1"


def _unary(name: str, fn: Callable[[torch.Tensor], torch.Tensor], float_only: bool = False, doc: str = "", dtype=None) -> None:
    rule = dtype or (_float_dtype if float_only else _same_dtype)
    register(name, "x", dtype=rule, shape=same_shape_rule, category=ELEMENTWISE, doc=doc)(_unsigned_aware(name, fn))


def _binary(name: str, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], dtype=_same_dtype, doc: str = "") -> None:
    register(name, "lhs rhs", dtype=dtype, shape=same_shape_rule, category=ELEMENTWISE, doc=doc)(_unsigned_aware(name, fn))


# PyTorch stores u16, u32 and u64 but computes almost nothing on them ("add_stub" not implemented
# for 'UInt32'): the reference computes those in numpy, whose unsigned arithmetic wraps as the
# compiled kernels' does (a division by zero raises PyTorch's integer-division error).
_WIDE_UNSIGNED = ("torch.uint16", "torch.uint32", "torch.uint64")


def _np_shift(left: bool) -> Callable[..., Any]:
    def shift(x: Any, y: Any) -> Any:
        import numpy as np

        outside = y >= x.dtype.itemsize * 8  # unsigned: never negative
        shifted = (np.left_shift if left else np.right_shift)(x, np.where(outside, 0, y).astype(x.dtype))
        return np.where(outside, np.zeros_like(x), shifted)

    return shift


@functools.cache
def _unsigned_numpy_ops() -> dict[str, Callable[..., Any]]:
    import numpy as np

    return {
        "neg": np.negative, "abs": lambda x: x, "sign": np.sign, "floor": lambda x: x, "ceil": lambda x: x, "round": lambda x: x,
        "relu": lambda x: x, "bitwise_not": np.invert, "logical_not": np.logical_not, "isnan": np.isnan, "isinf": np.isinf,
        "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.floor_divide, "floor_div": np.floor_divide,
        "remainder": np.remainder, "fmod": np.remainder, "pow": np.power, "maximum": np.maximum, "minimum": np.minimum,
        "logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor,
        "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
        "shift_left": _np_shift(True), "shift_right": _np_shift(False),
        "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    }  # fmt: skip


def _unsigned_aware(name: str, fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def run(*xs: torch.Tensor) -> torch.Tensor:
        if not any(str(getattr(x, "dtype", "")) in _WIDE_UNSIGNED for x in xs):
            return fn(*xs)
        import numpy as np

        np_fn = _unsigned_numpy_ops().get(name)
        if np_fn is None:
            raise TypeError(f"{name} of {xs[0].dtype}: not an integer op")
        arrays = [x.cpu().numpy() for x in xs]
        if name in ("div", "floor_div", "remainder", "fmod") and not arrays[1].all():
            raise RuntimeError("ZeroDivisionError")
        with np.errstate(all="ignore"):
            out = np.asarray(np_fn(*arrays))
        return torch.from_numpy(np.ascontiguousarray(out.astype(out.dtype if out.dtype == np.bool_ else arrays[0].dtype))).to(xs[0].device)

    run.__name__ = name
    return run


def _int_dtype(types: Sequence[Type], attrs: Mapping[str, Any]) -> str:
    dt = _same_dtype(types, attrs)
    if dt in FLOAT_DTYPES or dt == "i1":
        raise ShapeRuleError(f"operands must be integers, got {dt}")
    return dt


def _shift(left: bool) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """x shifted by y bits; a shift outside [0, bits) gives what the sign fill alone gives (0, or
    -1 shifting a negative x right), as ONNX's BitShift and PyTorch's shifts define it."""

    def shift(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        outside = (y < 0) | (y >= x.element_size() * 8)
        y = torch.where(outside, torch.zeros_like(y), y)
        shifted = torch.bitwise_left_shift(x, y) if left else torch.bitwise_right_shift(x, y)
        fill = torch.zeros_like(x) if left else torch.where(x < 0, -torch.ones_like(x), torch.zeros_like(x))
        return torch.where(outside, fill, shifted)

    return shift


# -- unary -----------------------------------------------------------------------
_unary("neg", deferred("neg"))
_unary("abs", deferred("abs"))
_unary("sign", deferred("sign"))
_unary("exp", deferred("exp"), True)
_unary("expm1", deferred("expm1"), True)
_unary("log", deferred("log"), True)
_unary("log1p", deferred("log1p"), True)
_unary("log2", deferred("log2"), True)
_unary("log10", deferred("log10"), True)
_unary("sqrt", deferred("sqrt"), True)
_unary("rsqrt", deferred("rsqrt"), True)
_unary("reciprocal", deferred("reciprocal"), True)
_unary("tanh", deferred("tanh"), True)
_unary("sigmoid", deferred("sigmoid"), True)
_unary("sin", deferred("sin"), True)
_unary("cos", deferred("cos"), True)
_unary("erf", deferred("erf"), True)
_unary("tan", deferred("tan"), True)
_unary("asin", deferred("asin"), True)
_unary("acos", deferred("acos"), True)
_unary("atan", deferred("atan"), True)
_unary("sinh", deferred("sinh"), True)
_unary("cosh", deferred("cosh"), True)
_unary("asinh", deferred("asinh"), True)
_unary("acosh", deferred("acosh"), True)
_unary("atanh", deferred("atanh"), True)
_unary("floor", deferred("floor"))
_unary("ceil", deferred("ceil"))
_unary("round", deferred("round"))
_unary("relu", deferred("relu"))
_unary("logical_not", deferred("logical_not"), dtype=_bool)
_unary("bitwise_not", deferred("bitwise_not"))
_unary("isnan", deferred("isnan"), dtype=_bool)
_unary("isinf", deferred("isinf"), dtype=_bool)


def _gelu(x):
    # Eager's float kernels give NaN at +-inf, its one-element path and double inf at +inf: the
    # reference takes the kernels' answer, so it does not depend on the tensor's size.
    y = torch.nn.functional.gelu(x)
    return y if x.dtype == torch.float64 else torch.where(x.isinf(), float("nan"), y)


_unary("gelu", _gelu, True, "GELU with the exact erf formula")
_unary("gelu_tanh", lambda x: torch.nn.functional.gelu(x, approximate="tanh"), True, "GELU, tanh approximation")
_unary("silu", deferred("nn.functional.silu"), True)

# -- binary ----------------------------------------------------------------------
_binary("add", deferred("add"))
_binary("sub", deferred("sub"))
_binary("mul", deferred("mul"))
_binary("div", lambda a, b: torch.div(a, b) if a.is_floating_point() else torch.div(a, b, rounding_mode="trunc"))
_binary("floor_div", lambda a, b: torch.div(a, b, rounding_mode="floor"))
_binary("remainder", deferred("remainder"))
_binary("fmod", deferred("fmod"))
_binary("pow", deferred("pow"))
_binary("maximum", deferred("maximum"))
_binary("minimum", deferred("minimum"))
_binary("atan2", deferred("atan2"))
_binary("logical_and", deferred("logical_and"), _bool)
_binary("logical_or", deferred("logical_or"), _bool)
_binary("logical_xor", deferred("logical_xor"), _bool)
_binary("bitwise_and", deferred("bitwise_and"))
_binary("bitwise_or", deferred("bitwise_or"))
_binary("bitwise_xor", deferred("bitwise_xor"))
_binary("shift_left", _shift(True), _int_dtype, "x << y; 0 where y < 0 or y >= the bit width")
_binary("shift_right", _shift(False), _int_dtype, "x >> y, arithmetic for signed x; the sign fill where y < 0 or y >= the bit width")

# -- compare -----------------------------------------------------------------------
_binary("eq", deferred("eq"), _bool)
_binary("ne", deferred("ne"), _bool)
_binary("lt", deferred("lt"), _bool)
_binary("le", deferred("le"), _bool)
_binary("gt", deferred("gt"), _bool)
_binary("ge", deferred("ge"), _bool)


# -- select / convert ----------------------------------------------------------------
def _select_dtype(types: Sequence[Type], attrs: Mapping[str, Any]) -> str:
    pred, a, b = (tensor(t, "select") for t in types)
    if pred.dtype != "i1":
        raise ShapeRuleError(f"select: predicate must be i1, got {pred.dtype}")
    if a.dtype != b.dtype:
        raise ShapeRuleError(f"select: branches differ in dtype ({a.dtype} vs {b.dtype})")
    return a.dtype


@register("select", "pred on_true on_false", dtype=_select_dtype, shape=same_shape_rule, category=ELEMENTWISE)
def select(pred: torch.Tensor, on_true: torch.Tensor, on_false: torch.Tensor) -> torch.Tensor:
    """``pred ? on_true : on_false`` elementwise."""
    return torch.where(pred, on_true, on_false)


def _convert_dtype(types: Sequence[Type], attrs: Mapping[str, Any]) -> str:
    tensor(types[0], "convert")
    if attrs["dtype"] not in ITEMSIZE:
        raise ShapeRuleError(f"convert: unknown dtype {attrs['dtype']!r}")
    return dtype_from_attr()(types, attrs)


@register("convert", "x", attrs={"dtype": "f32"}, dtype=_convert_dtype, shape=same_shape_rule, category=ELEMENTWISE)
def convert(x: torch.Tensor, *, dtype: str) -> torch.Tensor:
    """Cast to another dtype (torch's rounding and overflow rules)."""
    return x.to(torch_dtype(dtype))


def _bitcast_dtype(types: Sequence[Type], attrs: Mapping[str, Any]) -> str:
    x = tensor(types[0], "bitcast")
    if attrs["dtype"] not in ITEMSIZE:
        raise ShapeRuleError(f"bitcast: unknown dtype {attrs['dtype']!r}")
    if ITEMSIZE[attrs["dtype"]] != ITEMSIZE[x.dtype]:
        raise ShapeRuleError(f"bitcast: {x.dtype} has {8 * ITEMSIZE[x.dtype]} bits, {attrs['dtype']} {8 * ITEMSIZE[attrs['dtype']]}; a bitcast keeps the width")
    return attrs["dtype"]


@register("bitcast", "x", attrs={"dtype": "i32"}, dtype=_bitcast_dtype, shape=same_shape_rule, category=ELEMENTWISE)
def bitcast(x: torch.Tensor, *, dtype: str) -> torch.Tensor:
    """Each element's bits read as another dtype of the same width (a bool's byte as 0 or 1)."""
    if dtype == "i1":
        return x.view(torch.uint8) != 0
    return (x.to(torch.uint8) if x.dtype == torch.bool else x).view(torch_dtype(dtype))
