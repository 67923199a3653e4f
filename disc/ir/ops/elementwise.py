"""Elementwise ops: unary, binary, compare, select and convert.

As in HLO, operands of an elementwise op have the same shape and dtype;
broadcasting and promotion are explicit ops the frontend inserts. The shape
rule records "operand dims are equal" as a constraint (proven, or checked at
run time), which is where most dim equalities of a program come from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from disc.ir.registry import ELEMENTWISE, ShapeContext, ShapeRuleError, dtype_from_attr, register, tensor
from disc.ir.types import DTYPES, FLOAT_DTYPES, Type


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
    register(name, "x", dtype=rule, shape=same_shape_rule, category=ELEMENTWISE, doc=doc)(lambda x: fn(x))


def _binary(name: str, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], dtype=_same_dtype, doc: str = "") -> None:
    register(name, "lhs rhs", dtype=dtype, shape=same_shape_rule, category=ELEMENTWISE, doc=doc)(lambda a, b: fn(a, b))


# -- unary -----------------------------------------------------------------------
_unary("neg", torch.neg)
_unary("abs", torch.abs)
_unary("sign", torch.sign)
_unary("exp", torch.exp, True)
_unary("expm1", torch.expm1, True)
_unary("log", torch.log, True)
_unary("log1p", torch.log1p, True)
_unary("log2", torch.log2, True)
_unary("log10", torch.log10, True)
_unary("sqrt", torch.sqrt, True)
_unary("rsqrt", torch.rsqrt, True)
_unary("reciprocal", torch.reciprocal, True)
_unary("tanh", torch.tanh, True)
_unary("sigmoid", torch.sigmoid, True)
_unary("sin", torch.sin, True)
_unary("cos", torch.cos, True)
_unary("erf", torch.erf, True)
_unary("tan", torch.tan, True)
_unary("asin", torch.asin, True)
_unary("acos", torch.acos, True)
_unary("atan", torch.atan, True)
_unary("sinh", torch.sinh, True)
_unary("cosh", torch.cosh, True)
_unary("asinh", torch.asinh, True)
_unary("acosh", torch.acosh, True)
_unary("atanh", torch.atanh, True)
_unary("floor", torch.floor)
_unary("ceil", torch.ceil)
_unary("round", torch.round)
_unary("relu", torch.relu)
_unary("logical_not", torch.logical_not, dtype=_bool)
_unary("bitwise_not", torch.bitwise_not)
_unary("isnan", torch.isnan, dtype=_bool)
_unary("isinf", torch.isinf, dtype=_bool)
_unary("gelu", lambda x: torch.nn.functional.gelu(x), True, "GELU with the exact erf formula")
_unary("gelu_tanh", lambda x: torch.nn.functional.gelu(x, approximate="tanh"), True, "GELU, tanh approximation")
_unary("silu", torch.nn.functional.silu, True)

# -- binary ----------------------------------------------------------------------
_binary("add", torch.add)
_binary("sub", torch.sub)
_binary("mul", torch.mul)
_binary("div", lambda a, b: torch.div(a, b) if a.is_floating_point() else torch.div(a, b, rounding_mode="trunc"))
_binary("floor_div", lambda a, b: torch.div(a, b, rounding_mode="floor"))
_binary("remainder", torch.remainder)
_binary("fmod", torch.fmod)
_binary("pow", torch.pow)
_binary("maximum", torch.maximum)
_binary("minimum", torch.minimum)
_binary("atan2", torch.atan2)
_binary("logical_and", torch.logical_and, _bool)
_binary("logical_or", torch.logical_or, _bool)
_binary("logical_xor", torch.logical_xor, _bool)
_binary("bitwise_and", torch.bitwise_and)
_binary("bitwise_or", torch.bitwise_or)
_binary("bitwise_xor", torch.bitwise_xor)

# -- compare -----------------------------------------------------------------------
_binary("eq", torch.eq, _bool)
_binary("ne", torch.ne, _bool)
_binary("lt", torch.lt, _bool)
_binary("le", torch.le, _bool)
_binary("gt", torch.gt, _bool)
_binary("ge", torch.ge, _bool)


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
    if attrs["dtype"] not in DTYPES:
        raise ShapeRuleError(f"convert: unknown dtype {attrs['dtype']!r}")
    return dtype_from_attr()(types, attrs)


@register("convert", "x", attrs={"dtype": "f32"}, dtype=_convert_dtype, shape=same_shape_rule, category=ELEMENTWISE)
def convert(x: torch.Tensor, *, dtype: str) -> torch.Tensor:
    """Cast to another dtype (torch's rounding and overflow rules)."""
    return x.to(DTYPES[dtype])
