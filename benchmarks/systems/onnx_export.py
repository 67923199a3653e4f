"""The ONNX export for onnxruntime, and what the CPU peers (onnxruntime, OpenVINO) share.

The model goes through ``torch.onnx.export(dynamo=True)`` (torch.export, then
ONNX) with one named ``torch.export.Dim`` per dim of ``workload.dynamic``, so
inputs that share a dim share its ONNX ``dim_param``; it is exported once per
workdir and reused on a warm start. Next to each exported file lies the pytree
spec of the model's outputs, so a runner hands back the same structure as
eager (a tensor, or a tuple of tensors) without exporting again.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.export import Dim

from benchmarks.systems.base import Context, System
from benchmarks.workloads import Shape, Workload


class ExportError(RuntimeError):
    """The model could not be exported (or converted) to a graph with dynamic dims; the message says why, on one line."""


def spec_path(path: Path) -> Path:
    """Where the output structure of the model exported to ``path`` is kept."""
    return path.with_name(path.name + ".outspec.json")


def export_onnx(model: nn.Module, workload: Workload, example: tuple, path: Path) -> Path:
    """Export ``model`` to ``path`` with every dim of ``workload.dynamic`` dynamic; an existing export is reused."""
    path = Path(path)
    if path.exists() and spec_path(path).exists():
        return path
    args = trace_args(workload, example)
    made: dict[str, Any] = {}
    dynamic_shapes = {arg: {axis: made.setdefault(dim, Dim(dim)) for axis, dim in axes.items()} for arg, axes in workload.dynamic.items()}
    try:
        with _quiet_exporter():
            program = torch.onnx.export(
                model, args, dynamo=True, dynamic_shapes=dynamic_shapes, input_names=list(workload.arg_names), verbose=False
            )
    except Exception as exc:
        raise ExportError(f"torch.onnx.export of {workload.name} failed: {root_cause(exc)}") from exc
    _check_dynamic(program, workload)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_output_spec(path, program.exported_program.call_spec.out_spec)
    # Written under another name and renamed last: an interrupted export never looks reusable.
    partial = path.with_name(path.name + ".partial")
    program.save(partial, external_data=False)
    os.replace(partial, path)
    return path


def trace_args(workload: Workload, example: tuple) -> tuple:
    """The inputs to trace with: ``example``, unless a dynamic dim is 1 there.

    torch.export may specialize a dim whose example size is 1 (with the smoke
    workload's 1x1 the exporter silently returned a static graph), so such
    dims are traced at the largest size the stream gives them (at least 2).
    """
    sizes = {dim: int(arg.shape[axis]) for arg, axes in zip(example, workload.dynamic.values()) for axis, dim in axes.items()}
    if all(size > 1 for size in sizes.values()):
        return example
    bumped = {dim: max([2, *(s[dim] for s in workload.stream)]) for dim, size in sizes.items() if size == 1}
    traced: Shape = {**workload.stream[0], **sizes, **bumped}
    return tuple(new.to(old.dtype) for new, old in zip(workload.inputs(traced), example))


def save_output_spec(path: Path, spec: pytree.TreeSpec) -> None:
    spec_path(path).write_text(pytree.treespec_dumps(spec))


def load_output_spec(path: Path) -> pytree.TreeSpec:
    return pytree.treespec_loads(spec_path(Path(path)).read_text())


def to_torch(outputs: Sequence[np.ndarray], spec: pytree.TreeSpec) -> Any:
    """The runtime's flat outputs as torch tensors, in the structure eager returns."""
    return pytree.tree_unflatten([torch.from_numpy(np.asarray(o)) for o in outputs], spec)


def input_arrays(workload: Workload, args: Sequence[torch.Tensor], names: set[str]) -> dict[str, np.ndarray]:
    """Feeds by ONNX input name; args the exporter found unused (and dropped) are left out."""
    return {name: a.detach().cpu().numpy() for name, a in zip(workload.arg_names, args) if name in names}


class CpuPeer(System):
    """Another framework's CPU runtime, run on an exported graph and compared in float32 only."""

    def unsupported(self, workload: Workload, ctx: Context) -> str | None:
        if ctx.dtype != torch.float32:
            return "runs float32 only (the CPU peers are compared in full precision)"
        return super().unsupported(workload, ctx)


def _check_dynamic(program: Any, workload: Workload) -> None:
    """Fail now, with the dim's name, rather than with a shape error at the first other shape."""
    inputs = {value.name: value for value in program.model.graph.inputs}
    for arg, axes in workload.dynamic.items():
        if arg not in inputs:
            continue
        for axis, dim in axes.items():
            size = inputs[arg].shape[axis]
            if isinstance(size, int):
                raise ExportError(f"the ONNX export of {workload.name} fixed dim {dim!r} ({arg} axis {axis}) to {size}")


def root_cause(exc: BaseException) -> str:
    """The innermost cause's first line: the exporter wraps the real reason in pages of advice."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


@contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's expected noise, which would otherwise bury the suite's own output."""
    # It warns once per torchvision op it cannot register (no workload uses them), once per input that
    # shares a named dim with another (the point of naming them), and about its own use of a pytree API.
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"# The axis name", category=UserWarning)
            warnings.filterwarnings("ignore", message=r".*LeafSpec", category=FutureWarning)
            yield
    finally:
        logger.setLevel(level)
