"""``CompiledModule``: a compiled program as the PyTorch API hands it out (``disc.compile``, ``disc.load``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from disc.driver import executor_device
from disc.errors import InputError
from disc.ir.graph import Graph
from disc.report import CompileReport
from disc.runtime.checks import InputChecker
from disc.runtime.constant_versions import ConstantVersions
from disc.runtime.reference import ExecutionProfile


class CompiledModule:
    """A compiled program. Stateless across calls: safe to call from several threads."""

    def __init__(self, report: CompileReport, executor: Any, input_names: list[str], out_spec: Any) -> None:
        self.report = report
        self.executor = executor
        self.input_names = input_names
        self.out_spec = out_spec
        self._check_inputs = InputChecker(report.graph, input_names, executor_device(executor))
        self._weights: ConstantVersions | None = None
        self._compile_again: Callable[[list[torch.Tensor]], CompiledModule] | None = None
        self._compilations = 1

    @property
    def graph(self) -> Graph:
        return self.report.graph

    @property
    def num_compilations(self) -> int:
        """1, whatever the shapes; one more each time the model's weights changed in place."""
        return self._compilations

    def watch_weights(self, weights: Mapping[str, torch.Tensor], compile_again: Callable[[list[torch.Tensor]], CompiledModule]) -> None:
        """Compile again (``compile_again(inputs)``) at the first call after one of ``weights`` changes in place."""
        self._weights = ConstantVersions(weights)
        self._compile_again = compile_again

    def _adopt(self, fresh: CompiledModule) -> None:
        """Run ``fresh``'s program from now on (compiled from the same model with new weights)."""
        self.report, self.executor, self._check_inputs = fresh.report, fresh.executor, fresh._check_inputs
        self._compilations += 1

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tensors = list(args)
        if kwargs or len(tensors) < len(self.input_names):
            for name in self.input_names[len(args) :]:
                if name not in kwargs:
                    raise InputError(f"missing input {name!r}; inputs are {self.input_names}")
                tensors.append(kwargs.pop(name))
            if kwargs:
                raise InputError(f"unexpected input(s) {sorted(kwargs)}; inputs are {self.input_names}")
        self._check_inputs(tensors)
        if self._weights is not None and self._weights.changed() and self._compile_again is not None:
            again = self._compile_again
            self._weights.recompile_if_changed(self.report.name, lambda: self._adopt(again(tensors)))
        self.report.calls += 1
        # Entering no_grad costs ~2 us, a tenth of a small call: only when an input could start a graph.
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            with torch.no_grad():
                outs = self.executor.run(tensors)
        else:
            outs = self.executor.run(tensors)
        return pytree.tree_unflatten(outs, self.out_spec)


    def save(self, folder: str | os.PathLike) -> Path:
        """Write this program to ``folder``; ``disc.load(folder)`` runs it again without compiling."""
        from disc.runtime.artifact import save

        return save(self, folder)

    def profile(self, *args: Any) -> ExecutionProfile:
        """Kernels executed (memory-bound, library, fallback) and peak workspace at these inputs."""
        self._check_inputs(list(args))
        with torch.no_grad():
            return self.executor.profile(list(args))
