"""Shape propagation: rebuild the graph, re-inferring every type with all known facts.

Types are written in normal form (union-find roots, definitions substituted),
but facts learnt after a node was built (a later ``assume``, a pass that
proved an equality) do not reach types inferred earlier. Re-inferring in
order refines them; new facts found on the way trigger another round, up to a
small bound. Input types are left as written: they bind the symbols at run time.
"""

from __future__ import annotations

from disc.ir.graph import Graph
from disc.passes.rewrite import graph_pass, rebuild

_MAX_ROUNDS = 3


@graph_pass("shape_propagation")
def shape_propagation(graph: Graph) -> Graph:
    """Re-infer every node's type in order, to a fixpoint of the constraint set."""
    prev, out = graph, rebuild(graph)
    for _ in range(_MAX_ROUNDS - 1):
        if out.constraints.describe() == prev.constraints.describe():
            break  # no fact was learnt: every type already saw every fact
        prev, out = out, rebuild(out)
    return out
