"""Shape folding: simplify the index computation by its symbolic value.

Every index scalar carries the value it is known to have (``index(b*s)``), so

* an index value that is static becomes ``index_const`` (``dim`` of a static
  dim, ``imul`` of constants, ``isub(%n, %n)``...);
* an index value provably equal to an earlier one reuses it: CSE of shape
  expressions by value, not by syntax (``dim(%x){axis=0}`` and ``dim(%y){axis=0}``
  when both are ``b``; ``imul(%a, %b)`` and ``imul(%b, %a)``).

Tensor nodes are copied; their size operands now point at the kept values.

Equalities assumed at compile time (runtime checks, ``check a == b`` in the
IR) count as proven here, as everywhere: the runtime must evaluate the checks
before the shape computation that relies on them (a prologue), so that a
violated assumption is reported instead of computing with the wrong size.
"""

from __future__ import annotations

from disc.ir.graph import Graph, Node
from disc.ir.types import IndexType
from disc.passes.rewrite import New, Rewriter, graph_pass
from disc.shape.constraints import ShapeConstraints
from disc.shape.expr import SymExpr

# Sharing a value equal only through product equalities saves an index op or two, so the
# prover gets a small search per pair and the pass a bounded number of pairs: Swin's window
# sizes (1,900 pairs equal in the traced example, 24 provably) took 50 s here otherwise.
_PAIR_EFFORT = 8
_PAIRS_PER_PASS = 128


def _equal_earlier(c: ShapeConstraints, value: SymExpr, seen: dict[SymExpr, tuple[Node, int | None]], pairs_left: list[int]) -> Node | None:
    if value in seen:
        return seen[value][0]
    if not c.product_equalities:
        return None
    # Values that differ in the traced example cannot be equal (prove_equal knows that too, but
    # skipping them here keeps them from spending the budget).
    example = c.example_value(value)
    for other, (n, other_example) in seen.items():
        if example is not None and other_example is not None and example != other_example:
            continue
        if pairs_left[0] <= 0:
            return None
        pairs_left[0] -= 1
        if c.prove_equal(value, other, effort=_PAIR_EFFORT):
            return n
    return None


@graph_pass("fold_shapes")
def fold_shapes(graph: Graph) -> Graph:
    """Fold static index values to index_const and CSE index values by symbolic value."""
    rw = Rewriter(graph)
    c = rw.dst.constraints
    seen: dict[SymExpr, tuple[Node, int | None]] = {}  # value -> its node, its example value
    pairs_left = [_PAIRS_PER_PASS]
    for n in graph.nodes:
        if n.op == "input":
            rw.keep_input(n)
            continue
        cand = rw.candidate(n)
        if not isinstance(cand.type, IndexType):
            rw.map(n, rw.commit(cand))
            continue
        value = c.normalize(cand.type.value)
        earlier = _equal_earlier(c, value, seen, pairs_left)
        if earlier is not None:
            rw.map(n, earlier)
            continue
        new = None
        if value.is_const and cand.op != "index_const":
            new = rw.materialize(New("index_const", (), {"value": value.const_value}), expected=cand.type, name=n.name)
        if new is None:
            new = rw.commit(cand)
        seen[value] = (new, c.example_value(value))
        rw.map(n, new)
    return rw.finish()
