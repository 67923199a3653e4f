"""Reductions over a set of axes (sum, max, min, prod, any, all)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from disc.ir.lazy_torch import torch
from disc.ir.registry import REDUCTION, ShapeContext, ShapeRuleError, normalize_axis, register, same_dtype_as, tensor
from disc.ir.types import Type

if TYPE_CHECKING:
    from disc.ir.graph import Node

REDUCE_KINDS = ("sum", "max", "min", "prod", "any", "all")


def reduced_shape(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    x = tensor(types[0], ctx.op)
    axes = {normalize_axis(a, x.rank, ctx.op) for a in attrs["dims"]}
    if len(axes) != len(attrs["dims"]):
        raise ShapeRuleError(f"{ctx.op}: repeated axis in {attrs['dims']}")
    if "kind" in attrs and attrs["kind"] not in REDUCE_KINDS:
        raise ShapeRuleError(f"{ctx.op}: unknown kind {attrs['kind']!r}; expected one of {REDUCE_KINDS}")
    if attrs["keepdim"]:
        return tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    return tuple(d for i, d in enumerate(x.shape) if i not in axes)


def spreads_back_onto_its_rows(spread: Node, reduction: Node) -> bool:
    """Whether broadcast ``spread``, of ``reduction``'s result (or a value of its shape, with or
    without unit dims inserted: ``x.mean(-1).unsqueeze(-1)``), puts each reduced value back on
    the elements it was reduced from: the kept dims onto themselves, in the reduction's operand's
    rank. ``x - x.amax(1)`` on an [n, n] tensor does not (row j's max lands on column j);
    ``x - x.amax(1, keepdim=True)`` does. Unit dims read index 0 wherever they are spread, so
    only the other dims are compared."""
    rank = len(reduction.inputs[0].shape)
    dims = reduction.attrs["dims"]
    kept = list(range(rank)) if reduction.attrs.get("keepdim") else [d for d in range(rank) if d not in dims]
    if len(spread.shape) != rank:
        return False
    if list(spread.attrs["dims"]) == kept:
        return True
    operand = spread.inputs[0].shape
    spread_to = [(d, to) for d, to in zip(operand, spread.attrs["dims"]) if d != 1]
    kept_at = [(d, at) for d, at in zip(reduction.shape, kept) if d != 1]
    return spread_to == kept_at


@register("reduce", "x", attrs={"dims": (), "kind": "sum", "keepdim": False}, dtype=same_dtype_as(0), shape=reduced_shape, category=REDUCTION)
def reduce(x: torch.Tensor, *, dims: tuple[int, ...], kind: str, keepdim: bool) -> torch.Tensor:
    """Reduce ``dims`` with ``kind``. Max/min of an empty range is an error, as in torch."""
    if not dims:
        return x.clone()
    if kind == "sum":
        return torch.sum(x, dim=dims, keepdim=keepdim, dtype=x.dtype)
    if kind == "prod":
        out = x
        for d in sorted(dims, reverse=True):
            out = torch.prod(out, dim=d, keepdim=keepdim, dtype=x.dtype)
        return out
    if kind == "max":
        return torch.amax(x, dim=dims, keepdim=keepdim)
    if kind == "min":
        return torch.amin(x, dim=dims, keepdim=keepdim)
    if kind == "any":
        return torch.any(x, dim=dims, keepdim=keepdim) if len(dims) > 0 else x
    if kind == "all":
        return torch.all(x, dim=dims, keepdim=keepdim)
    raise ValueError(kind)
