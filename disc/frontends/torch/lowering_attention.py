"""Lowering table, part 5: scaled dot-product attention, forward and backward.

``F.scaled_dot_product_attention`` reaches disc in two spellings. ``torch.export``
keeps the composite op. AOTAutograd (plug-in mode) instead sees the fused kernel
PyTorch would pick on the device — ``_scaled_dot_product_flash_attention_for_cpu``
on the CPU, ``_scaled_dot_product_efficient_attention`` or
``_scaled_dot_product_flash_attention`` on CUDA — and, in training, the matching
``*_backward`` op, which reads the forward's ``logsumexp`` output (the log of each
softmax row's denominator, so the backward can rebuild the probabilities).

All of them become the same IR here: GEMMs and a softmax the fusion pass stitches.
Each backward lowers to the textbook formulas over the probabilities rebuilt
from the ``logsumexp`` that the forward lowering produced, so forward and
backward agree by construction. (torch's own decomposition of the CPU kernel
returns the probability matrix where the backward expects ``logsumexp``; used
with the fused backward it gives wrong gradients, so ``dynamo.py`` leaves the
forward to this table.)
"""

from __future__ import annotations

import math
from typing import Any

from disc.frontends.torch.importer import Importer, LoweringError
from disc.frontends.torch.lowering import aten, lower
from disc.frontends.torch.lowering_movement import _permute
from disc.frontends.torch.lowering_nn import _matmul
from disc.ir.builder import convert, elementwise, reduce, reshape, scalar, select, triangle
from disc.ir.graph import Node

MINUS_INF = float("-inf")


def _compute_dtype(q: Node) -> str:
    # 16-bit attention accumulates its softmax and gradients in float32, as the fused kernels do.
    return "f32" if q.dtype in ("f16", "bf16") else q.dtype


def _scale(ctx: Importer, q: Node, scale: Any, dtype: str) -> Any:
    """The user's scale, or 1/sqrt(head size): a number, or a 0-d tensor when the head size is a symbol."""
    if scale is not None:
        return float(scale)
    head = q.shape[-1]
    if isinstance(head, int):
        return 1.0 / math.sqrt(head)
    size = convert(ctx, ctx.index(head), dtype)
    return ctx.graph.add("div", (scalar(ctx, 1.0, dtype), ctx.graph.add("sqrt", (size,))))


def _transpose_last(ctx: Importer, x: Node) -> Node:
    rank = x.tensor_type.rank
    return _permute(ctx, None, x, [*range(rank - 2), rank - 1, rank - 2])


def _same_heads(ctx: Importer, kv_heads: Any, heads: Any) -> bool:
    """Do keys/values have as many heads as the queries? Where a count is symbolic (a view's ``-1``
    that disc could not divide out), equal counts are the only case disc lowers: assumed, and
    checked at run time, rather than the whole op left to PyTorch."""
    if isinstance(kv_heads, int) and isinstance(heads, int):
        return kv_heads == heads
    _agree(ctx, kv_heads, heads, "attention: keys and values have as many heads as the queries (a symbolic head count)")
    return True


def _repeat_heads(ctx: Importer, x: Node, heads: Any) -> Node:
    """Grouped-query attention: key/value head ``j`` serves query heads ``j*g .. j*g+g-1``."""
    if x.tensor_type.rank != 4 or _same_heads(ctx, x.shape[1], heads):
        return x
    kv_heads = x.shape[1]
    if not isinstance(kv_heads, int) or not isinstance(heads, int) or heads % kv_heads:
        raise LoweringError(f"grouped-query attention with {heads} query heads and {kv_heads} key/value heads")
    b, _, s, e = x.shape
    grouped = ctx.graph.add("broadcast_in_dim", (x, *ctx.sizes([b, kv_heads, heads // kv_heads, s, e])), {"dims": (0, 1, 3, 4)})
    return reshape(ctx, grouped, [b, heads, s, e])


def _sum_groups(ctx: Importer, grad: Node, kv_heads: Any) -> Node:
    """The gradient of ``_repeat_heads``: each key/value head sums over the query heads it served."""
    heads = grad.shape[1]
    if grad.tensor_type.rank != 4 or _same_heads(ctx, kv_heads, heads):
        return grad
    b, _, s, e = grad.shape
    grouped = reshape(ctx, grad, [b, kv_heads, heads // kv_heads, s, e])
    return reduce(ctx, grouped, [2], "sum", False)


def _same_dims(ctx: Importer, a: Node, b: Node, axes: range | list[int], what: str) -> None:
    """The op's contract that these dims agree, as facts (checked at run time where not proven).

    A backward graph takes q, k, v, the output and its gradient as separate inputs, whose dims
    torch may spell differently (a ViT's token count as a patch grid's area plus one)."""
    for axis in axes:
        _agree(ctx, a.shape[axis], b.shape[axis], f"attention: {what} (dim {axis})")


def _agree(ctx: Importer, x: Any, y: Any, why: str) -> None:
    """``x == y`` as a fact: proven, or assumed and checked at run time."""
    c = ctx.graph.constraints
    if not c.prove_equal(x, y):
        c.assume(x, "==", y, why)


def _scores(ctx: Importer, fx_node, q: Node, k: Node, mask: Any, is_causal: bool, scale: Any) -> Node:
    """q @ k^T * scale with the mask applied: a bool mask keeps where true, a float mask adds,
    ``is_causal`` keeps key j <= query i. Masked-out scores are -inf."""
    scores = _matmul(ctx, fx_node, q, _transpose_last(ctx, k))
    scores = elementwise(ctx, "mul", [scores, scale], scores.dtype)
    if is_causal:
        scores = select(ctx, triangle(ctx, q.shape[-2], k.shape[-2], upper=False), scores, MINUS_INF, scores.dtype)
    if mask is not None:
        if mask.dtype == "i1":
            scores = select(ctx, mask, scores, MINUS_INF, scores.dtype)
        else:
            scores = elementwise(ctx, "add", [scores, convert(ctx, mask, scores.dtype)], scores.dtype)
    return scores


def attention(ctx: Importer, fx_node, q: Node, k: Node, v: Node, mask: Any, is_causal: bool, scale: Any) -> tuple[Node, Node]:
    """softmax(scores) @ v and the softmax rows' log-denominators ``logsumexp`` (float32, [..., L]).

    A row whose every key is masked gives 0 (eager's fused kernels do) and ``logsumexp`` -inf.
    """
    out_dtype, dtype = q.dtype, _compute_dtype(q)
    scale = _scale(ctx, q, scale, dtype)
    q, k, v = (convert(ctx, t, dtype) for t in (q, k, v))
    k, v = _repeat_heads(ctx, k, q.shape[1]), _repeat_heads(ctx, v, q.shape[1])
    scores = _scores(ctx, fx_node, q, k, mask, is_causal, scale)
    last = scores.tensor_type.rank - 1
    peak = reduce(ctx, scores, [last], "max", True)
    exp = ctx.graph.add("exp", (elementwise(ctx, "sub", [scores, peak], dtype),))
    total = reduce(ctx, exp, [last], "sum", True)
    weights = elementwise(ctx, "div", [exp, total], dtype)
    lse = elementwise(ctx, "add", [ctx.graph.add("log", (total,)), peak], dtype)
    if mask is not None or is_causal:  # exp(-inf - -inf) is NaN: such rows give 0
        empty = elementwise(ctx, "eq", [peak, MINUS_INF], dtype)
        weights = select(ctx, empty, 0.0, weights, dtype)
        lse = select(ctx, empty, MINUS_INF, lse, dtype)
    out = convert(ctx, _matmul(ctx, fx_node, weights, v), out_dtype)
    lse = reshape(ctx, lse, list(lse.shape[:-1]))  # float32 for 16-bit inputs, as the fused kernels keep it
    return out, lse


def attention_backward(
    ctx: Importer, fx_node, grad_out: Node, q: Node, k: Node, v: Node, out: Node, lse: Node, mask: Any, is_causal: bool, scale: Any
) -> tuple[Node, Node, Node]:
    """Gradients of q, k and v, from the probabilities P = exp(scores - logsumexp):
    dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q."""
    dtypes = (q.dtype, k.dtype, v.dtype)
    dtype = _compute_dtype(q)
    scale = _scale(ctx, q, scale, dtype)
    kv_heads = k.shape[1] if k.tensor_type.rank == 4 else None
    grad_out, q, k, v, out, lse = (convert(ctx, t, dtype) for t in (grad_out, q, k, v, out, lse))
    rank = q.tensor_type.rank
    _same_dims(ctx, grad_out, q, range(rank), "the output gradient has the query's shape")
    _same_dims(ctx, out, q, range(rank), "the output has the query's shape")
    _same_dims(ctx, lse, q, range(rank - 1), "logsumexp has one value per query")
    _same_dims(ctx, k, q, [*range(rank - 3), rank - 1], "keys share the queries' batch and head size")
    _same_dims(ctx, v, k, range(rank - 1), "values share the keys' batch, heads and length")
    k, v = _repeat_heads(ctx, k, q.shape[1]), _repeat_heads(ctx, v, q.shape[1])
    scores = _scores(ctx, fx_node, q, k, mask, is_causal, scale)
    row = reshape(ctx, lse, [*lse.shape, 1])
    probs = ctx.graph.add("exp", (elementwise(ctx, "sub", [scores, row], dtype),))
    if mask is not None or is_causal:
        probs = select(ctx, elementwise(ctx, "eq", [row, MINUS_INF], dtype), 0.0, probs, dtype)
    grad_v = _matmul(ctx, fx_node, _transpose_last(ctx, probs), grad_out)
    grad_probs = _matmul(ctx, fx_node, grad_out, _transpose_last(ctx, v))
    last = grad_out.tensor_type.rank - 1
    delta = reduce(ctx, elementwise(ctx, "mul", [grad_out, out], dtype), [last], "sum", True)
    grad_scores = elementwise(ctx, "mul", [probs, elementwise(ctx, "sub", [grad_probs, delta], dtype)], dtype)
    grad_scores = elementwise(ctx, "mul", [grad_scores, scale], dtype)
    grad_q = _matmul(ctx, fx_node, grad_scores, k)
    grad_k = _matmul(ctx, fx_node, _transpose_last(ctx, grad_scores), q)
    if kv_heads is not None:
        grad_k, grad_v = _sum_groups(ctx, grad_k, kv_heads), _sum_groups(ctx, grad_v, kv_heads)
    return tuple(convert(ctx, g, d) for g, d in zip((grad_q, grad_k, grad_v), dtypes))  # type: ignore[return-value]


def _no_dropout(op: str, dropout_p: float) -> None:
    # Lowered forward and backward must draw the same mask; neither does yet, so both stay in PyTorch.
    if dropout_p:
        raise LoweringError(f"{op} with dropout")


@lower(aten.scaled_dot_product_attention.default)
def _sdpa(ctx: Importer, fx_node, q: Node, k: Node, v: Node, mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False, *, scale: Any = None, enable_gqa: bool = False) -> Node:
    _no_dropout("scaled_dot_product_attention", dropout_p)
    if q.tensor_type.rank == 4 and k.shape[1] != q.shape[1] and not enable_gqa:
        raise LoweringError("scaled_dot_product_attention with different query and key heads and enable_gqa=False")
    return attention(ctx, fx_node, q, k, v, mask, is_causal, scale)[0]


@lower(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _flash_cpu(ctx: Importer, fx_node, q: Node, k: Node, v: Node, dropout_p: float = 0.0, is_causal: bool = False, *, attn_mask: Any = None, scale: Any = None) -> list[Node]:
    _no_dropout("CPU flash attention", dropout_p)
    return list(attention(ctx, fx_node, q, k, v, attn_mask, is_causal, scale))


@lower(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _flash_cpu_backward(
    ctx: Importer, fx_node, grad_out: Node, q: Node, k: Node, v: Node, out: Node, lse: Node, dropout_p: float, is_causal: bool, *, attn_mask: Any = None, scale: Any = None
) -> list[Node]:
    _no_dropout("CPU flash attention", dropout_p)
    return list(attention_backward(ctx, fx_node, grad_out, q, k, v, out, lse, attn_mask, is_causal, scale))
