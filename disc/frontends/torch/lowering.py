"""Lowering table: core ATen op -> disc IR, one entry per op.

Each function receives the importer (``ctx``), the FX node (for torch's meta:
result dtype, original shapes) and the op's arguments with FX nodes replaced
by disc values (``Node`` for tensors and index scalars, Python numbers
otherwise). Broadcasting and dtype promotion are made explicit here, so disc
ops themselves always see same-shape, same-dtype operands.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from disc.frontends.torch.importer import Importer, LoweringError
from disc.ir.builder import broadcast_to, convert, elementwise, scalar, select, triangle
from disc.ir.graph import Node
from disc.ir.registry import normalize_axis
from disc.ir.types import FLOAT_DTYPES, dtype_of_torch
from disc.shape.expr import DimLike, as_expr

aten = torch.ops.aten
LOWERINGS: dict[Any, Callable[..., Any]] = {}
SYMINT_OPS: dict[Any, Callable[..., Any]] = {}

INT64_MAX = 9223372036854775807


def lower(*targets: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        for t in targets:
            LOWERINGS[t] = fn
        return fn

    return wrap


# -- helpers ---------------------------------------------------------------------------
def meta_dtype(fx_node: torch.fx.Node) -> str:
    val = fx_node.meta.get("val")
    if isinstance(val, (list, tuple)):
        val = val[0]
    return dtype_of_torch(val.dtype)


def meta_of(v: Any) -> Any:
    return v.meta.get("val") if isinstance(v, torch.fx.Node) else v


def result_type(fx_node: torch.fx.Node, *args: Any) -> str:
    metas = []
    for a in fx_node.args[: len(args)]:
        m = meta_of(a)
        metas.append(m if isinstance(m, (torch.Tensor, int, float, bool)) else (int(m) if isinstance(m, torch.SymInt) else m))
    tensors = [m for m in metas if isinstance(m, torch.Tensor)]
    if not tensors:
        return meta_dtype(fx_node)
    if len(metas) == 1:
        return dtype_of_torch(tensors[0].dtype)
    try:
        return dtype_of_torch(torch.result_type(metas[0], metas[1]))
    except (TypeError, RuntimeError):
        return dtype_of_torch(tensors[0].dtype)


def norm_axis(axis: int, rank: int) -> int:
    return normalize_axis(axis, rank, "lowering")


def reduce_dims(x: Node, dims: Any) -> list[int]:
    rank = x.tensor_type.rank
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0) or rank == 0:
        return list(range(rank))  # a 0-d tensor's dims (0 or -1, torch checked them) name nothing to reduce
    if isinstance(dims, int):
        dims = [dims]
    return sorted({norm_axis(d, rank) for d in dims})


def size_value(ctx: Importer, v: Any) -> DimLike:
    """A size argument (int or index Node) as a dim expression."""
    if isinstance(v, Node):
        if not v.is_index:
            raise LoweringError("tensor used as a size")
        return v.type.value  # type: ignore[union-attr]
    return int(v)


# -- SymInt arithmetic: becomes shape-computation IR ---------------------------------
_SYMFLOAT_OPS = {"imul": "mul", "iadd": "add", "isub": "sub", "imax": "maximum", "imin": "minimum"}


def _is_symfloat(v: Any) -> bool:
    return isinstance(v, float) or (isinstance(v, Node) and not v.is_index)


def _sym(op: str) -> Callable[..., Node]:
    def fn(ctx: Importer, a: Any, b: Any) -> Node:
        if (_is_symfloat(a) or _is_symfloat(b)) and op in _SYMFLOAT_OPS:
            return ctx.graph.add(_SYMFLOAT_OPS[op], (_sym_float(ctx, a), _sym_float(ctx, b)))
        na = a if isinstance(a, Node) else ctx.index(int(a))
        nb = b if isinstance(b, Node) else ctx.index(int(b))
        return ctx.graph.add(op, (na, nb))

    return fn


SYMINT_OPS[operator.mul] = _sym("imul")
SYMINT_OPS[operator.add] = _sym("iadd")
SYMINT_OPS[operator.sub] = _sym("isub")
SYMINT_OPS[operator.floordiv] = _sym("ifloordiv")
SYMINT_OPS[torch.sym_max] = _sym("imax")
SYMINT_OPS[torch.sym_min] = _sym("imin")


def _sym_sum(ctx: Importer, items: Sequence[Any]) -> Node:
    """``torch.sym_sum``: one size from a list of sizes and integers (a padded length)."""
    total = items[0] if isinstance(items[0], Node) else ctx.index(int(items[0]))
    for item in items[1:]:
        total = _sym("iadd")(ctx, total, item)
    return total


SYMINT_OPS[torch.sym_sum] = _sym_sum


def _sym_pow(ctx: Importer, a: Any, b: Any) -> Node:
    """A size to a small constant power (a patch grid's area): repeated products."""
    if not isinstance(b, int) or not 0 <= b <= 8:
        raise LoweringError(f"a size to the power {b}")
    total = ctx.index(1)
    for _ in range(b):
        total = _sym("imul")(ctx, total, a)
    return total


SYMINT_OPS[operator.pow] = _sym_pow
SYMINT_OPS[operator.neg] = lambda ctx, a: ctx.graph.add("isub", (ctx.index(0), a))
# SymInt / SymInt is a SymFloat (BatchNorm's unbiased-variance factor n / (n - 1)): a 0-d
# f64 tensor computed from the index values, which tensor ops then read as a scalar.
SYMINT_OPS[operator.truediv] = lambda ctx, a, b: ctx.graph.add("div", (_sym_float(ctx, a), _sym_float(ctx, b)))
SYMINT_OPS[torch.sym_float] = lambda ctx, a: _sym_float(ctx, a)


def _sym_float(ctx: Importer, a: Any) -> Node:
    if isinstance(a, Node) and not a.is_index:
        return convert(ctx, a, "f64")
    if isinstance(a, float):
        return scalar(ctx, a, "f64")
    n = a if isinstance(a, Node) else ctx.index(int(a))
    return ctx.graph.add("index_to_tensor", (n,), {"dtype": "f64"})


SYMINT_OPS[operator.mod] = lambda ctx, a, b: ctx.graph.add("isub", (a, _sym("imul")(ctx, _sym("ifloordiv")(ctx, a, b), b)))


def _sym_compare(op: str) -> Callable[..., Node]:
    """A SymInt comparison (``u0 >= 0`` for a runtime assert): a 0-d bool tensor."""

    def fn(ctx: Importer, a: Any, b: Any) -> Node:
        if _is_symfloat(a) or _is_symfloat(b):  # a SymFloat side: compared as doubles
            return elementwise(ctx, op, [_sym_float(ctx, a), _sym_float(ctx, b)], "f64")
        tensors = [ctx.graph.add("index_to_tensor", (v if isinstance(v, Node) else ctx.index(int(v)),), {"dtype": "i64"}) for v in (a, b)]
        return elementwise(ctx, op, tensors, "i64")

    return fn


for _t, _op in {operator.eq: "eq", operator.ne: "ne", operator.lt: "lt", operator.le: "le", operator.gt: "gt", operator.ge: "ge"}.items():
    SYMINT_OPS[_t] = _sym_compare(_op)


@lower(aten.sym_size.int)
def _sym_size(ctx: Importer, fx_node, x: Node, axis: int) -> Node:
    return ctx.index(x.shape[norm_axis(axis, x.tensor_type.rank)])


@lower(aten.sym_numel.default)
def _sym_numel(ctx: Importer, fx_node, x: Node) -> Node:
    return ctx.index(x.tensor_type.numel())


# -- no-ops and asserts ----------------------------------------------------------------
@lower(aten.clone.default, aten.alias.default, aten.detach.default, aten.detach_.default, aten.lift_fresh_copy.default, aten.contiguous.default)
def _identity(ctx: Importer, fx_node, x: Node, *args, **kwargs) -> Node:
    return x


@lower(aten._assert_tensor_metadata.default, aten._assert_scalar.default, aten.sym_constrain_range_for_size.default, aten.sym_constrain_range.default)
def _drop(ctx: Importer, fx_node, *args, **kwargs) -> None:
    return None


@lower(aten._to_copy.default, torch.ops.prims.convert_element_type.default)
def _to_copy(ctx: Importer, fx_node, x: Node, *args, **kwargs) -> Node:
    return convert(ctx, x, meta_dtype(fx_node))


# -- elementwise -------------------------------------------------------------------------
_UNARY = {
    aten.neg: "neg", aten.abs: "abs", aten.sign: "sign", aten.exp: "exp", aten.expm1: "expm1", aten.log: "log",
    aten.log1p: "log1p", aten.sqrt: "sqrt", aten.rsqrt: "rsqrt", aten.reciprocal: "reciprocal", aten.tanh: "tanh",
    aten.sigmoid: "sigmoid", aten.sin: "sin", aten.cos: "cos", aten.erf: "erf", aten.floor: "floor", aten.ceil: "ceil",
    aten.round: "round", aten.relu: "relu", aten.bitwise_not: "bitwise_not", aten.silu: "silu",
    aten.log2: "log2", aten.log10: "log10", aten.tan: "tan", aten.asin: "asin", aten.acos: "acos", aten.atan: "atan",
    aten.sinh: "sinh", aten.cosh: "cosh", aten.asinh: "asinh", aten.acosh: "acosh", aten.atanh: "atanh",
}


def _unary(op: str) -> Callable[..., Node]:
    def fn(ctx: Importer, fx_node, x: Node, **kwargs: Any) -> Node:
        if kwargs:  # an overload with options (round's decimals): never drop one silently
            raise LoweringError(f"{op} with {sorted(kwargs)}")
        return elementwise(ctx, op, [x], meta_dtype(fx_node))

    return fn


for _t, _op in _UNARY.items():
    LOWERINGS[_t] = _unary(_op)


@lower(aten.round.decimals)
def _round_decimals(ctx: Importer, fx_node, x: Node, *, decimals: int = 0) -> Node:
    # Eager's kernel, in float for 16-bit inputs: round(x * 10^d) / 10^d, or for d < 0
    # round(x / 10^-d) * 10^-d (10^-d itself is not exact in binary).
    dtype = meta_dtype(fx_node)
    if decimals == 0:
        return elementwise(ctx, "round", [x], dtype)
    math_dtype = "f32" if dtype in ("f16", "bf16") else dtype
    scale, (apply, undo) = float(10 ** abs(decimals)), (("mul", "div") if decimals > 0 else ("div", "mul"))
    scaled = elementwise(ctx, apply, [convert(ctx, x, math_dtype), scale], math_dtype)
    return convert(ctx, elementwise(ctx, undo, [elementwise(ctx, "round", [scaled], math_dtype), scale], math_dtype), dtype)


@lower(aten.isnan.default)
def _isnan(ctx: Importer, fx_node, x: Node) -> Node:
    return ctx.graph.add("isnan", (x,))


@lower(aten.isinf.default)
def _isinf(ctx: Importer, fx_node, x: Node) -> Node:
    return ctx.graph.add("isinf", (x,))


@lower(aten.logical_not.default)
def _logical_not(ctx: Importer, fx_node, x: Node) -> Node:
    return ctx.graph.add("logical_not", (convert(ctx, x, "i1"),))


@lower(aten.gelu.default)
def _gelu(ctx: Importer, fx_node, x: Node, approximate: str = "none") -> Node:
    return ctx.graph.add("gelu_tanh" if approximate == "tanh" else "gelu", (x,))


_BINARY = {
    aten.add: "add", aten.sub: "sub", aten.mul: "mul", aten.div: "div", aten.true_divide: "div", aten.maximum: "maximum",
    aten.minimum: "minimum", aten.remainder: "remainder", aten.fmod: "fmod", aten.atan2: "atan2",
    aten.bitwise_and: "bitwise_and", aten.bitwise_or: "bitwise_or", aten.bitwise_xor: "bitwise_xor",
    aten.bitwise_left_shift: "shift_left", aten.bitwise_right_shift: "shift_right", aten.__lshift__: "shift_left", aten.__rshift__: "shift_right",
}
_LOGICAL = {aten.logical_and: "logical_and", aten.logical_or: "logical_or", aten.logical_xor: "logical_xor"}
_COMPARE = {aten.eq: "eq", aten.ne: "ne", aten.lt: "lt", aten.le: "le", aten.gt: "gt", aten.ge: "ge"}


def _binary(op: str) -> Callable[..., Node]:
    def fn(ctx: Importer, fx_node, a: Any, b: Any, alpha: Any = 1, rounding_mode: str | None = None, **kw) -> Node:
        out = meta_dtype(fx_node)
        if alpha != 1:
            b = elementwise(ctx, "mul", [b, alpha], out)
        if op == "div" and rounding_mode is not None:
            cdt = result_type(fx_node, a, b)
            q = elementwise(ctx, "floor_div" if rounding_mode == "floor" else "div", [a, b], cdt)
            if rounding_mode == "trunc" and cdt in FLOAT_DTYPES:  # float div is exact division: round it toward 0
                q = select(ctx, elementwise(ctx, "lt", [q, 0.0], cdt), elementwise(ctx, "ceil", [q], cdt), elementwise(ctx, "floor", [q], cdt), cdt)
            return convert(ctx, q, out)
        return elementwise(ctx, op, [a, b], out)

    return fn


for _t, _op in _BINARY.items():
    LOWERINGS[_t] = _binary(_op)
# torch.min(a, b) and torch.max(a, b): elementwise overloads that share the reductions' names
LOWERINGS[aten.min.other] = _binary("minimum")
LOWERINGS[aten.max.other] = _binary("maximum")
# a & b, a | b, a ^ b (tensor or scalar b): the operators' names for the bitwise ops, bools included
LOWERINGS[aten.__and__] = _binary("bitwise_and")
LOWERINGS[aten.__or__] = _binary("bitwise_or")
LOWERINGS[aten.__xor__] = _binary("bitwise_xor")
for _t, _op in _LOGICAL.items():
    LOWERINGS[_t] = (lambda op: lambda ctx, fx_node, a, b: elementwise(ctx, op, [a, b], "i1"))(_op)
for _t, _op in _COMPARE.items():
    LOWERINGS[_t] = (lambda op: lambda ctx, fx_node, a, b: elementwise(ctx, op, [a, b], result_type(fx_node, a, b)))(_op)


# Exponents PyTorch's pow kernels (CPU and CUDA) compute as products, a square root or a reciprocal
# rather than with pow: the same operations here give eager's bits, and they vectorise where a libm
# pow does not (GPT-2's tanh-GELU spent 5 ms a layer in pow(x, 3.0)).
_POW_AS_PRODUCTS: dict[float, Callable[[Importer, Node, str], Node]] = {
    2.0: lambda ctx, x, t: elementwise(ctx, "mul", [x, x], t),
    3.0: lambda ctx, x, t: elementwise(ctx, "mul", [elementwise(ctx, "mul", [x, x], t), x], t),
    0.5: lambda ctx, x, t: ctx.graph.add("sqrt", (x,)),
    -1.0: lambda ctx, x, t: elementwise(ctx, "div", [1.0, x], t),
    -2.0: lambda ctx, x, t: elementwise(ctx, "div", [1.0, elementwise(ctx, "mul", [x, x], t)], t),
}


@lower(aten.pow)
def _pow(ctx: Importer, fx_node, a: Any, b: Any) -> Node:
    out = meta_dtype(fx_node)
    exponent = float(b) if isinstance(b, (int, float)) and not isinstance(b, bool) else None
    if isinstance(a, Node) and a.dtype == out and out in ("f32", "f64") and exponent in _POW_AS_PRODUCTS:
        return _POW_AS_PRODUCTS[exponent](ctx, a, out)
    return elementwise(ctx, "pow", [a, b], out)


@lower(aten.rsub)
def _rsub(ctx: Importer, fx_node, a: Any, b: Any, alpha: Any = 1) -> Node:
    out = meta_dtype(fx_node)
    if alpha != 1:
        a = elementwise(ctx, "mul", [a, alpha], out)
    return elementwise(ctx, "sub", [b, a], out)


@lower(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(ctx: Importer, fx_node, cond: Any, a: Any, b: Any) -> Node:
    return select(ctx, cond, a, b, meta_dtype(fx_node))


@lower(aten.clamp, aten.clamp_min, aten.clamp_max)
def _clamp(ctx: Importer, fx_node, x: Node, lo: Any = None, hi: Any = None) -> Node:
    dtype = meta_dtype(fx_node)
    if fx_node.target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        lo, hi = None, lo
    out = convert(ctx, x, dtype)
    if lo is not None:
        out = elementwise(ctx, "maximum", [out, lo], dtype)
    if hi is not None:
        out = elementwise(ctx, "minimum", [out, hi], dtype)
    return out


# -- creation ---------------------------------------------------------------------------
@lower(aten.full.default)
def _full(ctx: Importer, fx_node, size: Sequence[Any], value: Any, **kw) -> Node:
    shape = [size_value(ctx, s) for s in size]
    return broadcast_to(ctx, scalar(ctx, value, meta_dtype(fx_node)), shape)


@lower(aten.full_like.default)
def _full_like(ctx: Importer, fx_node, x: Node, value: Any, **kw) -> Node:
    return broadcast_to(ctx, scalar(ctx, value, meta_dtype(fx_node)), x.shape)


@lower(aten.zeros_like.default, aten.ones_like.default)
def _zeros_ones_like(ctx: Importer, fx_node, x: Node, **kw) -> Node:
    value = 0 if fx_node.target is aten.zeros_like.default else 1
    return broadcast_to(ctx, scalar(ctx, value, meta_dtype(fx_node)), x.shape)


@lower(aten.scalar_tensor.default)
def _scalar_tensor(ctx: Importer, fx_node, value: Any, **kw) -> Node:
    return scalar(ctx, value, meta_dtype(fx_node))


@lower(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(ctx: Importer, fx_node, *args: Any, **kw) -> Node:
    nums = [a for a in args]
    start, end, step = (0, nums[0], 1) if len(nums) == 1 else (nums[0], nums[1], nums[2] if len(nums) > 2 else 1)
    dtype = meta_dtype(fx_node)
    if all(isinstance(v, (int, float)) for v in (start, end, step)) and step != 0:
        length: DimLike = max(math.ceil((end - start) / step), 0)  # torch's size rule, in double
    elif not all(isinstance(v, (int, Node)) for v in (start, end, step)) or isinstance(step, Node) or step <= 0:
        raise LoweringError("arange with a dynamic bound and a floating-point, dynamic or negative step")
    else:
        length = (as_expr(size_value(ctx, end)) - as_expr(size_value(ctx, start))).ceildiv(step)
    out = ctx.graph.add("iota", (ctx.index(length),), {"dtype": dtype})
    if step != 1:
        out = elementwise(ctx, "mul", [out, step], dtype)
    if not (isinstance(start, int) and start == 0):
        out = elementwise(ctx, "add", [out, start], dtype)
    return out


def _tri(upper: bool) -> Callable[..., Node]:
    def fn(ctx: Importer, fx_node, x: Node, diagonal: int = 0) -> Node:
        rank = x.tensor_type.rank
        return _where(ctx, fx_node, triangle(ctx, x.shape[rank - 2], x.shape[rank - 1], upper, diagonal), x, 0)

    return fn


LOWERINGS[aten.triu.default] = _tri(True)
LOWERINGS[aten.tril.default] = _tri(False)


# The rest of the table lives beside this file, split by topic.
from disc.frontends.torch import lowering_attention, lowering_composite, lowering_movement, lowering_nn, lowering_pointwise  # noqa: E402,F401
