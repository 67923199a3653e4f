"""What every benchmarked system provides: a ``System`` that prepares a ``Runner`` per workload.

An adapter is a few lines: say which Python modules it needs, and how to turn
(model, workload, example inputs) into something callable. The harness does
all timing, memory and error measurement the same way for every system.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.workloads import Workload

# What the systems that capture through torch.export import: the first export() call imports
# torch.export._trace and ~400 modules more (~14 MB), library code like the rest of the preload.
EXPORT_PRELOAD = ("torch.export", "torch.export._trace", "torch._dynamo")


@dataclass
class Context:
    """Where and how the suite runs: device, dtype, and a scratch folder per (system, workload)."""

    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    workdir: Path = Path("/tmp/disc-bench")


class Runner:
    """A prepared model. ``__call__`` takes the workload's positional args, returns torch tensors."""

    def __init__(self, fn: Any = None) -> None:
        self.fn = fn
        self.notes: list[str] = []

    def __call__(self, *args: torch.Tensor) -> Any:
        return self.fn(*args)

    @property
    def compilations(self) -> int:
        """Compilations made so far (0 for systems that do not compile)."""
        return 0

    def profile(self, args: tuple) -> dict[str, Any] | None:
        """Optional system-specific figures at one shape (disc: kernel counts, workspace)."""
        return None


@dataclass
class System:
    name: str
    description: str
    requires: tuple[str, ...] = ()  # importable modules it needs (optional extras)
    devices: tuple[str, ...] = ("cpu", "cuda")
    cache_note: str = ""  # what "warm start" means for this system
    compiles: bool = True  # False: nothing to prepare, so no warm start is measured
    # Modules imported before the memory baseline: peak memory counts the data a system adds
    # (weight copies, arenas, workspaces, compiled code), not its Python modules' one-time import.
    preload: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)

    def missing(self) -> str | None:
        """Why the system cannot run here (a missing package), or None."""
        absent = [m for m in self.requires if importlib.util.find_spec(m) is None]
        return f"not installed: {', '.join(absent)} (pip install -e .[bench])" if absent else None

    def unsupported(self, workload: Workload, ctx: Context) -> str | None:
        """Why this system skips this workload on this device, or None."""
        device = ctx.device.split(":")[0]
        return None if device in self.devices else f"runs on {', '.join(self.devices)} only"

    def setup(self, workdir: Path) -> None:
        """Untimed, in each process before ``prepare``: what installing the system would do (disc
        builds its runtime library) and pointing its on-disk caches at ``workdir``."""

    def prepare(self, model: nn.Module, workload: Workload, example: tuple, ctx: Context, workdir: Path) -> Runner:
        """Make a runner. Called twice per workload: cold (fresh ``workdir``) and warm (same ``workdir``)."""
        raise NotImplementedError


SYSTEMS: dict[str, System] = {}


def register(system: System) -> System:
    if system.name in SYSTEMS:
        raise ValueError(f"system {system.name!r} is already registered")
    SYSTEMS[system.name] = system
    return system
