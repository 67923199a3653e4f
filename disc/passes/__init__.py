"""Graph-to-graph passes: each a named, pure ``Graph -> Graph``.

The pipeline is ``disc.passes.pipeline.PIPELINE``; one module per pass
(``disc.passes.simplify`` holds the ``simplify`` pass and its rule table).
Pass objects are reached by name through ``PASSES`` rather than re-exported
here, so ``disc.passes.simplify`` stays the module.
"""

from disc.passes.pipeline import PASSES, PIPELINE, run_pipeline
from disc.passes.rewrite import New, Pass, Rewriter, graph_pass, rebuild

__all__ = ["PASSES", "PIPELINE", "New", "Pass", "Rewriter", "graph_pass", "rebuild", "run_pipeline"]
