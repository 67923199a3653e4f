"""Indexing and layout ops: slice, concat, pad, gather, index_select, scatter_add, cumsum, nonzero.

Conventions shared by this module:

* ``axis`` attributes are required and may be negative (counted from the end).
* ``slice`` takes ``start``/``stop`` as index operands, so a slice whose bounds
  come from the shape computation (``x[:, :seq_len]``) stays symbolic. The
  frontend normalises them (no negative or out-of-range bounds); the shape
  rule records what it could not prove as run-time checks.
* Index tensors are i64, as in torch (``index_select`` also takes i32).
  Index *values* out of range are a run-time data error, not a shape fact.
* ``nonzero`` is the one op whose result size depends on data: its count is a
  symbol of its own (``count`` attribute), known only once the op has run.
* Where torch requires one dim to be at least another (``gather``'s index may
  be smaller than its source), the rule proves it or records a ``>=`` check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from disc.ir.lazy_torch import torch
from disc.ir.registry import (
    MOVEMENT,
    REDUCTION,
    REQUIRED,
    ShapeContext,
    ShapeRuleError,
    index_value,
    normalize_axis,
    register,
    same_dtype_as,
    tensor,
)
from disc.ir.types import Type
from disc.shape.expr import DimLike, as_expr

INDEX_DTYPES = ("i64",)


def require_ge(ctx: ShapeContext, a: DimLike, b: DimLike, why: str) -> None:
    """Op semantics need ``a >= b``: proven, a compile-time error, or a run-time check."""
    c = ctx.constraints
    if c.prove_ge(a, b):
        return
    if c.prove_ge(b, as_expr(a) + 1):
        raise ShapeRuleError(f"{ctx.op}: {why}: {a} < {b}")
    c.assume(a, ">=", b, f"{ctx.op}: {why}")


def _check_int(ctx: ShapeContext, name: str, v: Any) -> int:
    ctx.check(isinstance(v, int) and not isinstance(v, bool), f"attribute {name} must be an int, got {v!r}")
    return v


def _index_tensor(ctx: ShapeContext, t: Type, what: str, dtypes: Sequence[str] = INDEX_DTYPES):
    t = tensor(t, ctx.op, what)
    if t.dtype not in dtypes:
        raise ShapeRuleError(f"{ctx.op}: {what} must have dtype {' or '.join(dtypes)}, got {t.dtype}")
    return t


def _axis(ctx: ShapeContext, axis: Any, rank: int) -> int:
    _check_int(ctx, "axis", axis)
    return normalize_axis(axis, rank, ctx.op)


# -- slice ---------------------------------------------------------------------------
def _slice_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    x = tensor(types[0], "slice", "operand x")
    ctx.check(x.rank >= 1, "operand x must have rank >= 1")
    axis = _axis(ctx, attrs["axis"], x.rank)
    step = _check_int(ctx, "step", attrs["step"])
    ctx.check(step >= 1, f"step must be >= 1, got {step}")
    start = index_value(types[1], "slice", "start operand")
    stop = index_value(types[2], "slice", "stop operand")
    n = x.shape[axis]
    require_ge(ctx, start, 0, "start must be >= 0")
    require_ge(ctx, stop, start, "stop must be >= start")
    require_ge(ctx, n, stop, f"stop must be <= x dim {axis}")
    out = list(x.shape)
    out[axis] = (as_expr(stop) - start).ceildiv(step)
    return tuple(out)


@register("slice", "x start stop", attrs={"axis": REQUIRED, "step": 1}, dtype=same_dtype_as(0), shape=_slice_rule, category=MOVEMENT)
def slice_(x: torch.Tensor, start: int, stop: int, *, axis: int, step: int) -> torch.Tensor:
    """``x[..., start:stop:step, ...]`` along ``axis``; 0 <= start <= stop <= dim."""
    index = [slice(None)] * x.dim()
    index[axis] = slice(start, stop, step)
    return x[tuple(index)]


# -- concat ----------------------------------------------------------------------------
def _concat_dtype(types: Sequence[Type], attrs: Mapping[str, Any]) -> str:
    if not types:
        raise ShapeRuleError("concat: needs at least one operand")
    dtypes = [tensor(t, "concat", f"operand {i}").dtype for i, t in enumerate(types)]
    for i, dt in enumerate(dtypes):
        if dt != dtypes[0]:
            raise ShapeRuleError(f"concat: operand {i} has dtype {dt}, operand 0 has {dtypes[0]}")
    return dtypes[0]


def _concat_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    ts = [tensor(t, "concat", f"operand {i}") for i, t in enumerate(types)]
    ctx.check(len(ts) >= 1, "needs at least one operand")
    ref = ts[0]
    ctx.check(ref.rank >= 1, "operands must have rank >= 1")
    axis = _axis(ctx, attrs["axis"], ref.rank)
    total = as_expr(0)
    for i, t in enumerate(ts):
        if t.rank != ref.rank:
            raise ShapeRuleError(f"concat: operand {i} has rank {t.rank}, operand 0 has rank {ref.rank}")
        for d in range(ref.rank):
            if d != axis:
                ctx.equal(t.shape[d], ref.shape[d], f"operand {i} dim {d} must equal operand 0 dim {d}")
        total = total + t.shape[axis]
    out = list(ref.shape)
    out[axis] = total
    return tuple(out)


@register("concat", "*xs", attrs={"axis": REQUIRED}, dtype=_concat_dtype, shape=_concat_rule, category=MOVEMENT)
def concat(*xs: torch.Tensor, axis: int) -> torch.Tensor:
    """Concatenate along ``axis``; the other dims of all operands are equal."""
    return torch.cat(xs, dim=axis)


# -- pad ---------------------------------------------------------------------------------
def _pad_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    x = tensor(types[0], "pad", "operand x")
    low, high = attrs["low"], attrs["high"]
    ctx.check(len(low) == x.rank, f"low {low} must have one entry per dim of x (rank {x.rank})")
    ctx.check(len(high) == x.rank, f"high {high} must have one entry per dim of x (rank {x.rank})")
    ctx.check(isinstance(attrs["value"], (int, float)), f"value must be a number, got {attrs['value']!r}")
    out = []
    for d, (n, lo, hi) in enumerate(zip(x.shape, low, high)):
        _check_int(ctx, f"low[{d}]", lo)
        _check_int(ctx, f"high[{d}]", hi)
        crop = min(lo, 0) + min(hi, 0)
        if crop < 0:
            # Negative padding crops; it may remove at most the whole dim (as in torch).
            require_ge(ctx, n, -crop, f"x dim {d} must be >= {-crop}, the amount cropped by low[{d}]={lo}, high[{d}]={hi}")
        out.append(as_expr(n) + lo + hi)
    return tuple(out)


@register("pad", "x", attrs={"low": REQUIRED, "high": REQUIRED, "value": 0.0}, dtype=same_dtype_as(0), shape=_pad_rule, category=MOVEMENT)
def pad(x: torch.Tensor, *, low: Sequence[int], high: Sequence[int], value: float) -> torch.Tensor:
    """Constant padding: ``low[d]`` / ``high[d]`` elements before / after dim d (negative: crop)."""
    spec: list[int] = []
    for lo, hi in zip(reversed(low), reversed(high)):  # constant_pad_nd lists the last dim first
        spec += [lo, hi]
    return torch.constant_pad_nd(x, spec, value)


# -- gather / index_select / scatter_add --------------------------------------------------
def _gather_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    x = tensor(types[0], "gather", "operand x")
    index = _index_tensor(ctx, types[1], "operand index")
    ctx.check(x.rank >= 1, "operand x must have rank >= 1")
    if index.rank != x.rank:
        raise ShapeRuleError(f"gather: operand index has rank {index.rank}, operand x has rank {x.rank}")
    axis = _axis(ctx, attrs["axis"], x.rank)
    for d in range(x.rank):
        if d != axis:
            require_ge(ctx, x.shape[d], index.shape[d], f"index dim {d} must be <= x dim {d}")
    return index.shape


def _wrapped(index: torch.Tensor, size: int, wrap_negative: bool) -> torch.Tensor:
    return torch.where(index < 0, index + size, index) if wrap_negative else index


@register("gather", "x index", attrs={"axis": REQUIRED, "wrap_negative": False}, dtype=same_dtype_as(0), shape=_gather_rule, category=MOVEMENT)
def gather(x: torch.Tensor, index: torch.Tensor, *, axis: int, wrap_negative: bool) -> torch.Tensor:
    """``out[i][j] = x[index[i][j]][j]`` for axis 0 (torch.gather); result has index's shape.

    An index outside ``[0, size)`` is an error, as in torch.gather; with ``wrap_negative`` one in
    ``[-size, 0)`` counts from the end (ONNX's GatherElements)."""
    return torch.gather(x, axis, _wrapped(index, x.shape[axis], wrap_negative))


def _index_select_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    x = tensor(types[0], "index_select", "operand x")
    index = _index_tensor(ctx, types[1], "operand index", ("i64", "i32"))
    ctx.check(x.rank >= 1, "operand x must have rank >= 1")
    if index.rank != 1:
        raise ShapeRuleError(f"index_select: operand index must be 1-D, got rank {index.rank}")
    axis = _axis(ctx, attrs["axis"], x.rank)
    out = list(x.shape)
    out[axis] = index.shape[0]
    return tuple(out)


@register(
    "index_select", "x index", attrs={"axis": REQUIRED, "wrap_negative": False}, dtype=same_dtype_as(0), shape=_index_select_rule, category=MOVEMENT
)
def index_select(x: torch.Tensor, index: torch.Tensor, *, axis: int, wrap_negative: bool) -> torch.Tensor:
    """Pick the entries ``index`` (1-D) of ``axis``: embedding lookups, ``x[:, idx]``.

    An index outside ``[0, size)`` is an error (torch.index_select, embedding); with
    ``wrap_negative`` one in ``[-size, 0)`` counts from the end (``x[idx]``, ONNX's Gather)."""
    return torch.index_select(x, axis, _wrapped(index, x.shape[axis], wrap_negative))


def _scatter_dtype(types: Sequence[Type], attrs: Mapping[str, Any]) -> str:
    x, src = tensor(types[0], "scatter_add", "operand x"), tensor(types[2], "scatter_add", "operand src")
    if x.dtype != src.dtype:
        raise ShapeRuleError(f"scatter_add: operand src has dtype {src.dtype}, operand x has {x.dtype}")
    return x.dtype


def _scatter_add_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    x = tensor(types[0], "scatter_add", "operand x")
    index = _index_tensor(ctx, types[1], "operand index")
    src = tensor(types[2], "scatter_add", "operand src")
    ctx.check(x.rank >= 1, "operand x must have rank >= 1")
    for name, t in (("index", index), ("src", src)):
        if t.rank != x.rank:
            raise ShapeRuleError(f"scatter_add: operand {name} has rank {t.rank}, operand x has rank {x.rank}")
    axis = _axis(ctx, attrs["axis"], x.rank)
    for d in range(x.rank):
        require_ge(ctx, src.shape[d], index.shape[d], f"index dim {d} must be <= src dim {d}")
        if d != axis:
            require_ge(ctx, x.shape[d], index.shape[d], f"index dim {d} must be <= x dim {d}")
    return x.shape


@register("scatter_add", "x index src", attrs={"axis": REQUIRED}, dtype=_scatter_dtype, shape=_scatter_add_rule, category=MOVEMENT)
def scatter_add(x: torch.Tensor, index: torch.Tensor, src: torch.Tensor, *, axis: int) -> torch.Tensor:
    """``out = x; out[index[i][j]][j] += src[i][j]`` for axis 0 (torch.scatter_add)."""
    return torch.scatter_add(x, axis, index, src)


# -- cumsum ------------------------------------------------------------------------------------
def _cumsum_dtype(types: Sequence[Type], attrs: Mapping[str, Any]) -> str:
    dt = tensor(types[0], "cumsum", "operand x").dtype
    if dt == "i1":
        raise ShapeRuleError("cumsum: operand x must not be i1 (convert it first)")
    return dt


def _cumsum_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    x = tensor(types[0], "cumsum", "operand x")
    _axis(ctx, attrs["axis"], x.rank)
    return x.shape


@register("cumsum", "x", attrs={"axis": REQUIRED}, dtype=_cumsum_dtype, shape=_cumsum_rule, category=REDUCTION)
def cumsum(x: torch.Tensor, *, axis: int) -> torch.Tensor:
    """Inclusive prefix sum along ``axis``, in x's dtype (the frontend makes torch's promotion explicit)."""
    return torch.cumsum(x, dim=axis, dtype=x.dtype)


# -- nonzero ------------------------------------------------------------------------------------
def _nonzero_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    mask = tensor(types[0], "nonzero", "operand mask")
    ctx.check(mask.rank == 1 and mask.dtype == "i1", f"operand mask must be a 1-D i1 tensor, got {mask}")
    name = attrs["count"]
    ctx.check(isinstance(name, str) and name.isidentifier(), f"attribute count must name a symbol, got {name!r}")
    # The count lies in [0, len(mask)]; only a static length gives the range a finite end.
    n = ctx.normalize(mask.shape[0])
    hi = n if isinstance(n, int) else None
    return (ctx.constraints.new_symbol(name=name, lo=0, hi=hi, source=f"nonzero count of a mask of {mask.shape[0]}"),)


@register("nonzero", "mask", attrs={"count": REQUIRED}, dtype=lambda types, attrs: "i64", shape=_nonzero_rule, category=MOVEMENT)
def nonzero(mask: torch.Tensor, *, count: str) -> torch.Tensor:
    """The positions of ``mask``'s true elements, ascending: ``count`` of them, a size known only at run time."""
    return torch.nonzero(mask).reshape(-1)
