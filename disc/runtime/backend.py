"""Choosing how a compiled graph runs: the native CPU program, the Triton GPU program, or the reference executor.

``backend="auto"`` (the default, or ``$DISC_BACKEND``) builds the program for
the device the example inputs live on (the native CPU program, or the Triton
program for a GPU) and falls back to the reference executor only when the
graph uses something the code generator does not handle, recording why, so
``disc.explain`` can say it. ``"native"`` and ``"triton"`` make that an error
instead (``"triton"`` on CPU tensors runs in Triton's interpreter when
``TRITON_INTERPRET=1``: how CI tests the GPU path); ``"reference"`` skips code
generation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from disc.errors import CompileError
from disc.ir.graph import Graph
from disc.runtime.reference import ReferenceExecutor

BACKENDS = ("auto", "native", "triton", "reference")


@dataclass
class BackendChoice:
    name: str  # "native-cpu", "triton-gpu", "triton-interpreter" or "reference"
    reason: str = ""  # why the reference executor runs it, when it does
    native: Any = None  # NativeBuild of the native program
    triton: Any = None  # TritonBuild of the GPU program


def example_device(examples: Any) -> str:
    """The device type of the first tensor among ``examples`` ("cpu" when there is none)."""
    for x in examples:
        if isinstance(x, torch.Tensor):
            return x.device.type
    return "cpu"


def executor_device(executor: Any) -> str:
    """The device type an executor's inputs must be on."""
    device = getattr(executor, "device", None)
    return device.type if device is not None else "cpu"


def default_backend() -> str:
    return os.environ.get("DISC_BACKEND", "auto")


def make_executor(graph: Graph, fallbacks: Mapping[str, Any], backend: str | None = None, device: str = "cpu") -> tuple[Any, BackendChoice]:
    """An executor for ``graph`` (``run(inputs) -> outputs``, ``profile(inputs)``, ``device``) and what was chosen.

    ``device`` is the device type of the example inputs ("cpu", "cuda").
    """
    backend = backend or default_backend()
    if backend not in BACKENDS:
        raise CompileError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    if backend == "reference":
        return ReferenceExecutor(graph, fallbacks), BackendChoice("reference", "backend='reference' was asked for")
    from disc.codegen.lowering import Unsupported

    if backend == "triton" or (backend == "auto" and device != "cpu"):
        return _triton_executor(graph, fallbacks, explicit=backend == "triton")
    if backend == "native" and device != "cpu":
        raise CompileError(f"backend='native' generates CPU code, but the inputs are on {device}; use backend='triton'")
    from disc.runtime.native import NativeExecutor, build_native

    try:
        native = build_native(graph)
    except Unsupported as e:
        if backend == "native":
            raise CompileError(f"no native program for this graph: {e}") from e
        return ReferenceExecutor(graph, fallbacks), BackendChoice("reference", f"not natively supported: {e}")
    return NativeExecutor(graph, native), BackendChoice("native-cpu", native=native)


def _triton_executor(graph: Graph, fallbacks: Mapping[str, Any], explicit: bool) -> tuple[Any, BackendChoice]:
    from disc.codegen.lowering import Unsupported

    try:
        from disc.runtime.triton_runtime import TritonExecutor, build_triton, interpreting
    except ImportError as e:  # triton is not installed
        raise CompileError(f"the GPU backend needs Triton: {e}") from e
    try:
        build = build_triton(graph)
    except Unsupported as e:
        if explicit:
            raise CompileError(f"no Triton program for this graph: {e}") from e
        return ReferenceExecutor(graph, fallbacks), BackendChoice("reference", f"not supported by the Triton backend: {e}")
    name = "triton-interpreter" if interpreting() else "triton-gpu"
    return TritonExecutor(graph, build), BackendChoice(name, triton=build)
