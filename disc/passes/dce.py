"""Dead code elimination: keep what the outputs need.

Inputs always stay (they are the function's signature). Constant payloads no
remaining node refers to are dropped from ``Graph.constants``.
"""

from __future__ import annotations

from disc.ir.graph import Graph, live_nodes
from disc.passes.rewrite import Rewriter, graph_pass


@graph_pass("dce")
def dce(graph: Graph) -> Graph:
    """Drop nodes no output depends on, and payloads no constant uses."""
    live = live_nodes(graph.outputs)
    rw = Rewriter(graph)
    for n in graph.nodes:
        if n.op == "input":
            rw.keep_input(n)
        elif n in live:
            rw.map(n, rw.commit(rw.candidate(n)))
    out = rw.finish()
    used = {n.attrs.get("ref") for n in out.nodes if n.op == "constant"}
    out.constants = {k: v for k, v in out.constants.items() if k in used}
    return out
