"""The graph-level pass pipeline, readable top to bottom.

``run_pipeline`` runs every pass of ``PIPELINE`` in order. Each pass is pure
(``Graph -> Graph``). Debugging switches:

* ``verify=True`` or ``DISC_VERIFY=1``: run the verifier after every pass; a
  failure names the pass that broke the graph;
* ``dump=path`` or ``DISC_DUMP_IR=1``: write (to ``path``, or print to stderr)
  the IR after every pass, each preceded by a ``# IR after <pass>`` header.
  Header lines start with ``#``, which the IR parser skips, so any section of a
  dump can be parsed back.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from disc.ir.graph import Graph
from disc.ir.printer import print_graph
from disc.ir.verifier import VerificationError
from disc.ir.verifier import verify as verify_graph
from disc.passes.channels_last import channels_last
from disc.passes.conv1d import conv1d_as_2d
from disc.passes.cse import cse
from disc.passes.dce import dce
from disc.passes.fold_shapes import fold_shapes
from disc.passes.remove_noops import remove_noops
from disc.passes.rewrite import Pass
from disc.passes.shape_propagation import shape_propagation
from disc.passes.simplify import simplify
from disc.passes.sink_transposes import sink_transposes

PIPELINE: list[Pass] = [
    shape_propagation,  # re-infer every type with all known facts
    fold_shapes,  # static index values -> index_const; CSE index values by symbolic value
    simplify,  # exact algebraic identities, scalar constant folding
    remove_noops,  # identity broadcast/reshape/transpose/convert; compose movement chains
    conv1d_as_2d,  # 1-D convolutions as 2-D ones over a unit height
    channels_last,  # 2-D convolutions on NHWC activations, between transposes
    sink_transposes,  # transposes below pointwise ops/pooling/reductions, where pairs cancel
    cse,  # one node per (op, operands, attributes)
    dce,  # drop what no output needs
]

# Every pass by name (the pipeline's, and any run on its own).
PASSES: dict[str, Pass] = {p.name: p for p in PIPELINE}


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _header(text: str) -> str:
    return f"# ---- {text} ----"


def run_pipeline(
    graph: Graph,
    *,
    verify: bool = False,
    dump: str | os.PathLike | None = None,
    passes: list[Pass] | None = None,
) -> Graph:
    """Run ``passes`` (default ``PIPELINE``) on ``graph``; the input graph is left unchanged."""
    passes = PIPELINE if passes is None else passes
    verify = verify or _env_flag("DISC_VERIFY")
    to_stderr = dump is None and _env_flag("DISC_DUMP_IR")
    sections: list[str] = []

    def emit(title: str, g: Graph) -> None:
        if dump is None and not to_stderr:
            return
        text = f"{_header(title)}\n{print_graph(g)}\n"
        if to_stderr:
            sys.stderr.write(text)
        sections.append(text)

    emit("IR before the pipeline", graph)
    if verify:
        _verify(graph, "the input")
    for i, p in enumerate(passes, 1):
        graph = p(graph)
        emit(f"IR after {p.name} ({i}/{len(passes)})", graph)
        if verify:
            _verify(graph, f"pass {p.name}")
    if dump is not None:
        Path(dump).write_text("\n".join(sections))
    return graph


def _verify(graph: Graph, where: str) -> None:
    try:
        verify_graph(graph)
    except VerificationError as e:
        raise VerificationError(f"IR invalid after {where}: {e}") from e


__all__ = ["PASSES", "PIPELINE", "run_pipeline"]
