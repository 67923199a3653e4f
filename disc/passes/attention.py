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
    x = add(y, bias)              optional; bias of the scores' shape
    p = softmax(x) over the last dim: m = max(x); e = exp(x - m); p = e / sum(e)
    o = dot_general(p, v)         the same batch dims, p's last dim with v's r-2

and replaces ``o`` with ``attention(q, k, v[, bias]) {scale}`` when every value between is
read only inside the chain (a training forward that saves ``p`` for its backward keeps it).
Only the GPU backend runs it (``driver``): the CPU program computes the chain as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from disc.ir.graph import Graph, Node
from disc.passes.dce import dce
from disc.passes.rewrite import Rewriter, graph_pass


@dataclass(frozen=True)
class _Match:
    query: Node
    key: Node  # as the scores' GEMM reads it
    key_transposed: bool  # ``key`` is [.., D, S]: the op takes [.., S, D]
    value: Node
    bias: Node | None
    scale: float
    chain: tuple[Node, ...]  # every node the op replaces, the result last


def _scalar(n: Node) -> float | None:
    """The value of a broadcast scalar literal, else None."""
    if n.op == "broadcast_in_dim" and not n.attrs["dims"]:
        n = n.inputs[0]
    if n.is_literal and not n.shape and isinstance(n.attrs.get("value"), (int, float)):
        return float(n.attrs["value"])
    return None


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
    inner = [x, peak, peak_b, d, e, total, total_b, p]
    y, bias = x, None
    if x.op == "add":
        y, bias = x.inputs
        if y.op not in ("div", "mul", "dot_general"):
            y, bias = bias, y
        if bias.shape != x.shape or bias.dtype != x.dtype:
            return None
        inner.append(y)
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
    return _Match(query, key, transposed, value, bias, scale, tuple(dict.fromkeys([s, *inner, o])))


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
            found.append(m)
    return found


@graph_pass("fuse_attention")
def fuse_attention(graph: Graph) -> Graph:
    """Each GEMM-softmax-GEMM chain read only by itself becomes one ``attention`` op."""
    matches = {m.chain[-1]: m for m in find_attention(graph)}
    if not matches:
        return graph
    rw = Rewriter(graph)
    for n in graph.nodes:
        if n.op == "input":
            rw.keep_input(n)
            continue
        m = matches.get(n)
        if m is None:
            rw.map(n, rw.commit(rw.candidate(n)))
            continue
        key = rw.value(m.key)
        if m.key_transposed:
            perm = list(range(len(key.shape)))
            perm[-2:] = perm[-1], perm[-2]
            key = rw.add("transpose", [key], {"perm": perm})
        operands = [rw.value(m.query), key, rw.value(m.value)] + ([rw.value(m.bias)] if m.bias is not None else [])
        rw.map(n, rw.add("attention", operands, {"scale": m.scale}, name=n.name))
    return dce(rw.finish())
