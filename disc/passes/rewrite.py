"""Rebuilding a graph node by node: the one mechanism every pass uses.

A pass never mutates its input. It walks the source graph in order and, for
each node, either copies it into a fresh graph (operands replaced through the
replacement map, type re-inferred by the op registry exactly as ``Graph.add``
does) or maps it to a replacement value of the new graph. The new graph keeps
the source's name, a copy of its constraint set, its constants, its input names
and its output order.

    rw = Rewriter(src)
    for n in src.nodes:
        if n.op == "input":
            rw.keep_input(n)
            continue
        cand = rw.candidate(n)        # detached: mapped operands, re-inferred type
        rw.map(n, rule(cand) or rw.commit(cand))
    return rw.finish()

Re-inferring an op whose shape rule mints a fresh symbol (a non-exact
``ifloordiv``, an unprovable ``imax``) would create a new symbol on every
rebuild. The rewriter instead reuses the symbol the source node already has
(it computes the same value from the same operand values), so rebuilding is
idempotent and the constraint header does not grow.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from disc.ir.graph import Graph, Node, clone_graph_header, freeze_attr
from disc.ir.payloads import dtype_name
from disc.ir.registry import get_spec, infer_type
from disc.ir.types import IndexType, TensorType, Type
from disc.shape.expr import DimLike, SymExpr, as_expr, simplify_dim


# -- passes ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Pass:
    """A named, pure graph transformation ``Graph -> Graph`` (the input is left unchanged)."""

    name: str
    run: Callable[[Graph], Graph]
    doc: str = ""

    def __call__(self, graph: Graph) -> Graph:
        return self.run(graph)

    def __repr__(self) -> str:
        return f"Pass({self.name})"


def graph_pass(name: str) -> Callable[[Callable[[Graph], Graph]], Pass]:
    """Decorator turning ``fn(graph) -> graph`` into a ``Pass`` called ``name``."""

    def wrap(fn: Callable[[Graph], Graph]) -> Pass:
        return Pass(name, fn, (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "")

    return wrap


# -- replacements rules may return ------------------------------------------------------
@dataclass(frozen=True)
class New:
    """A node to create: what a rule returns when the replacement is not an existing value."""

    op: str
    inputs: tuple[Node, ...] = ()
    attrs: Mapping[str, Any] = field(default_factory=dict)


Replacement = Union[Node, New, Any]  # a node, a node to build, or a constant payload (ir/payloads.py)


_NUMERIC = re.compile(r"^\d+$")


class Rewriter:
    """Builds a new graph from ``src``; ``mapping`` sends each source node to its new value."""

    def __init__(self, src: Graph) -> None:
        self.src = src
        self.dst = clone_graph_header(src)
        self.mapping: dict[Node, Node] = {}
        # Copies keep their source names; nodes a pass creates get numbers not
        # used anywhere in the source, so a later copy never has to be renamed.
        self._used: set[str] = {n.name for n in src.nodes}
        self._taken: set[str] = set()  # names already in the new graph
        numbers = [int(n.name) for n in src.nodes if _NUMERIC.match(n.name)]
        self._next = max(numbers, default=-1) + 1

    # -- naming -------------------------------------------------------------------
    def fresh_name(self) -> str:
        while str(self._next) in self._used:
            self._next += 1
        name = str(self._next)
        self._used.add(name)
        return name

    def _name_for(self, wanted: str | None) -> str:
        name = wanted if wanted is not None and wanted not in self._taken else self.fresh_name()
        self._used.add(name)
        self._taken.add(name)
        return name

    # -- mapping ------------------------------------------------------------------
    def map(self, src_node: Node, new_node: Node) -> Node:
        self.mapping[src_node] = new_node
        return new_node

    def value(self, src_node: Node) -> Node:
        return self.mapping[src_node]

    def operands(self, src_node: Node) -> list[Node]:
        return [self.mapping[i] for i in src_node.inputs]

    def keep_input(self, n: Node) -> Node:
        self._taken.add(n.name)
        return self.map(n, self.dst.add_input(n.name, n.type))  # type: ignore[arg-type]

    # -- building -----------------------------------------------------------------
    def candidate(
        self,
        n: Node | None,
        op: str | None = None,
        inputs: Sequence[Node] | None = None,
        attrs: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> Node:
        """A detached node (not yet in the graph) with a re-inferred type.

        By default it is the copy of source node ``n``: same op, attributes and
        name, operands mapped. ``op``/``inputs``/``attrs`` override (then ``n``
        only lends its type's symbols, see the module docstring).
        """
        op = op if op is not None else n.op  # type: ignore[union-attr]
        if inputs is None:
            inputs = self.operands(n) if n is not None else ()
        if attrs is None:
            attrs = n.attrs if n is not None else {}
        full = {k: freeze_attr(v) for k, v in get_spec(op).full_attrs(attrs).items()}
        c = self.dst.constraints
        before = len(c.facts)
        type_ = infer_type(self.dst, op, list(inputs), full)
        if len(c.facts) > before and n is not None:
            type_ = self._reuse_symbols(type_, n.type, list(c.facts)[before:])
        if name is None and n is not None and op == n.op:
            name = n.name
        return Node(op, inputs, full, type_, name or "")

    def commit(self, cand: Node) -> Node:
        """Append a candidate to the new graph (its name kept when free)."""
        return self.dst.add_typed(cand.op, cand.inputs, cand.attrs, cand.type, self._name_for(cand.name or None))

    def add(self, op: str, inputs: Sequence[Node] = (), attrs: Mapping[str, Any] | None = None, name: str | None = None) -> Node:
        """Create a new node in the new graph (type inferred)."""
        return self.commit(self.candidate(None, op, inputs, attrs or {}, name=name))

    def constant(self, value: Any, name: str | None = None) -> Node:
        return self.dst.add_constant(value, name=self._name_for(name))

    def materialize(
        self,
        rep: Replacement,
        expected: Type | None = None,
        name: str | None = None,
        accept: Callable[[Type, Type], bool] | None = None,
    ) -> Node | None:
        """Turn a rule's replacement into a node of the new graph.

        With ``expected``, a replacement whose type is not identical (or not
        accepted by ``accept(new, expected)``) is refused (``None``) before
        anything is added, so a rejected rule leaves no trace.
        """
        ok = accept or (lambda new, want: new == want)
        if isinstance(rep, Node):
            return rep if expected is None or ok(rep.type, expected) else None
        if not isinstance(rep, (Node, New)):  # a payload
            t = TensorType(dtype_name(rep), tuple(rep.shape))
            if expected is not None and not ok(t, expected):
                return None
            return self.constant(rep, name=name)
        cand = self.candidate(None, rep.op, rep.inputs, rep.attrs, name=name)
        if expected is not None and not ok(cand.type, expected):
            return None
        return self.commit(cand)

    def provably_same_type(self, a: Type, b: Type) -> bool:
        """Same kind and dtype, and provably equal dims / index value."""
        c = self.dst.constraints
        if isinstance(a, IndexType) and isinstance(b, IndexType):
            return c.prove_equal(a.value, b.value)
        if isinstance(a, TensorType) and isinstance(b, TensorType):
            return a.dtype == b.dtype and c.prove_same_shape(a.shape, b.shape)
        return False

    def finish(self) -> Graph:
        self.dst.outputs = [self.mapping[o] for o in self.src.outputs]
        return self.dst

    # -- fresh symbols ----------------------------------------------------------------
    def _reuse_symbols(self, inferred: Type, source: Type, fresh: list[str]) -> Type:
        c = self.dst.constraints
        pairs: list[tuple[DimLike, DimLike]] = []
        if isinstance(inferred, IndexType) and isinstance(source, IndexType):
            pairs = [(inferred.value, source.value)]
        elif isinstance(inferred, TensorType) and isinstance(source, TensorType) and inferred.rank == source.rank:
            pairs = list(zip(inferred.shape, source.shape))
        fresh_set = set(fresh)
        subst: dict[str, SymExpr] = {}
        for new, old in pairs:
            sym = as_expr(new).as_symbol()
            if sym in fresh_set and sym not in subst:
                target = c.normalize(old)
                if sym not in target.symbols():
                    subst[sym] = target
        if not subst:
            return inferred
        for sym, target in subst.items():
            if _mentioned_elsewhere(c, sym):
                c.add_equal(SymExpr.symbol(sym), target)
            else:
                c.forget_symbol(sym)

        def fix(d: DimLike) -> DimLike:
            return simplify_dim(c.normalize(as_expr(d).substitute(subst)))

        if isinstance(inferred, IndexType):
            return IndexType(fix(inferred.value))
        assert isinstance(inferred, TensorType)
        return TensorType(inferred.dtype, tuple(fix(d) for d in inferred.shape))


def _mentioned_elsewhere(c, sym: str) -> bool:
    if any(p == sym for k, p in c.parent.items() if k != sym):
        return True
    if sym in c.definitions or any(sym in e.symbols() for e in c.definitions.values()):
        return True
    if any(sym in a.symbols() or sym in b.symbols() for a, b in c.product_equalities):
        return True
    return any(sym in chk.lhs.symbols() or sym in chk.rhs.symbols() for chk in c.checks)


def rebuild(
    src: Graph,
    rule: Callable[[Rewriter, Node, Node], Replacement | None] | None = None,
    *,
    strict: bool = True,
) -> Graph:
    """Copy ``src`` node by node; ``rule(rw, source_node, candidate)`` may return a replacement.

    A replacement must have exactly the candidate's type (``strict``), or a
    provably equal one (``strict=False``); otherwise the node is copied.
    """
    rw = Rewriter(src)
    for n in src.nodes:
        if n.op == "input":
            rw.keep_input(n)
            continue
        cand = rw.candidate(n)
        new = None
        if rule is not None:
            rep = rule(rw, n, cand)
            if rep is not None:
                accept = None if strict else rw.provably_same_type
                new = rw.materialize(rep, expected=cand.type, name=n.name, accept=accept)
        rw.map(n, new if new is not None else rw.commit(cand))
    return rw.finish()


__all__ = ["New", "Pass", "Replacement", "Rewriter", "graph_pass", "rebuild"]
