"""Data-movement ops whose result shape comes from size operands or attributes.

``broadcast_in_dim`` and ``reshape`` take their target sizes as index
operands (DISC's dynamic_broadcast_in_dim / dynamic_reshape), so the shape
computation that feeds them is IR too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from disc.ir.lazy_torch import torch
from disc.ir.payloads import dtype_name
from disc.ir.registry import (
    BROADCAST,
    MOVEMENT,
    SOURCE,
    ShapeContext,
    ShapeRuleError,
    dtype_from_attr,
    index_value,
    register,
    same_dtype_as,
    tensor,
)
from disc.ir.types import ITEMSIZE, Type, torch_dtype
from disc.shape.expr import product


# -- constant ------------------------------------------------------------------------
def _constant_dtype(types: Sequence[Type], attrs: Mapping[str, Any]) -> str:
    if attrs["dtype"] not in ITEMSIZE:
        raise ShapeRuleError(f"constant: unknown dtype {attrs['dtype']!r}")
    return attrs["dtype"]


def _constant_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    if attrs["ref"] is None:
        return ()
    if attrs["ref"] not in ctx.graph.constants:
        raise ShapeRuleError(f"constant: no payload named {attrs['ref']!r}")
    payload = ctx.graph.constants[attrs["ref"]]
    if dtype_name(payload) != attrs["dtype"]:
        raise ShapeRuleError(f"constant: payload {attrs['ref']!r} is {payload.dtype}, attribute says {attrs['dtype']}")
    return tuple(ctx.graph.constants[attrs["ref"]].shape)


@register("constant", "", attrs={"value": None, "dtype": "f32", "ref": None}, dtype=_constant_dtype, shape=_constant_rule, category=SOURCE)
def constant(*, value: Any, dtype: str, ref: torch.Tensor | None) -> torch.Tensor:
    """A literal: a scalar ``value``, or a named payload (weights) in ``Graph.constants``.

    The executor resolves ``ref`` to the payload tensor before calling this.
    """
    if ref is not None:
        return ref
    return torch.tensor(value, dtype=torch_dtype(dtype))


# -- broadcast -----------------------------------------------------------------------
def _broadcast_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    x = tensor(types[0], "broadcast_in_dim")
    target = tuple(index_value(t, "broadcast_in_dim") for t in types[1:])
    dims = attrs["dims"]
    ctx.check(len(dims) == x.rank, f"dims {dims} must have one entry per operand dim (rank {x.rank})")
    ctx.check(len(set(dims)) == len(dims) and all(0 <= d < len(target) for d in dims), f"dims {dims} must be distinct axes of the result (rank {len(target)})")
    ctx.check(list(dims) == sorted(dims), f"dims {dims} must be increasing (use transpose first)")
    c = ctx.constraints
    for i, d in enumerate(dims):
        src, dst = x.shape[i], target[d]
        # Each operand dim is 1 (expanded) or equal to the target dim. When
        # neither is proven the choice is made at run time: exactly the
        # "maybe broadcast" case that speculation specialises later.
        if c.prove_is_one(src) or c.prove_equal(src, dst):
            continue
        if c.prove_not_one(src) and c.prove_not_equal(src, dst):
            raise ShapeRuleError(f"broadcast_in_dim: operand dim {i} ({src}) is neither 1 nor the target dim {d} ({dst})")
    return target


@register("broadcast_in_dim", "x *sizes", attrs={"dims": ()}, dtype=same_dtype_as(0), shape=_broadcast_rule, category=BROADCAST)
def broadcast_in_dim(x: torch.Tensor, *sizes: int, dims: tuple[int, ...]) -> torch.Tensor:
    """Place operand dim i at result dim ``dims[i]`` and expand size-1 dims to ``sizes``."""
    view = [1] * len(sizes)
    for i, d in enumerate(dims):
        view[d] = x.shape[i]
    return x.reshape(view).expand(*sizes)


# -- reshape / transpose ---------------------------------------------------------------
def _reshape_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    x = tensor(types[0], "reshape")
    target = tuple(index_value(t, "reshape") for t in types[1:])
    ctx.equal(product(x.shape), product(target), "element count must be preserved")
    return target


@register("reshape", "x *sizes", dtype=same_dtype_as(0), shape=_reshape_rule, category=MOVEMENT)
def reshape(x: torch.Tensor, *sizes: int) -> torch.Tensor:
    """Row-major reshape to ``sizes`` (a view when the input is contiguous)."""
    return x.reshape(sizes)


def _transpose_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    x = tensor(types[0], "transpose")
    perm = attrs["perm"]
    ctx.check(sorted(perm) == list(range(x.rank)), f"perm {perm} is not a permutation of rank {x.rank}")
    return tuple(x.shape[p] for p in perm)


@register("transpose", "x", attrs={"perm": ()}, dtype=same_dtype_as(0), shape=_transpose_rule, category=MOVEMENT)
def transpose(x: torch.Tensor, *, perm: tuple[int, ...]) -> torch.Tensor:
    """Result dim i is operand dim ``perm[i]``."""
    return x.permute(perm)


# -- iota ----------------------------------------------------------------------------------
def _iota_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    return (index_value(types[0], "iota"),)


@register("iota", "n", attrs={"dtype": "i64"}, dtype=dtype_from_attr(), shape=_iota_rule, category=BROADCAST)
def iota(n: int, *, dtype: str) -> torch.Tensor:
    """``[0, 1, ..., n-1]``; arange with other start/step is iota*step+start."""
    return torch.arange(n, dtype=torch_dtype(dtype))
