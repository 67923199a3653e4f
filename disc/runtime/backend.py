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
    name: str  # "native-cpu", "triton-gpu", "triton-interpreter" or "reference", with " segments" when cut at fallbacks
    reason: str = ""  # why the reference executor runs it, when it does
    native: Any = None  # NativeBuild of the native program
    triton: Any = None  # TritonBuild of the GPU program
    segments: Any = None  # SegmentPlan, when fallbacks run in PyTorch between compiled segments


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

    gpu = backend == "triton" or (backend == "auto" and device != "cpu")
    if backend == "native" and device != "cpu":
        raise CompileError(f"backend='native' generates CPU code, but the inputs are on {device}; use backend='triton'")
    if any(n.op == "torch_fallback" for n in graph.nodes):
        return _segmented_executor(graph, fallbacks, gpu, explicit=backend != "auto")
    if gpu:
        return _triton_executor(graph, fallbacks, explicit=backend == "triton")
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


def _segmented_executor(graph: Graph, fallbacks: Mapping[str, Any], gpu: bool, explicit: bool) -> tuple[Any, BackendChoice]:
    """Compiled segments with the fallbacks run by PyTorch between them (``disc.runtime.segments``)."""
    from disc.codegen.lowering import Unsupported
    from disc.runtime.segments import SegmentedExecutor, plan_segments

    try:
        plan = plan_segments(graph)
        if gpu:
            from disc.runtime.triton_runtime import TritonExecutor, build_triton, interpreting

            for seg in plan.segments:
                seg.build = build_triton(seg.graph)
                seg.executor = TritonExecutor(seg.graph, seg.build)
            name = "triton-interpreter" if interpreting() else "triton-gpu"
        else:
            from disc.runtime.native import NativeExecutor, build_native

            for seg in plan.segments:
                seg.build = build_native(seg.graph)
                seg.executor = NativeExecutor(seg.graph, seg.build)
            name = "native-cpu"
    except (Unsupported, ImportError) as e:
        if explicit:
            raise CompileError(f"no compiled program for this graph's segments: {e}") from e
        return ReferenceExecutor(graph, fallbacks), BackendChoice("reference", f"segments around the fallbacks not supported: {e}")
    device = plan.segments[0].executor.device if gpu and plan.segments else None
    executor = SegmentedExecutor(graph, plan, dict(fallbacks), device)
    n = sum(len(fs) for fs in plan.fallbacks)
    why = f"{len(plan.segments)} compiled segments, {n} fallbacks run by PyTorch between them"
    return executor, BackendChoice(f"{name} segments", why, segments=plan)
