"""disc: one ``disc.compile`` per workload, every shape of the stream on that one program."""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch

import disc
from benchmarks.systems.base import EXPORT_PRELOAD, Runner, System, register


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
    def setup(self, workdir):  # type: ignore[override]
        # Generated programs are cached in the scratch folder, so a cold start compiles its C++.
        # The runtime library and the precompiled standard headers are built once per machine,
        # like an install: they are copied in, untimed.
        from disc.runtime.native import warm_toolchain
        from disc.runtime.ral import load_ral

        cache = workdir / "disc-cache"
        for folder in warm_toolchain():
            if not (cache / folder.name).exists():
                shutil.copytree(folder, cache / folder.name)
        os.environ["DISC_CACHE_DIR"] = str(cache)
        load_ral()

    def prepare(self, model, workload, example, ctx, workdir):  # type: ignore[override]
        return DiscRunner(disc.compile(model, example, dynamic=workload.dynamic))


class DiscSaved(Disc):
    """The deployment flow: compile once and ``disc.save``; every later process ``disc.load``s."""

    def prepare(self, model, workload, example, ctx, workdir):  # type: ignore[override]
        folder = workdir / "saved-program"
        if (folder / "manifest.json").is_file():
            return DiscRunner(disc.load(folder))
        cm = disc.compile(model, example, dynamic=workload.dynamic)
        cm.save(folder)
        return DiscRunner(cm)


class PluginRunner(Runner):
    """``torch.compile(model, backend="disc", dynamic=True)``, on a private copy of the forward's code
    (as the inductor systems do: its own dynamo cache and recompile limit).

    ``capture_selections`` traces data-dependent ops such as a boolean mask's ``nonzero`` into the
    graph (dynamo's ``capture_dynamic_output_shape_ops``, as README's plug-in section advises)
    instead of breaking the graph around them; it is set around this runner's calls only, so the
    inductor systems in the same process keep dynamo's default."""

    def __init__(self, model: Any, capture_selections: bool = False) -> None:
        from benchmarks.systems.inductor import _private_forward
        from disc.frontends.torch.dynamo import disc_backend

        super().__init__()
        self.count = 0

        def backend(gm: Any, example_inputs: list[Any]) -> Any:
            self.count += 1
            return disc_backend(gm, example_inputs)

        self.fn = torch.compile(_private_forward(model), backend=backend, dynamic=True)
        self.capture_selections = capture_selections

    def __call__(self, *args: torch.Tensor) -> Any:
        if not self.capture_selections:
            return self.fn(*args)
        with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
            return self.fn(*args)

    @property
    def compilations(self) -> int:
        return self.count


class DiscPlugin(Disc):
    def prepare(self, model, workload, example, ctx, workdir):  # type: ignore[override]
        return PluginRunner(model, capture_selections="data-dependent" in workload.tags)


_PRELOAD = (*EXPORT_PRELOAD, "sympy", "disc.frontends.torch.export", "disc.frontends.torch.lowering", "disc.passes.pipeline", "disc.runtime.native")
register(
    Disc(
        "disc",
        "disc.compile, dynamic dims from the workload: the native CPU program (the reference executor where a graph has no native form)",
        cache_note="disc's program cache (keyed by the model's code, attributes and weights, the inputs' types and the options): "
        "a warm start loads the stored program, with no torch.export, no passes and no C++ compiler",
        preload=_PRELOAD,
    )
)
register(
    DiscSaved(
        "disc-saved",
        "disc.compile then disc.save on the cold start; disc.load of that folder on every later start (the same program)",
        cache_note="a warm start is disc.load of the program the cold start saved: no export, no passes, no C++ compiler",
        preload=(*_PRELOAD, "disc.runtime.artifact"),
    )
)
register(
    DiscPlugin(
        "disc-plugin",
        "torch.compile(model, backend='disc', dynamic=True): plug-in mode, dynamo's graphs compiled by disc",
        cache_note="dynamo, AOTAutograd and disc's passes run again; the C++ programs come from disc's build cache",
        preload=(*_PRELOAD, "torch._dynamo", "disc.frontends.torch.dynamo"),
    )
)
