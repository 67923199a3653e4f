"""Transpose sinking: move transposes below the ops that do not care about layout.

A value read through ``transpose(v, P)`` by a pointwise op, a pooling window
or a reduction can instead be computed on ``v`` directly and transposed once
afterwards:

* pointwise ``op(transpose(a, P), transpose(b, P), broadcast_in_dim(c, dims))``
  -> ``transpose(op(a, b, broadcast_in_dim(c, P[dims])), P)``; every tensor
  operand must be a transpose by the same ``P`` or a broadcast (whose dims are
  renumbered; where that reorders them, ``c`` is transposed to match, or read
  untransposed when it is itself a transpose by ``P``);
* ``reduce_window(transpose(v, P))`` -> ``transpose(reduce_window(v), P)``
  with the window, strides, padding and dilation permuted alike (an argmax's
  ``index_dims`` renumbered too, only where they stay increasing: its
  positions are flat in dim order);
* ``reduce(transpose(v, P), dims)`` -> ``reduce(v, P[dims])``, transposed back
  only where the kept dims come out in a different order;
* ``transpose(transpose(v, P), Q)`` composes (to ``v`` when the perms cancel),
  and ``reshape(transpose(v, P))`` reads ``v`` when ``P`` only moves 1-sized dims.

One forward sweep suffices: operands are rewritten before their users, so a
transpose travels down a whole chain until something it cannot cross (a
convolution's input transpose, which it cancels, or a reshape, concat, GEMM...).
The values computed are the same element for element; only where the
transposes sit changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from disc.ir.graph import Graph, Node
from disc.ir.registry import ELEMENTWISE, get_spec
from disc.passes.remove_noops import NOOP_RULES
from disc.passes.rewrite import New, Replacement, Rewriter, graph_pass, rebuild
from disc.shape.constraints import ShapeConstraints
from disc.shape.expr import DimLike, SymExpr, as_expr

Perm = tuple[int, ...]


def _inverse(perm: Perm) -> Perm:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def _untransposed_broadcast(rw: Rewriter, b: Node, perm: Perm) -> Node:
    """``b`` (a broadcast in the transposed layout) rebuilt in the untransposed one.

    Its dims map through ``perm``; where they come out of order, the operand is
    transposed to match (no larger than the transpose being sunk, usually a
    per-channel vector). An operand that is itself transposed by ``perm`` (a
    statistic computed below an earlier sunk transpose) is read untransposed.
    """
    x = b.inputs[0]
    dims = [perm[d] for d in b.attrs["dims"]]
    order = tuple(sorted(range(len(dims)), key=dims.__getitem__))
    if order != tuple(range(len(dims))):
        inner = x.inputs[0] if x.op == "transpose" else None
        composed = tuple(x.attrs["perm"][k] for k in order) if inner is not None else None
        if composed == tuple(range(len(order))):
            x = inner  # transpose(transpose(u, P), order) is u
        else:
            x = rw.add("transpose", (x,), {"perm": order})
        dims = [dims[k] for k in order]
    sizes = b.inputs[1:]
    inv = _inverse(perm)
    return rw.add("broadcast_in_dim", (x, *(sizes[inv[j]] for j in range(len(perm)))), {"dims": tuple(dims)})


def _pointwise(rw: Rewriter, n: Node) -> Replacement | None:
    perms = {tuple(x.attrs["perm"]) for x in n.inputs if x.op == "transpose"}
    if len(perms) != 1:
        return None
    (perm,) = perms
    if any(x.op not in ("transpose", "broadcast_in_dim") for x in n.inputs):
        return None
    operands: list[Node] = []
    for x in n.inputs:
        if x.op == "transpose":
            operands.append(x.inputs[0])
            continue
        operands.append(_untransposed_broadcast(rw, x, perm))
    inner = rw.add(n.op, operands, n.attrs)
    return New("transpose", (inner,), {"perm": perm})


def _permuted(values: Sequence, perm: Perm) -> tuple:
    """Per-dim attribute of the transposed layout, renumbered for the untransposed one."""
    if not values:
        return tuple(values)
    inv = _inverse(perm)
    return tuple(values[inv[j]] for j in range(len(perm)))


def _reduce_window(rw: Rewriter, n: Node) -> Replacement | None:
    x = n.inputs[0]
    if x.op != "transpose":
        return None
    perm = tuple(x.attrs["perm"])
    a = n.attrs
    index_dims = tuple(perm[d] for d in a["index_dims"])
    if list(index_dims) != sorted(index_dims):
        return None  # argmax positions are flat in dim order, which this transpose changes
    attrs = {
        **a,
        "index_dims": index_dims,
        "window": _permuted(a["window"], perm),
        "strides": _permuted(a["strides"], perm),
        "padding": _permuted(a["padding"], perm),
        "dilation": _permuted(a["dilation"], perm),
    }
    inner = rw.add("reduce_window", (x.inputs[0],), attrs)
    return New("transpose", (inner,), {"perm": perm})


def _reduce(rw: Rewriter, n: Node) -> Replacement | None:
    x = n.inputs[0]
    if x.op != "transpose":
        return None
    perm = tuple(x.attrs["perm"])
    rank = len(perm)
    axes = {d % rank for d in n.attrs["dims"]}
    inner = rw.add("reduce", (x.inputs[0],), {**n.attrs, "dims": tuple(sorted(perm[d] for d in axes))})
    if n.attrs["keepdim"]:
        return New("transpose", (inner,), {"perm": perm})
    kept = [perm[i] for i in range(rank) if i not in axes]  # untransposed dims, in the node's order
    order = sorted(kept)
    rest = tuple(order.index(d) for d in kept)
    return inner if rest == tuple(range(len(rest))) else New("transpose", (inner,), {"perm": rest})


def moves_only_unit_dims(rw: Rewriter, t: Node) -> bool:
    """Does ``t`` (a transpose) keep every dim that may be larger than 1 in its relative order?"""
    src = t.inputs[0]
    c = rw.dst.constraints
    live = [p for p in t.attrs["perm"] if not c.prove_is_one(src.shape[p])]
    return live == sorted(live)


def _reshape(rw: Rewriter, n: Node) -> Replacement | None:
    x = n.inputs[0]
    if x.op == "transpose" and moves_only_unit_dims(rw, x):
        return New("reshape", (x.inputs[0], *n.inputs[1:]))
    return None


def order_preserving(c: ShapeConstraints, shape: Sequence[DimLike], moves: Sequence[tuple[str, Sequence[DimLike]]]) -> bool:
    """Does applying ``moves`` (("transpose", perm) or ("reshape", sizes)) to a value of ``shape`` leave its
    elements in row-major order, i.e. is the whole chain one reshape?

    Each dim is a run of the original dims ("atoms"); a transpose reorders runs and a reshape merges adjacent
    runs whose sizes provably multiply to the new dim. The chain is a reshape when the atoms end in their
    original order. 1-sized dims never affect the order and are skipped; a reshape that splits a run gives up.
    """
    dims: list[tuple[tuple[int, ...], DimLike]] = [((i,), d) for i, d in enumerate(shape)]
    for kind, arg in moves:
        if kind == "transpose":
            dims = [dims[p] for p in arg]
            continue
        runs = [r for r in dims if not c.prove_is_one(r[1])]
        dims, k = [], 0
        for size in arg:
            atoms: tuple[int, ...] = ()
            if not c.prove_is_one(size):
                product = SymExpr.const(1)
                while not (atoms and c.prove_equal(product, size)):
                    if k == len(runs):
                        return False  # a split, or sizes that cannot be matched
                    atoms, product = atoms + runs[k][0], product * as_expr(runs[k][1])
                    k += 1
            dims.append((atoms, size))
        if k != len(runs):
            return False
    flat = [a for atoms, size in dims if not c.prove_is_one(size) for a in atoms]
    return flat == sorted(flat)


def _transpose(rw: Rewriter, n: Node) -> Replacement | None:
    """Compose transpose chains; ``transpose(reshape(transpose(v)))`` that keeps ``v``'s order -> ``reshape(v)``
    (a channels-last feature map flattened and transposed back: ``conv(x).flatten(2).transpose(1, 2)``)."""
    composed = NOOP_RULES["transpose"](rw, n)
    if composed is not None:
        return composed
    r = n.inputs[0]
    if r.op != "reshape" or r.inputs[0].op != "transpose":
        return None
    t = r.inputs[0]
    v, perm = t.inputs[0], tuple(n.attrs["perm"])
    moves = [("transpose", tuple(t.attrs["perm"])), ("reshape", r.shape), ("transpose", perm)]
    if not order_preserving(rw.dst.constraints, v.shape, moves):
        return None
    return New("reshape", (v, *[r.inputs[1 + p] for p in perm]))


RULES: dict[str, Callable[[Rewriter, Node], Replacement | None]] = {
    "reduce_window": _reduce_window,
    "reduce": _reduce,
    "transpose": _transpose,
    "reshape": _reshape,
}


@graph_pass("sink_transposes")
def sink_transposes(graph: Graph) -> Graph:
    """Push transposes below pointwise ops, pooling and reductions; cancel the pairs that meet."""

    def rule(rw: Rewriter, n: Node, cand: Node) -> Replacement | None:
        fn = RULES.get(cand.op)
        if fn is None and get_spec(cand.op).category == ELEMENTWISE and cand.inputs:
            fn = _pointwise
        return fn(rw, cand) if fn is not None else None

    return rebuild(graph, rule, strict=False)
