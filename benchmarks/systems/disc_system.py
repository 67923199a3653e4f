"""disc: one ``disc.compile`` per workload, every shape of the stream on that one program."""

from __future__ import annotations

from typing import Any

import disc
from benchmarks.systems.base import Runner, System, register


class DiscRunner(Runner):
    def __init__(self, cm: disc.CompiledModule) -> None:
        super().__init__(cm)
        self.cm = cm
        if cm.report.fallbacks:
            self.notes.append("fallbacks: " + ", ".join(f"{k} x{v}" for k, v in sorted(cm.report.fallbacks.items())))

    @property
    def compilations(self) -> int:
        return self.cm.num_compilations

    def profile(self, args: tuple) -> dict[str, Any]:
        p = self.cm.profile(*args)
        backend = self.cm.report.backend
        return {"kernels": dict(p.kernels), "workspace_bytes": p.workspace_bytes, "executor": backend.name if backend else "reference"}


class Disc(System):
    def prepare(self, model, workload, example, ctx, workdir):  # type: ignore[override]
        return DiscRunner(disc.compile(model, example, dynamic=workload.dynamic))


register(
    Disc(
        "disc",
        "disc.compile, dynamic dims from the workload: the native CPU program (the reference executor where a graph has no native form)",
        cache_note="the generated C++ is cached on disk (~/.cache/disc): a warm start captures and lowers again but skips the C++ compiler",
        preload=("torch.export", "torch._dynamo", "sympy", "disc.frontends.torch.export", "disc.runtime.native"),
    )
)
