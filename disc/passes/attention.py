"""Attention recognised: a GEMM, softmax, GEMM chain becomes one ``attention`` op.

Models write attention as ``softmax(q @ k^T / c + mask) @ v``; the frontends lower the softmax
to its reductions (max, exp, sum, divide). On a GPU that costs a [batch, heads, L, S] score
matrix written and read twice, a softmax kernel and, where the heads are a strided view of the
projections, a copy of q, k, v and the result for each batched GEMM. A fused attention
kernel (flash or memory-efficient, through the GPU backend's library) keeps the scores on
chip and reads q, k, v through their strides. This pass finds the chain in the IR:

    s = dot_general(q, kt)        batch dims 0..r-3, contracting q's last dim with kt's r-2
                                  (or with k's last dim: k read as [.., S, D])
    y = div(s, c) | mul(s, c)     optional; c a broadcast scalar literal
    x = add(y, bias)              optional, either or both, nested: a float bias of the scores'
      | select(keep, y, -inf)     shape, a boolean mask (PyTorch's attention lowered, a causal mask)
    p = softmax(x) over the last dim: m = max(x); e = exp(x - m); p = e / sum(e)
    p' = select(m == -inf, 0, p)  optional: a row with every key masked gives 0 (PyTorch's rule)
    o = dot_general(p', v)        the same batch dims, p's last dim with v's r-2

and replaces ``o`` with ``attention(q, k, v[, bias]) {scale}`` when every value between is
read only inside the chain (a training forward that saves ``p`` for its backward keeps it).
A boolean mask becomes the bias ``select(keep, 0, -inf)`` at the mask's own size, which the
library call reads broadcast. Only the GPU backend runs the pass (``driver``): the CPU program
computes the chain as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from disc.ir.graph import Graph, Node
from disc.passes.dce import dce
from disc.passes.rewrite import Rewriter, graph_pass


@dataclass(frozen=True)
class _Match:
    query: Node
    key: Node  # as the scores' GEMM reads it
    key_transposed: bool  # ``key`` is [.., D, S]: the op takes [.., S, D]
    value: Node
    biases: tuple[Node, ...]  # float terms added to the scores
    masks: tuple[Node, ...]  # boolean terms: a score is kept where true, else -inf
    scale: float
    chain: tuple[Node, ...]  # every node the op replaces, the result last
    narrow: Node | None = None  # the result's one reader, a convert to 16 bits: the op runs on the 16-bit operands


def _scalar(n: Node) -> float | None:
    """The value of a broadcast scalar literal, else None."""
    if n.op == "broadcast_in_dim" and not n.attrs["dims"]:
        n = n.inputs[0]
    if n.is_literal and not n.shape and isinstance(n.attrs.get("value"), (int, float)):
        return float(n.attrs["value"])
    return None


def _is_neg_inf(n: Node) -> bool:
    return _scalar(n) == float("-inf")


def _is_zero(n: Node) -> bool:
    return _scalar(n) == 0.0


def _masked_scores(x: Node) -> tuple[Node, list[Node], list[Node], list[Node]] | None:
    """Peel the biases and masks applied to the (scaled) scores: (what they were applied to,
    float biases, boolean masks, the add/select nodes peeled)."""
    biases: list[Node] = []
    masks: list[Node] = []
    peeled: list[Node] = []
    path_ops = ("div", "mul", "dot_general", "add", "select")
    while True:
        if x.op == "add":
            a, b = x.inputs
            if b.op in path_ops and a.op not in path_ops:
                a, b = b, a
            if a.op not in path_ops or b.op in path_ops or b.shape != x.shape or b.dtype != x.dtype:
                return None
            biases.append(b)
        elif x.op == "select" and _is_neg_inf(x.inputs[2]) and x.inputs[1].op in path_ops:
            a = x.inputs[1]
            masks.append(x.inputs[0])
        else:
            return x, biases, masks, peeled
        peeled.append(x)
        x = a


def _row_reduce(n: Node, kind: str, last: int) -> bool:
    return n.op == "reduce" and n.attrs["kind"] == kind and list(n.attrs["dims"]) == [last] and bool(n.attrs["keepdim"])


def _row_broadcast(n: Node, of: Node) -> bool:
    """``n`` spreads ``of`` (a keepdim row reduction) back over its row."""
    return n.op == "broadcast_in_dim" and n.inputs[0] is of and list(n.attrs["dims"]) == list(range(len(n.shape)))


def _gemm(n: Node, rank: int, rhs_contract: int) -> bool:
    batch = list(range(rank - 2))
    a = n.attrs
    return (
        n.op == "dot_general"
        and list(a["lhs_batch"]) == batch
        and list(a["rhs_batch"]) == batch
        and list(a["lhs_contract"]) == [rank - 1]
        and list(a["rhs_contract"]) == [rhs_contract]
    )


def _match(o: Node) -> _Match | None:
    r = len(o.shape) if o.op == "dot_general" else 0
    if r != 4 or not _gemm(o, r, r - 2):  # [batch, heads, L, D]: the fused kernels' layout
        return None
    p, value = o.inputs
    wrapper: list[Node] = []  # select(row_empty, 0, p): the rows with every key masked
    if p.op == "select" and _is_zero(p.inputs[1]) and p.inputs[0].op == "broadcast_in_dim":
        empty_b = p.inputs[0]
        empty = empty_b.inputs[0]
        if empty.op != "eq" or not _is_neg_inf(empty.inputs[1]) or not _row_broadcast(empty_b, empty):
            return None
        wrapper = [p, empty_b, empty]
        p = p.inputs[2]
    if p.op != "div" or p.dtype not in ("f32", "f16", "bf16"):
        return None
    e, total_b = p.inputs
    total = total_b.inputs[0] if total_b.inputs else None
    if e.op != "exp" or total is None or not _row_broadcast(total_b, total) or not _row_reduce(total, "sum", r - 1) or total.inputs[0] is not e:
        return None
    d = e.inputs[0]
    if d.op != "sub":
        return None
    x, peak_b = d.inputs
    peak = peak_b.inputs[0] if peak_b.inputs else None
    if peak is None or not _row_broadcast(peak_b, peak) or not _row_reduce(peak, "max", r - 1) or peak.inputs[0] is not x:
        return None
    if wrapper and wrapper[2].inputs[0] is not peak:
        return None
    inner = [x, peak, peak_b, d, e, total, total_b, p, *wrapper]
    peeled = _masked_scores(x)
    if peeled is None:
        return None
    y, biases, masks, applied = peeled
    inner += applied
    scale, s = 1.0, y
    if y.op in ("div", "mul"):
        c = _scalar(y.inputs[1])
        if c is None or c == 0.0:
            return None
        scale, s = (1.0 / c if y.op == "div" else c), y.inputs[0]
    if s.op != "dot_general":
        return None
    if _gemm(s, r, r - 2):
        transposed = True
    elif _gemm(s, r, r - 1):
        transposed = False
    else:
        return None
    query, key = s.inputs
    scaled = [y] if y is not s else []
    return _Match(query, key, transposed, value, tuple(biases), tuple(masks), scale, tuple(dict.fromkeys([s, *scaled, *inner, o])))


def _private(m: _Match, users: dict[Node, list[Node]], outputs: set[Node]) -> bool:
    """Every value the op replaces, but its result, is read only inside the chain."""
    inside = set(m.chain)
    return all(n not in outputs and all(u in inside for u in users[n]) for n in m.chain[:-1])


def find_attention(graph: Graph) -> list[_Match]:
    """The attention chains of ``graph`` this pass replaces."""
    users, outputs = graph.users(), set(graph.outputs)
    found = []
    for n in graph.nodes:
        m = _match(n) if n.op == "dot_general" else None
        if m is not None and _private(m, users, outputs):
            found.append(replace(m, narrow=_narrowing(m, users, outputs)))
    return found


_HALF = ("bf16", "f16")


# Views and repeats between a widening convert and the GEMM: the key's transpose, the key and
# value heads repeated for grouped-query attention.
_LAYOUT_OPS = ("transpose", "reshape", "broadcast_in_dim")


def _widened_from(n: Node) -> str | None:
    """The 16-bit dtype ``n`` was widened to float32 from (then laid out by ``_LAYOUT_OPS``), else None."""
    if n.op in _LAYOUT_OPS:
        return _widened_from(n.inputs[0])
    if n.op == "convert" and n.dtype == "f32" and n.inputs[0].dtype in _HALF:
        return n.inputs[0].dtype
    return None


def _narrowing(m: _Match, users: dict[Node, list[Node]], outputs: set[Node]) -> Node | None:
    """PyTorch's attention lowered for 16-bit tensors widens q, k, v (and a float bias) to float32
    and rounds the result back: the fused kernel does both itself, reading and writing 16 bits.
    Returns the rounding convert the op then replaces, or None."""
    result = m.chain[-1]
    readers = users[result]
    if result in outputs or len(readers) != 1 or readers[0].op != "convert" or readers[0].dtype not in _HALF:
        return None
    if any(_widened_from(x) != readers[0].dtype for x in (m.query, m.key, m.value, *m.biases)):
        return None
    return readers[0]


def _narrowed(rw: Rewriter, n: Node) -> Node:
    """The 16-bit value a widened operand came from, laid out as it was, in the new graph."""
    if n.op in _LAYOUT_OPS:
        return rw.add(n.op, [_narrowed(rw, n.inputs[0]), *rw.operands(n)[1:]], dict(n.attrs))
    return rw.value(n.inputs[0])


@graph_pass("fuse_attention")
def fuse_attention(graph: Graph) -> Graph:
    """Each GEMM-softmax-GEMM chain read only by itself becomes one ``attention`` op."""
    found = find_attention(graph)
    if not found:
        return graph
    matches = {m.chain[-1]: m for m in found}
    rounded = {m.narrow: m.chain[-1] for m in found if m.narrow is not None}  # rounding convert -> its attention
    mask_biases: dict[tuple[Node, str], Node] = {}  # every layer reads one mask: its bias is computed once
    rw = Rewriter(graph)
    for n in graph.nodes:
        if n.op == "input":
            rw.keep_input(n)
            continue
        if n in rounded:  # the 16-bit attention already is this value
            rw.map(n, rw.value(rounded[n]))
            continue
        m = matches.get(n)
        if m is None:
            rw.map(n, rw.commit(rw.candidate(n)))
            continue
        operand = (lambda x: _narrowed(rw, x)) if m.narrow is not None else rw.value
        key = operand(m.key)
        if m.key_transposed:
            perm = list(range(len(key.shape)))
            perm[-2:] = perm[-1], perm[-2]
            key = rw.add("transpose", [key], {"perm": perm})
        bias = _bias(rw, m, mask_biases)
        operands = [operand(m.query), key, operand(m.value)] + ([bias] if bias is not None else [])
        rw.map(n, rw.add("attention", operands, {"scale": m.scale}, name=n.name))
    return dce(rw.finish())


def _bias(rw: Rewriter, m: _Match, mask_biases: dict[tuple[Node, str], Node]) -> Node | None:
    """One float bias of the scores' shape from the chain's biases and masks (None: neither)."""
    dtype = m.narrow.dtype if m.narrow is not None else m.chain[0].dtype  # the operands' (the scores' GEMM's)
    floats = [_narrowed(rw, b) if m.narrow is not None else rw.value(b) for b in m.biases]
    terms = floats + [_mask_bias(rw, mask, dtype, mask_biases) for mask in m.masks]
    if not terms:
        return None
    bias = terms[0]
    for t in terms[1:]:
        bias = rw.add("add", [bias, t])
    return bias


def _mask_bias(rw: Rewriter, mask: Node, dtype: str, made: dict[tuple[Node, str], Node]) -> Node:
    """``select(mask, 0, -inf)``, computed at the mask's size before it was broadcast to the
    scores' (a [batch, 1, L, S] padding mask is not written once per head), once per mask
    (``made``: the biases built so far; every layer of a model reads the same mask)."""
    small, spread = mask, None
    if mask.op == "broadcast_in_dim" and list(mask.attrs["dims"]) == list(range(len(mask.shape))):
        small, spread = mask.inputs[0], mask
    bias = made.get((small, dtype))
    if bias is None:
        x = rw.value(small)
        sizes = [rw.add("dim", [x], {"axis": i}) for i in range(len(small.shape))]
        zero = rw.add("broadcast_in_dim", [rw.add("constant", [], {"value": 0.0, "dtype": dtype}), *sizes], {"dims": ()})
        neg_inf = rw.add("broadcast_in_dim", [rw.add("constant", [], {"value": float("-inf"), "dtype": dtype}), *sizes], {"dims": ()})
        bias = made[(small, dtype)] = rw.add("select", [x, zero, neg_inf])
    if spread is None:
        return bias
    return rw.add("broadcast_in_dim", [bias, *rw.operands(spread)[1:]], {"dims": tuple(spread.attrs["dims"])})
