"""``CompiledModule``: a compiled program as the PyTorch API hands it out (``disc.compile``, ``disc.load``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from disc.driver import executor_device
from disc.errors import InputError
from disc.frontends.arrays import bind_inputs
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
            tensors = bind_inputs(self.input_names, args, kwargs)
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


class PerBranchModule:
    """What ``disc.compile`` returns for a model ``torch.export`` cannot capture as one program for
    every shape: its code branches on a size or turns one into a Python ``int`` (MobileNetV2's
    TensorFlow-style padding tests each side's parity). It is ``torch.compile(model,
    backend="disc", dynamic=True)``: dynamo traces one graph per branch the code takes, disc
    compiles each for every shape of that branch. Inference, like ``CompiledModule``; it has no
    single program to save.
    """

    def __init__(self, model: torch.nn.Module, example: list[torch.Tensor], input_names: list[str], dynamic: Mapping[str, Mapping[int, str]], why: str) -> None:
        from disc.frontends.torch.dynamo import disc_backend

        self.name = type(model).__name__
        self.why = why
        self.input_names = input_names
        self.graph_reports: list[CompileReport] = []
        self.calls = 0
        # What the example fixes: dtype, rank, and every dim the caller did not name dynamic.
        self._expected = [(t.dtype, [None if axis in dynamic.get(name, {}) else n for axis, n in enumerate(t.shape)]) for name, t in zip(input_names, example)]

        def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
            from disc.report import reports

            before = len(reports())
            compiled = disc_backend(gm, example_inputs)
            self.graph_reports += reports()[before:]
            return compiled

        self._compiled = torch.compile(model, backend=backend, dynamic=True)

    @property
    def num_compilations(self) -> int:
        """Graphs compiled so far: one per branch of the model's code the calls have taken."""
        return len(self.graph_reports)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args = tuple(bind_inputs(self.input_names, args, kwargs))
        for name, t, (dtype, dims) in zip(self.input_names, args, self._expected):
            if not isinstance(t, torch.Tensor):
                raise InputError(f"input {name!r} is a {type(t).__name__}; disc.compile takes tensor inputs")
            if t.dtype != dtype or t.dim() != len(dims):
                raise InputError(f"input {name!r} is {t.dtype} of rank {t.dim()}; this program was compiled for {dtype} of rank {len(dims)}")
            for axis, (size, fixed) in enumerate(zip(t.shape, dims)):
                if fixed is not None and size != fixed:
                    raise InputError(f"input {name!r} dim {axis} is {size}; it is static ({fixed}): name it in dynamic= to vary it")
        self.calls += 1
        with torch.no_grad():
            return self._compiled(*args)

    def text(self) -> str:
        head = [
            f"== disc: {self.name} (via disc.compile, one graph per branch) ==",
            f"torch.export could not capture one program for every shape: {self.why.splitlines()[0]}",
            f"compiled through torch.compile(backend='disc', dynamic=True): {self.num_compilations} graph(s) so far, {self.calls} call(s)",
        ]
        return "\n\n".join(["\n".join(head)] + [r.text() for r in self.graph_reports])

    def save(self, folder: str | os.PathLike) -> Path:
        from disc.runtime.program_files import ArtifactError

        raise ArtifactError(
            f"{self.name} has no single program to save: torch.export could not capture it for every shape "
            f"({self.why.splitlines()[0]}); fix the dims its code branches on, or save a model without such branches"
        )
