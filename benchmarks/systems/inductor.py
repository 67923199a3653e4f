"""torch.compile with inductor, in the settings a user would try.

Each system compiles its own private copy of the model's top-level ``forward``
code: dynamo keeps compiled graphs (and counts recompilations against
``recompile_limit``) per code object, so without the copy the variants would
share one cache and one limit. Compilations are counted by wrapping inductor's
``compile_fx``; each system gets its own inductor cache folder, so a cold
start is cold and a warm start finds what its own cold start left.
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.fx.experimental._config as fx_config

from benchmarks.systems.base import Runner, System, register


@contextmanager
def _env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _private_forward(model: torch.nn.Module) -> Any:
    """``model.forward`` bound to a fresh copy of its code object (its own dynamo cache)."""
    f = type(model).forward
    code = f.__code__.replace()
    fn = types.FunctionType(code, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    fn.__kwdefaults__ = f.__kwdefaults__
    return types.MethodType(fn, model)


class InductorRunner(Runner):
    def __init__(self, model: torch.nn.Module, dynamic: bool | None, config_patches: dict[str, Any], cache: Path) -> None:
        super().__init__()
        self.count = 0
        self.dynamic = dynamic

        def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
            from torch._inductor.compile_fx import compile_fx

            self.count += 1
            with _env("TORCHINDUCTOR_CACHE_DIR", str(cache)):
                return compile_fx(gm, example_inputs, config_patches=dict(config_patches))

        self.fn = torch.compile(_private_forward(model), backend=backend, dynamic=dynamic)

    def __call__(self, *args: torch.Tensor) -> Any:
        # Importing disc (the harness does) turns dynamo's duck sizing off process-wide;
        # inductor is measured with torch's own default, as a user without disc runs it.
        # A plain set and restore (~3 us) rather than config.patch (~26 us): this is on
        # the timed path, and any call may retrace.
        before = fx_config.use_duck_shape
        fx_config.use_duck_shape = True
        try:
            return self.fn(*args)
        finally:
            fx_config.use_duck_shape = before

    @property
    def compilations(self) -> int:
        limit = torch._dynamo.config.recompile_limit
        note = f"hit dynamo's recompile_limit ({limit}): shapes after that run in eager"
        if self.count >= limit and note not in self.notes:
            self.notes.append(note)
        return self.count


_PRELOAD = ("torch._dynamo", "torch._inductor.compile_fx", "sympy")


class Inductor(System):
    def prepare(self, model, workload, example, ctx, workdir):  # type: ignore[override]
        return InductorRunner(model, self.options["dynamic"], self.options.get("config_patches", {}), workdir / "inductor-cache")


_WARM = "same process, dynamo state reset, inductor's on-disk caches as the cold start left them"

register(Inductor("inductor-dynamic", "torch.compile(dynamic=True)", cache_note=_WARM, preload=_PRELOAD, options={"dynamic": True}))
register(
    Inductor(
        "inductor-dynamic-freezing",
        "torch.compile(dynamic=True) with inductor freezing=True (weights folded as constants)",
        cache_note=_WARM,
        preload=_PRELOAD,
        options={"dynamic": True, "config_patches": {"freezing": True}},
    )
)
register(Inductor("inductor-static", "torch.compile(dynamic=False): one compilation per shape", cache_note=_WARM, preload=_PRELOAD, options={"dynamic": False}))
register(
    Inductor(
        "inductor-default",
        "torch.compile() defaults: static first, dynamic after a shape changes",
        cache_note=_WARM,
        preload=_PRELOAD,
        options={"dynamic": None},
    )
)
