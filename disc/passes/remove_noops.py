"""Removal of data movement that provably does nothing, and of movement chains.

* ``broadcast_in_dim`` whose dims are the identity and whose target shape is
  provably the operand's shape -> the operand;
* ``broadcast_in_dim(reshape(x))`` where the reshape only inserts unit dims
  (``x.mean(-1).unsqueeze(-1)``) -> a broadcast of ``x`` itself: the unit dims
  were going to be broadcast anyway, and reading ``x`` directly lets a
  reduction and its broadcast back over the row fuse into one kernel;
* ``reshape`` to a shape provably equal to the operand's -> the operand;
* ``reshape(reshape(x, ...), sizes)`` -> ``reshape(x, sizes)`` (row-major
  reshapes compose);
* ``transpose`` with the identity permutation -> the operand;
* ``transpose(transpose(x, p), q)`` -> ``transpose(x, p∘q)`` (or ``x``);
* ``convert`` to the operand's own dtype -> the operand;
* ``reduce`` over no axes -> the operand.

Operands are looked at in the rebuilt graph, so chains collapse in one sweep.
A replacement may differ from the node's type only in how its dims are
written: they must be provably equal.
"""

from __future__ import annotations

from collections.abc import Callable

from disc.ir.graph import Graph, Node
from disc.passes.rewrite import New, Replacement, Rewriter, graph_pass, rebuild


def _broadcast(rw: Rewriter, n: Node) -> Replacement | None:
    x = n.inputs[0]
    c = rw.dst.constraints
    if c.prove_broadcast_noop(x.shape, n.shape, n.attrs["dims"]):
        return x
    if x.op == "reshape":
        kept = _unit_dims_inserted(rw, x.inputs[0].shape, x.shape)
        if kept is not None:
            dims = n.attrs["dims"]
            return New("broadcast_in_dim", (x.inputs[0], *n.inputs[1:]), {"dims": [dims[j] for j in kept]})
    return None


def _unit_dims_inserted(rw: Rewriter, src: tuple, dst: tuple) -> list[int] | None:
    """For a reshape ``src -> dst`` that only inserts static 1s, the position in ``dst`` of
    each ``src`` dim (in order); None for any other reshape."""
    c = rw.dst.constraints
    kept: list[int] = []
    for j, d in enumerate(dst):
        i = len(kept)
        if i < len(src) and c.prove_equal(src[i], d):
            kept.append(j)
        elif d != 1:
            return None
    return kept if len(kept) == len(src) else None


def _reshape(rw: Rewriter, n: Node) -> Replacement | None:
    x = n.inputs[0]
    c = rw.dst.constraints
    if c.prove_same_shape(x.shape, n.shape):
        return x
    if x.op == "reshape":
        src = x.inputs[0]
        if c.prove_same_shape(src.shape, n.shape):
            return src
        return New("reshape", (src, *n.inputs[1:]))
    return None


def _transpose(rw: Rewriter, n: Node) -> Replacement | None:
    x = n.inputs[0]
    perm = tuple(n.attrs["perm"])
    if perm == tuple(range(len(perm))):
        return x
    if x.op == "transpose":
        inner = tuple(x.attrs["perm"])
        composed = tuple(inner[p] for p in perm)  # result dim i is x.inputs[0] dim inner[perm[i]]
        if composed == tuple(range(len(composed))):
            return x.inputs[0]
        return New("transpose", (x.inputs[0],), {"perm": composed})
    return None


def _convert(rw: Rewriter, n: Node) -> Replacement | None:
    x = n.inputs[0]
    return x if x.dtype == n.attrs["dtype"] else None


def _reduce(rw: Rewriter, n: Node) -> Replacement | None:
    return n.inputs[0] if tuple(n.attrs["dims"]) == () else None


NOOP_RULES: dict[str, Callable[[Rewriter, Node], Replacement | None]] = {
    "broadcast_in_dim": _broadcast,
    "reshape": _reshape,
    "transpose": _transpose,
    "convert": _convert,
    "reduce": _reduce,
}


@graph_pass("remove_noops")
def remove_noops(graph: Graph) -> Graph:
    """Drop identity broadcasts/reshapes/transposes/converts; compose reshape and transpose chains."""

    def rule(rw: Rewriter, n: Node, cand: Node) -> Replacement | None:
        fn = NOOP_RULES.get(cand.op)
        return fn(rw, cand) if fn is not None else None

    return rebuild(graph, rule, strict=False)
