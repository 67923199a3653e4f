"""Compute-bound ops that backends send to a library: dot_general (batched GEMM) and attention
(softmax(q k^T * scale + bias) v, a fused attention kernel on the GPU)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from disc.ir.lazy_torch import torch
from disc.ir.registry import LIBRARY, ShapeContext, ShapeRuleError, register, tensor
from disc.ir.types import Type


def _dot_dtype(types: Sequence[Type], attrs: Mapping[str, Any]) -> str:
    a, b = tensor(types[0], "dot_general"), tensor(types[1], "dot_general")
    if a.dtype != b.dtype:
        raise ShapeRuleError(f"dot_general: operand dtypes differ ({a.dtype} vs {b.dtype})")
    return a.dtype


def _free_dims(rank: int, *used: Sequence[int]) -> list[int]:
    taken = {d for u in used for d in u}
    return [d for d in range(rank) if d not in taken]


def _dot_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    a, b = tensor(types[0], "dot_general"), tensor(types[1], "dot_general")
    lb, rb, lc, rc = attrs["lhs_batch"], attrs["rhs_batch"], attrs["lhs_contract"], attrs["rhs_contract"]
    ctx.check(len(lb) == len(rb), "lhs_batch and rhs_batch differ in length")
    ctx.check(len(lc) == len(rc), "lhs_contract and rhs_contract differ in length")
    for dims, rank, side in ((list(lb) + list(lc), a.rank, "lhs"), (list(rb) + list(rc), b.rank, "rhs")):
        ctx.check(len(set(dims)) == len(dims) and all(0 <= d < rank for d in dims), f"{side} batch/contract dims {dims} invalid for rank {rank}")
    for i, j in zip(lb, rb):
        ctx.equal(a.shape[i], b.shape[j], f"lhs batch dim {i} must equal rhs batch dim {j}")
    for i, j in zip(lc, rc):
        ctx.equal(a.shape[i], b.shape[j], f"lhs contracting dim {i} must equal rhs contracting dim {j}")
    batch = [a.shape[i] for i in lb]
    lfree = [a.shape[i] for i in _free_dims(a.rank, lb, lc)]
    rfree = [b.shape[i] for i in _free_dims(b.rank, rb, rc)]
    return tuple(batch + lfree + rfree)


_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


@register(
    "dot_general",
    "lhs rhs",
    attrs={"lhs_batch": (), "rhs_batch": (), "lhs_contract": (), "rhs_contract": ()},
    dtype=_dot_dtype,
    shape=_dot_rule,
    category=LIBRARY,
)
def dot_general(lhs: torch.Tensor, rhs: torch.Tensor, *, lhs_batch, rhs_batch, lhs_contract, rhs_contract) -> torch.Tensor:
    """Batched matmul: result dims are batch dims, then lhs free dims, then rhs free dims."""
    letters = iter(_LETTERS)
    lsub = [""] * lhs.dim()
    rsub = [""] * rhs.dim()
    for i, j in zip(lhs_batch, rhs_batch):
        lsub[i] = rsub[j] = next(letters)
    for i, j in zip(lhs_contract, rhs_contract):
        lsub[i] = rsub[j] = next(letters)
    for i in range(lhs.dim()):
        lsub[i] = lsub[i] or next(letters)
    for j in range(rhs.dim()):
        rsub[j] = rsub[j] or next(letters)
    out = [lsub[i] for i in lhs_batch]
    out += [lsub[i] for i in _free_dims(lhs.dim(), lhs_batch, lhs_contract)]
    out += [rsub[j] for j in _free_dims(rhs.dim(), rhs_batch, rhs_contract)]
    return torch.einsum(f"{''.join(lsub)},{''.join(rsub)}->{''.join(out)}", lhs, rhs)


def _attention_dtype(types: Sequence[Type], attrs: Mapping[str, Any]) -> str:
    dtypes = {tensor(t, "attention").dtype for t in types}
    if len(dtypes) != 1:
        raise ShapeRuleError(f"attention: query, key, value (and bias) differ in dtype ({', '.join(sorted(dtypes))})")
    return dtypes.pop()


def _attention_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    q, k, v = (tensor(t, "attention") for t in types[:3])
    ctx.check(len(types) <= 4, "attention takes query, key, value and at most one bias")
    ctx.check(q.rank == k.rank == v.rank and q.rank >= 2, f"attention: query, key and value need one rank of at least 2 (got {q.rank}, {k.rank}, {v.rank})")
    for i in range(q.rank - 2):
        ctx.equal(q.shape[i], k.shape[i], f"attention: query and key batch dim {i}")
        ctx.equal(k.shape[i], v.shape[i], f"attention: key and value batch dim {i}")
    ctx.equal(q.shape[-1], k.shape[-1], "attention: query and key head size")
    ctx.equal(k.shape[-2], v.shape[-2], "attention: as many values as keys")
    scores = (*q.shape[:-1], k.shape[-2])
    if len(types) == 4:
        b = tensor(types[3], "attention")
        ctx.check(b.rank == q.rank, f"attention: the bias has the scores' rank {q.rank} (got {b.rank})")
        for i, (x, y) in enumerate(zip(b.shape, scores)):
            ctx.equal(x, y, f"attention: bias dim {i} equals the scores' dim")
    return (*q.shape[:-1], v.shape[-1])


@register("attention", "query key value *bias", attrs={"scale": 1.0}, dtype=_attention_dtype, shape=_attention_rule, category=LIBRARY)
def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *bias: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(query key^T * scale + bias) value over the last dim of the scores; a row whose every
    score is -inf (every key masked) gives 0, as PyTorch's attention does. 16-bit inputs are
    computed in float32 and rounded once, as the fused kernels do."""
    dtype = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    scores = torch.matmul(query.to(dtype), key.to(dtype).transpose(-1, -2)) * scale
    if bias:
        scores = scores + bias[0].to(dtype)
    weights = torch.softmax(scores, dim=-1).masked_fill(torch.isneginf(scores).all(dim=-1, keepdim=True), 0.0)
    return torch.matmul(weights, value.to(dtype)).to(query.dtype)
