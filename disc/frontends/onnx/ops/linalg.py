"""MatMul, Gemm, Einsum and Attention (opsets 23-25)."""

from __future__ import annotations

from typing import Any

import numpy as np

from disc.frontends.arrays import known_ints as _ints
from disc.frontends.onnx.importer import ELEM_TYPES, OnnxImporter
from disc.frontends.onnx.ops import onnx_op
from disc.frontends.onnx.ops.common import known_dim, matmul, require_divisible
from disc.frontends.onnx.ops.control import MAX_UNROLLED
from disc.ir.builder import (
    LoweringError,
    arithmetic,
    batched_matmul,
    broadcast_to,
    convert,
    dim_value,
    einsum,
    elementwise,
    positions,
    reduce,
    reshape,
    scalar,
    select,
)
from disc.ir.graph import Node
from disc.ir.types import numpy_dtype
from disc.shape.expr import DimLike, as_expr


# -- linear algebra ----------------------------------------------------------------------------------
@onnx_op("MatMul")
def _matmul_op(imp: OnnxImporter, node: Any, a: Any, b: Any) -> Node:
    return matmul(imp, imp.tensor(a), imp.tensor(b))


@onnx_op("Einsum")
def _einsum(imp: OnnxImporter, node: Any, *xs: Any, equation: str = "") -> Node:
    return einsum(imp, equation, [imp.tensor(x) for x in xs])


@onnx_op("Gemm")
def _gemm(imp: OnnxImporter, node: Any, a: Any, b: Any, c: Any = None, alpha: float = 1.0, beta: float = 1.0, transA: int = 0, transB: int = 0) -> Node:
    x, y = imp.tensor(a), imp.tensor(b)
    if transA:
        x = imp.graph.add("transpose", (x,), {"perm": (1, 0)})
    if transB:
        y = imp.graph.add("transpose", (y,), {"perm": (1, 0)})
    out = matmul(imp, x, y)
    if alpha != 1.0:
        out = elementwise(imp, "mul", [out, alpha], out.dtype)
    if c is not None:
        bias = imp.tensor(c)
        if beta != 1.0:
            bias = elementwise(imp, "mul", [bias, beta], out.dtype)
        out = elementwise(imp, "add", [out, bias], out.dtype)
    return out


# -- attention ------------------------------------------------------------------------------------------
def _split_heads(imp: OnnxImporter, x: Node, heads: int) -> Node:
    """[batch, seq, heads * size] -> [batch, heads, seq, size]."""
    b, s, hidden = x.shape
    require_divisible(imp, hidden, heads, f"Attention: the hidden dim must be divisible by the {heads} heads")
    return imp.graph.add("transpose", (reshape(imp, x, [b, s, heads, as_expr(hidden) // heads]),), {"perm": (0, 2, 1, 3)})


def _repeat_heads(imp: OnnxImporter, x: Node, reps: int) -> Node:
    """Each of K's or V's heads used by ``reps`` consecutive query heads (grouped-query attention)."""
    b, h, s, d = x.shape
    wide = imp.graph.add("broadcast_in_dim", (x, *imp.sizes([b, h, reps, s, d])), {"dims": (0, 1, 3, 4)})
    return reshape(imp, wide, [b, as_expr(h) * reps, s, d])


@onnx_op("Det")
def _det(imp: OnnxImporter, node: Any, x: Any) -> Node:
    """The determinant of each [n, n] matrix of the last two dims, n known and at most 4: the sum
    over permutations of signed products (24 terms at n = 4), in float64 and rounded once, which
    for such n is as accurate as an LU factorisation and needs no pivoting."""
    import itertools

    a = imp.tensor(x)
    rank = a.tensor_type.rank
    n, m = (known_dim(d) for d in a.shape[-2:]) if rank >= 2 else (None, None)
    if n is None or n != m or not 1 <= n <= 4:
        raise LoweringError(f"Det of matrices {a.shape[-2:] if rank >= 2 else a.shape}: disc takes square ones of a known size up to 4")
    batch = list(a.shape[:-2])
    wide = convert(imp, a, "f64")

    def entry(i: int, j: int) -> Node:
        row = imp.graph.add("slice", (wide, imp.index(i), imp.index(i + 1)), {"axis": rank - 2, "step": 1})
        return reshape(imp, imp.graph.add("slice", (row, imp.index(j), imp.index(j + 1)), {"axis": rank - 1, "step": 1}), batch)

    cells = {(i, j): entry(i, j) for i in range(n) for j in range(n)}
    total = None
    for perm in itertools.permutations(range(n)):
        inversions = sum(perm[i] > perm[j] for i in range(n) for j in range(i + 1, n))
        term = cells[0, perm[0]]
        for i in range(1, n):
            term = elementwise(imp, "mul", [term, cells[i, perm[i]]], "f64")
        if total is None:
            total = term if inversions % 2 == 0 else elementwise(imp, "neg", [term], "f64")
        else:
            total = elementwise(imp, "sub" if inversions % 2 else "add", [total, term], "f64")
    return convert(imp, total, a.dtype)


def _call_modifier(imp: OnnxImporter, body: Any, value: Node) -> Node:
    """FlexAttention's score_mod or prob_mod applied to ``value``: one output, of its shape and type."""
    outs = imp.call_graph(body, [value])
    if len(outs) != 1:
        raise LoweringError(f"subgraph {body.name!r} gives {len(outs)} outputs; a modifier gives 1")
    result = imp.tensor(outs[0])
    if not imp.graph.constraints.prove_same_shape(result.shape, value.shape) or result.dtype != value.dtype:
        raise LoweringError(f"subgraph {body.name!r} must keep its input's shape and type: {value.dtype}{list(value.shape)} became {result.dtype}{list(result.shape)}")
    return result


@onnx_op("FlexAttention")
def _flex_attention(imp: OnnxImporter, node: Any, q: Any, k: Any, v: Any, scale: float | None = None, score_mod: Any = None, prob_mod: Any = None, softmax_precision: int | None = None) -> Node:
    """Scores (Q and K each scaled by sqrt(scale), as ONNX's reference), score_mod, softmax,
    prob_mod, then the values: in softmax_precision (float32 unless the inputs are double),
    the result in V's type. K/V heads are shared by consecutive query heads (GQA)."""
    q, k, v = imp.tensor(q), imp.tensor(k), imp.tensor(v)
    if q.tensor_type.rank != 4 or k.tensor_type.rank != 4 or v.tensor_type.rank != 4:
        raise LoweringError(f"FlexAttention takes rank-4 Q, K, V (ranks {q.tensor_type.rank}, {k.tensor_type.rank}, {v.tensor_type.rank})")
    k, v, scale = _shared_heads_and_scale(imp, "FlexAttention", q, k, v, scale)
    work = ELEM_TYPES.get(softmax_precision, "f32") if softmax_precision else ("f64" if q.dtype == "f64" else "f32")
    root = float(np.sqrt(np.float32(scale)))
    qs, ks = elementwise(imp, "mul", [q, root], q.dtype), elementwise(imp, "mul", [k, root], k.dtype)
    scores = convert(imp, batched_matmul(imp, qs, imp.graph.add("transpose", (ks,), {"perm": (0, 1, 3, 2)})), work)
    if score_mod is not None:
        scores = _call_modifier(imp, score_mod, scores)
    shifted = elementwise(imp, "sub", [scores, reduce(imp, scores, [3], "max", True)], work)
    e = imp.graph.add("exp", (shifted,))
    probs = elementwise(imp, "div", [e, reduce(imp, e, [3], "sum", True)], work)
    if prob_mod is not None:
        probs = _call_modifier(imp, prob_mod, probs)
    return convert(imp, batched_matmul(imp, probs, convert(imp, v, work)), v.dtype)


def _shared_heads_and_scale(imp: OnnxImporter, op: str, q: Node, k: Node, v: Node, scale: float | None) -> tuple[Node, Node, float]:
    """K and V with each head repeated for its group of query heads (grouped-query attention),
    and the scale (1/sqrt(head size) unless given)."""
    hq, hk = known_dim(q.shape[1]), known_dim(k.shape[1])
    if hq is None or hk is None or hq % hk:
        raise LoweringError(f"{op}: query heads ({q.shape[1]}) must be a known multiple of key/value heads ({k.shape[1]})")
    if hq != hk:
        k, v = _repeat_heads(imp, k, hq // hk), _repeat_heads(imp, v, hq // hk)
    if scale is None:
        size = known_dim(q.shape[3])
        if size is None:
            raise LoweringError(f"{op} without a scale needs a known head size (dim 3 of Q: {q.shape[3]})")
        scale = 1.0 / float(np.sqrt(size))
    return k, v, scale


def _attention_allowed(imp: OnnxImporter, sq: DimLike, skv: DimLike, offset: Any, causal: bool, left: int, right: int, nonpad: Node | None) -> Node | None:
    """Which (query, key) pairs may attend, or None for all: the causal frontier key <= query +
    offset, a sliding window around query + offset, and keys before each batch entry's
    ``nonpad`` length. ``offset`` is the cache length (a dim) or, with ``nonpad``, each entry's
    ``nonpad - sq`` (bottom-right alignment)."""
    if not causal and left < 0 and right < 0 and nonpad is None:
        return None
    rows, cols = positions(imp, [sq, skv], 0), positions(imp, [sq, skv], 1)
    if nonpad is not None:  # per batch entry: [batch, 1, sq, skv]
        batch = nonpad.shape[0]
        lengths = imp.graph.add("broadcast_in_dim", (nonpad, *imp.sizes([batch, 1, sq, skv])), {"dims": (0,)})
        start = elementwise(imp, "sub", [lengths, dim_value(imp, sq)], "i64")
    else:
        start = dim_value(imp, offset)
    ahead = elementwise(imp, "sub", [elementwise(imp, "add", [rows, start], "i64"), cols], "i64")  # query position - key
    allowed = []
    if causal:
        allowed.append(elementwise(imp, "ge", [ahead, 0], "i64"))
    if left >= 0:
        allowed.append(elementwise(imp, "le", [ahead, left], "i64"))
    if right >= 0:
        allowed.append(elementwise(imp, "ge", [ahead, -right], "i64"))
    if nonpad is not None:
        allowed.append(elementwise(imp, "lt", [broadcast_to(imp, cols, ahead.shape), imp.graph.add("broadcast_in_dim", (nonpad, *imp.sizes(ahead.shape)), {"dims": (0,)})], "i64"))
    out = allowed[0]
    for a in allowed[1:]:
        out = elementwise(imp, "logical_and", [out, a], "i1")
    return out


@onnx_op("Attention")
def _attention(
    imp: OnnxImporter, node: Any, q: Any, k: Any, v: Any, attn_mask: Any = None, past_key: Any = None, past_value: Any = None, nonpad_kv_seqlen: Any = None,
    is_causal: int = 0, kv_num_heads: int | None = None, q_num_heads: int | None = None, qk_matmul_output_mode: int = 0, scale: float | None = None,
    softcap: float = 0.0, softmax_precision: int | None = None, left_window_size: int = -1, right_window_size: int = -1,
) -> list[Node]:
    """ONNX Attention (opsets 23-25) as GEMMs, a bias and a softmax that disc fuses. The bias adds
    the mask (a bool mask as 0 / -inf; one shorter than the keys is padded with -inf) and -inf
    where the causal frontier, the window or the keys' padding forbid; a row with every key
    forbidden gives zeros. Outputs: the result, the keys and values with the cache prepended,
    and the scores as ``qk_matmul_output_mode`` picks (0 and 1: scaled and soft-capped, as
    ONNX's reference computes both; 2: with the bias; 3: after the softmax)."""
    q, k, v = imp.tensor(q), imp.tensor(k), imp.tensor(v)
    three_d = q.tensor_type.rank == 3
    if three_d:
        if q_num_heads is None or kv_num_heads is None:
            raise LoweringError("Attention on 3-d inputs needs q_num_heads and kv_num_heads")
        q, k, v = _split_heads(imp, q, q_num_heads), _split_heads(imp, k, kv_num_heads), _split_heads(imp, v, kv_num_heads)
    if q.tensor_type.rank != 4 or k.tensor_type.rank != 4 or v.tensor_type.rank != 4:
        raise LoweringError(f"Attention takes 3-d or 4-d Q, K, V (ranks {q.tensor_type.rank}, {k.tensor_type.rank}, {v.tensor_type.rank})")
    if (past_key is None) != (past_value is None):
        raise LoweringError("Attention: past_key and past_value come together")
    past = 0
    if past_key is not None:
        pk, pv = imp.tensor(past_key), imp.tensor(past_value)
        past = pk.shape[2]
        k, v = imp.graph.add("concat", (pk, k), {"axis": 2}), imp.graph.add("concat", (pv, v), {"axis": 2})
    present_k, present_v = k, v
    dtype = q.dtype
    sq, skv = q.shape[2], k.shape[2]
    k, v, scale = _shared_heads_and_scale(imp, "Attention", q, k, v, scale)
    root = float(np.sqrt(scale))  # Q and K each scaled by the root before the GEMM, as ONNX's reference (16-bit results follow it)
    qs, ks = elementwise(imp, "mul", [q, root], dtype), elementwise(imp, "mul", [k, root], dtype)
    scores = batched_matmul(imp, qs, imp.graph.add("transpose", (ks,), {"perm": (0, 1, 3, 2)}))
    if softcap > 0:
        scores = elementwise(imp, "mul", [imp.graph.add("tanh", (elementwise(imp, "div", [scores, softcap], dtype),)), softcap], dtype)
    raw_scores = scores

    bias = None
    if attn_mask is not None:
        mask = imp.tensor(attn_mask)
        missing = as_expr(skv) - mask.shape[-1]
        if not imp.graph.constraints.prove_equal(missing, 0):  # keys past the mask's end: forbidden
            fill = imp.graph.add("broadcast_in_dim", (scalar(imp, False if mask.dtype == "i1" else -np.inf, mask.dtype), *imp.sizes([*mask.shape[:-1], missing])), {"dims": ()})
            imp.graph.constraints.assume(missing, ">=", 0, "Attention: the mask may not be longer than the keys")
            mask = imp.graph.add("concat", (mask, fill), {"axis": mask.tensor_type.rank - 1})
        bias = select(imp, mask, 0.0, -np.inf, dtype) if mask.dtype == "i1" else convert(imp, mask, dtype)
    nonpad = convert(imp, imp.tensor(nonpad_kv_seqlen), "i64") if nonpad_kv_seqlen is not None else None
    allowed = _attention_allowed(imp, sq, skv, past, bool(is_causal), left_window_size, right_window_size, nonpad)
    if allowed is not None:
        forbid = select(imp, allowed, 0.0, -np.inf, dtype)
        bias = forbid if bias is None else elementwise(imp, "add", [bias, forbid], dtype)
    if bias is not None:
        scores = elementwise(imp, "add", [scores, bias], dtype)

    work = ELEM_TYPES.get(softmax_precision, dtype) if softmax_precision is not None else dtype
    x = convert(imp, scores, work)
    last = x.tensor_type.rank - 1
    peak = reduce(imp, x, [last], "max", True)
    peak = select(imp, imp.graph.add("isinf", (peak,)), 0.0, peak, work)  # an all -inf row: no inf - inf
    e = imp.graph.add("exp", (elementwise(imp, "sub", [x, peak], work),))
    total = reduce(imp, e, [last], "sum", True)
    probs = elementwise(imp, "div", [e, select(imp, elementwise(imp, "eq", [total, 0.0], work), 1.0, total, work)], work)
    if bias is not None:  # a row whose every key the bias forbids attends to nothing
        bias_peak = reduce(imp, bias, [bias.tensor_type.rank - 1], "max", True)
        none_left = elementwise(imp, "logical_and", [imp.graph.add("isinf", (bias_peak,)), elementwise(imp, "lt", [bias_peak, 0.0], dtype)], "i1")
        probs = select(imp, none_left, 0.0, probs, work)
    probs = convert(imp, probs, dtype)
    out = batched_matmul(imp, probs, v)
    if three_d:
        b, h, s, d = out.shape
        out = reshape(imp, imp.graph.add("transpose", (out,), {"perm": (0, 2, 1, 3)}), [b, s, as_expr(h) * d])
    qk = {0: raw_scores, 1: raw_scores, 2: scores, 3: probs}.get(qk_matmul_output_mode)
    if qk is None:
        raise LoweringError(f"Attention qk_matmul_output_mode={qk_matmul_output_mode} (ONNX allows 0 to 3)")
    return [out, present_k, present_v, qk]


@onnx_op("RotaryEmbedding")
def _rotary_embedding(imp: OnnxImporter, node: Any, x: Any, cos_cache: Any, sin_cache: Any, position_ids: Any = None, interleaved: int = 0, rotary_embedding_dim: int = 0, num_heads: int = 0) -> Node:
    """Rotary position embedding: the first ``rotary_embedding_dim`` features of each head turned
    as (x1, x2) pairs, halves or (``interleaved``) neighbours, by the cached cos/sin at each
    position (rows of the caches picked by ``position_ids`` when given); the rest pass."""
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    if rank == 4:  # [batch, heads, seq, size] -> [batch, seq, heads, size]
        work = imp.graph.add("transpose", (x,), {"perm": (0, 2, 1, 3)})
    elif rank == 3:
        if not num_heads:
            raise LoweringError("RotaryEmbedding on a 3-d input needs num_heads")
        b, s_, hidden = x.shape
        require_divisible(imp, hidden, num_heads, f"RotaryEmbedding: the hidden dim must be divisible by num_heads={num_heads}")
        work = reshape(imp, x, [b, s_, num_heads, as_expr(hidden) // num_heads])
    else:
        raise LoweringError(f"RotaryEmbedding takes a 3-d or 4-d input, not rank {rank}")
    b, seq, heads, size = work.shape
    rd = rotary_embedding_dim or known_dim(size)
    if rd is None or rd % 2:
        raise LoweringError(f"RotaryEmbedding needs an even, known rotated size (rotary_embedding_dim {rotary_embedding_dim}, head size {size})")
    cos, sin = imp.tensor(cos_cache), imp.tensor(sin_cache)
    if position_ids is not None:
        pos = reshape(imp, convert(imp, imp.tensor(position_ids), "i64"), [as_expr(b) * seq])
        cos, sin = (reshape(imp, imp.graph.add("index_select", (c, pos), {"axis": 0}), [b, seq, rd // 2]) for c in (cos, sin))
    cos, sin = (imp.graph.add("broadcast_in_dim", (c, *imp.sizes([b, seq, heads, rd // 2])), {"dims": (0, 1, 3)}) for c in (cos, sin))
    last = 3

    def part(t: Node, start: DimLike, stop: DimLike, step: int = 1) -> Node:
        return imp.graph.add("slice", (t, imp.index(start), imp.index(stop)), {"axis": last, "step": step})

    if interleaved:
        x1, x2 = part(work, 0, rd, 2), part(work, 1, rd, 2)
    else:
        x1, x2 = part(work, 0, rd // 2), part(work, rd // 2, rd)
    dt = x.dtype
    real = elementwise(imp, "sub", [elementwise(imp, "mul", [cos, x1], dt), elementwise(imp, "mul", [sin, x2], dt)], dt)
    imag = elementwise(imp, "add", [elementwise(imp, "mul", [sin, x1], dt), elementwise(imp, "mul", [cos, x2], dt)], dt)
    if interleaved:
        pairs = [reshape(imp, v, [b, seq, heads, rd // 2, 1]) for v in (real, imag)]
        turned = reshape(imp, imp.graph.add("concat", pairs, {"axis": 4}), [b, seq, heads, rd])
    else:
        turned = imp.graph.add("concat", (real, imag), {"axis": last})
    if not imp.graph.constraints.prove_equal(size, rd):
        turned = imp.graph.add("concat", (turned, part(work, rd, size)), {"axis": last})
    if rank == 3:
        return reshape(imp, turned, x.shape)
    return imp.graph.add("transpose", (turned,), {"perm": (0, 2, 1, 3)})


@onnx_op("AffineGrid")
def _affine_grid(imp: OnnxImporter, node: Any, theta: Any, size: Any, align_corners: int = 0) -> Node:
    """Sampling grids: each output position's normalised coordinates in [-1, 1] (pixel corners
    with ``align_corners``, centres without), [x, y(, z), 1] transformed by each batch entry's
    theta. The spatial size must be known (a constant, or the caller's value compiled per value)."""
    theta = imp.tensor(theta)
    sizes = _ints(size, "AffineGrid's size")
    spatial = sizes[2:]
    if len(spatial) not in (2, 3):
        raise LoweringError(f"AffineGrid's size has {len(sizes)} entries; ONNX takes [N, C, H, W] or [N, C, D, H, W]")
    axes = []
    for n in spatial:  # (the reference's own steps, so the coordinates agree to the last bit)
        axes.append(np.arange(-1, 1 + 0.0001, 2.0 / (n - 1)) if align_corners else np.arange(-1 + 1.0 / n, 1, 2.0 / n))
    mesh = np.meshgrid(*axes, indexing="ij")  # [z,] y, x over the spatial dims
    base = np.stack([*reversed(mesh), np.ones(tuple(spatial))], axis=-1).reshape(-1, len(spatial) + 1)
    batch = theta.shape[0]
    points = broadcast_to(imp, imp.graph.add_constant(base.astype(numpy_dtype(theta.dtype))), [batch, *base.shape])
    grid = batched_matmul(imp, points, imp.graph.add("transpose", (theta,), {"perm": (0, 2, 1)}))
    return reshape(imp, grid, [batch, *spatial, len(spatial)])


@onnx_op("LinearAttention")
def _linear_attention(
    imp: OnnxImporter, node: Any, query: Any, key: Any, value: Any, past_state: Any = None, decay: Any = None, beta: Any = None, chunk_size: int = 64,
    kv_num_heads: int | None = None, q_num_heads: int | None = None, scale: float = 0.0, update_rule: str = "gated_delta",
) -> list[Node]:
    """The linear-attention recurrence (linear, gated, delta or gated delta rule) run token by
    token in float32, unrolled over a sequence length known when the model is compiled (a decode
    step is one token): per token the state [B, H_kv, d_k, d_v] decays by exp(decay), takes the
    key's outer product with the value (less what the state already retrieves for the key,
    times beta, under a delta rule), and the query reads it, shared by each K/V head's group of
    query heads. Outputs: [B, T, H_q * d_v] in the query's type, the last state in the past
    state's (or the query's)."""
    if update_rule not in ("linear", "gated", "delta", "gated_delta"):
        raise LoweringError(f"LinearAttention: update_rule {update_rule!r}; ONNX takes linear, gated, delta or gated_delta")
    if not q_num_heads or not kv_num_heads or q_num_heads % kv_num_heads:
        raise LoweringError(f"LinearAttention: q_num_heads ({q_num_heads}) must be a positive multiple of kv_num_heads ({kv_num_heads})")
    gating, delta = update_rule in ("gated", "gated_delta"), update_rule in ("delta", "gated_delta")
    if gating != (decay is not None) or delta != (beta is not None):
        raise LoweringError(f"LinearAttention {update_rule!r} takes {'a' if gating else 'no'} decay and {'a' if delta else 'no'} beta")
    q, k, v = imp.tensor(query), imp.tensor(key), imp.tensor(value)
    steps = known_dim(q.shape[1])
    if steps is None or steps > MAX_UNROLLED:
        raise LoweringError(f"LinearAttention over {q.shape[1]} tokens: disc unrolls the recurrence over a length known when the model is compiled, up to {MAX_UNROLLED}")
    q4, k4, v4 = (convert(imp, _split_heads(imp, t, h), "f32") for t, h in ((q, q_num_heads), (k, kv_num_heads), (v, kv_num_heads)))
    b, dk, dv = q4.shape[0], q4.shape[3], v4.shape[3]
    groups = q_num_heads // kv_num_heads
    if scale == 0.0:
        size = known_dim(dk)
        if size is None:
            raise LoweringError(f"LinearAttention without a scale needs a known head size ({dk})")
        scale = 1.0 / float(np.sqrt(size))

    def per_token(x: Any, what: str, widths: dict[Any, int]) -> Node:
        """decay or beta [B, T, H * w] as [B, H, T, w]."""
        t = imp.tensor(x)
        last = known_dim(t.shape[2])
        if last not in widths:
            raise LoweringError(f"LinearAttention: {what}'s last dim is {t.shape[2]}; it may be {sorted(widths)}")
        heads = widths[last]
        return convert(imp, imp.graph.add("transpose", (reshape(imp, t, [b, t.shape[1], heads, as_expr(last) // heads]),), {"perm": (0, 2, 1, 3)}), "f32")

    head_size = known_dim(dk)
    g4 = per_token(decay, "decay", {kv_num_heads: kv_num_heads, **({kv_num_heads * head_size: kv_num_heads} if head_size else {})}) if gating else None
    beta4 = per_token(beta, "beta", {kv_num_heads: kv_num_heads, 1: 1}) if delta else None
    if past_state is not None:
        past = imp.tensor(past_state)
        state, state_dtype = convert(imp, past, "f32"), past.dtype
    else:
        zero = imp.graph.add_constant(np.array(0.0, np.float32))
        state, state_dtype = imp.graph.add("broadcast_in_dim", (zero, *imp.sizes([b, kv_num_heads, dk, dv])), {"dims": ()}), q.dtype

    def at(x: Node, i: int) -> Node:  # token i of [B, H, T, w], kept as [B, H, 1, w]
        return imp.graph.add("slice", (x, imp.index(i), imp.index(i + 1)), {"axis": 2, "step": 1})

    f32 = arithmetic(imp, "f32")

    reads = []
    for i in range(steps):
        k_t, v_t = at(k4, i), at(v4, i)
        if gating:
            state = f32("mul", state, imp.graph.add("transpose", (imp.graph.add("exp", (at(g4, i),)),), {"perm": (0, 1, 3, 2)}))  # [B, H, w, 1]
        if delta:
            retrieved = batched_matmul(imp, k_t, state)  # [B, H, 1, d_v]
            v_t = f32("mul", at(beta4, i), f32("sub", v_t, retrieved))
        state = f32("add", state, f32("mul", imp.graph.add("transpose", (k_t,), {"perm": (0, 1, 3, 2)}), v_t))
        shared = _repeat_heads(imp, state, groups) if groups > 1 else state
        reads.append(f32("mul", batched_matmul(imp, at(q4, i), shared), float(scale)))
    out = reads[0] if len(reads) == 1 else imp.graph.add("concat", tuple(reads), {"axis": 2})  # [B, H_q, T, d_v]
    merged = reshape(imp, imp.graph.add("transpose", (out,), {"perm": (0, 2, 1, 3)}), [b, q.shape[1], as_expr(dv) * q_num_heads])
    return [convert(imp, merged, q.dtype), convert(imp, state, state_dtype)]
