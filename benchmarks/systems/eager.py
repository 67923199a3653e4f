"""PyTorch eager: the baseline every speedup is measured against."""

from __future__ import annotations

from benchmarks.systems.base import Runner, System, register


class Eager(System):
    def prepare(self, model, workload, example, ctx, workdir):  # type: ignore[override]
        return Runner(model)


register(Eager("eager", "PyTorch eager (no compilation)", cache_note="nothing to compile", compiles=False))
