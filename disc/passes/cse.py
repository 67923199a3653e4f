"""Common subexpression elimination: one node per computation.

Two nodes are the same computation when they have the same op, the same
operands (in either order for commutative ops) and the same attributes. Attribute
values are compared by kind and exact bits: ``1``, ``1.0`` and ``True`` differ,
and so do ``0.0`` and ``-0.0``. Constants are the same when their payloads are:
the same tensor, or equal dtype, shape, elements and signs of zero (payloads
holding NaN are never merged). Every op of disc is a pure function of its
operands, so merging never changes a result.
"""

from __future__ import annotations

from typing import Any

from disc.ir.graph import Graph, Node
from disc.ir.payloads import same_payload
from disc.ir.types import IndexType, TensorType
from disc.passes.rewrite import Rewriter, graph_pass

# Ops whose result does not depend on operand order (bit for bit).
COMMUTATIVE = frozenset(
    {
        "add",
        "mul",
        "maximum",
        "minimum",
        "eq",
        "ne",
        "logical_and",
        "logical_or",
        "logical_xor",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "iadd",
        "imul",
        "imax",
        "imin",
    }
)


def attr_key(v: Any) -> Any:
    """A hashable key that tells apart values Python considers equal (1, 1.0, True, -0.0)."""
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, int):
        return ("int", v)
    if isinstance(v, float):
        return ("float", v.hex())
    if isinstance(v, (tuple, list)):
        return ("tuple", tuple(attr_key(x) for x in v))
    if v is None:
        return ("none",)
    return (type(v).__name__, v)


def node_key(n: Node) -> tuple:
    operands = [id(i) for i in n.inputs]
    if n.op in COMMUTATIVE:
        operands.sort()
    attrs = tuple(sorted((k, attr_key(v)) for k, v in n.attrs.items() if not (n.op == "constant" and k == "ref")))
    return (n.op, tuple(operands), attrs)


def _record_equal(rw: Rewriter, kept: Node, dropped: Node) -> None:
    """The merged node computes the same value: its (fresh) symbols equal the kept one's."""
    c = rw.dst.constraints
    if isinstance(kept.type, IndexType) and isinstance(dropped.type, IndexType):
        c.add_equal(kept.type.value, dropped.type.value)
    elif isinstance(kept.type, TensorType) and isinstance(dropped.type, TensorType) and kept.type.rank == dropped.type.rank:
        for a, b in zip(kept.type.shape, dropped.type.shape):
            c.add_equal(a, b)


@graph_pass("cse")
def cse(graph: Graph) -> Graph:
    """Merge nodes with the same op, operands and attributes (constants: same payload)."""
    rw = Rewriter(graph)
    table: dict[tuple, Node] = {}
    payloads: dict[tuple, list[tuple[Any, Node]]] = {}
    for n in graph.nodes:
        if n.op == "input":
            rw.keep_input(n)
            continue
        cand = rw.candidate(n)
        key = node_key(cand)
        ref = cand.constant_ref
        if ref is not None and ref not in rw.dst.constants:
            ref = None  # a dangling reference (the verifier reports it): compare by name only
            key = (key, "ref", cand.attrs["ref"])
        earlier = None
        if ref is None:
            earlier = table.get(key)
        else:
            tensor = rw.dst.constants[ref]
            bucket = payloads.setdefault((key, tensor.dtype, tuple(tensor.shape)), [])
            earlier = next((node for t, node in bucket if same_payload(t, tensor)), None)
        if earlier is not None:
            if earlier.type != cand.type:
                _record_equal(rw, earlier, cand)
            rw.map(n, earlier)
            continue
        new = rw.commit(cand)
        if ref is None:
            table[key] = new
        else:
            bucket.append((rw.dst.constants[ref], new))
        rw.map(n, new)
    return rw.finish()
