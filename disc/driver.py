"""The one compile driver: a frontend's graph in, a program that runs it out.

`compile_graph` is what every path runs (``disc.compile``, the torch.compile plug-in, and
``disc.load`` for programs it cannot open as saved libraries): the pass pipeline, then the
choice of how the graph runs, below. It sits above the runtime and the code generators and
drives both; neither imports it.

Choosing how a compiled graph runs: the native CPU program, the Triton GPU program, or the reference executor.

``backend="auto"`` (the default, or ``$DISC_BACKEND``) builds the program for
the device the example inputs live on (the native CPU program, or the Triton
program for a GPU). Ops that program cannot hold run in PyTorch between
compiled segments (``disc.runtime.segments``): the frontend's fallbacks, and
under "auto" the ops the code generator refuses. The reference executor runs
the whole graph only when no segment can be formed, with the reason recorded
so ``disc.explain`` can say it. ``"native"`` and ``"triton"`` make a refused op
an error instead (``"triton"`` on CPU tensors runs in Triton's interpreter when
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
from disc.ir.graph import Graph, Node
from disc.report import BackendChoice
from disc.runtime.reference import ReferenceExecutor

BACKENDS = ("auto", "native", "triton", "reference")


@dataclass
class Program:
    """A compiled graph: the optimised IR, what runs it, and how that was chosen."""

    graph: Graph
    executor: Any
    choice: BackendChoice


def compile_graph(graph: Graph, host_ops: Mapping[str, Any], *, backend: str | None = None, device: str = "cpu", optimize: bool = True) -> Program:
    """Optimise ``graph`` (the pass pipeline; ``optimize=False`` for an IR that already was, such
    as a saved one) and build what runs it. ``host_ops``: the frontend's fallbacks by call key,
    the ops the host framework runs between compiled segments; ``device``: the device type of
    the inputs ("cpu", "cuda"); ``backend`` as for ``disc.compile``."""
    from disc.passes.pipeline import run_pipeline

    if optimize:
        graph = run_pipeline(graph)
    executor, choice = make_executor(graph, host_ops, backend, device)
    return Program(graph, executor, choice)


def example_device(examples: Any) -> str:
    """The device type the program runs on: a GPU's when any tensor among ``examples`` is on one,
    else "cpu". A model on a GPU still holds 0-d host tensors (a scale kept as a buffer, the seeds
    an attention kernel returns), which PyTorch lets mix with device tensors."""
    for x in examples:
        if isinstance(x, torch.Tensor) and not x.is_cpu:
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
        return ReferenceExecutor(graph, fallbacks, device), BackendChoice("reference", "backend='reference' was asked for")
    from disc.codegen.lowering import Unsupported
    from disc.runtime.segments import runs_on_host

    gpu = backend == "triton" or (backend == "auto" and device != "cpu")
    if backend == "native" and device != "cpu":
        raise CompileError(f"backend='native' generates CPU code, but the inputs are on {device}; use backend='triton'")
    if gpu:
        try:
            import disc.runtime.triton_runtime  # noqa: F401
        except ImportError as e:  # triton is not installed
            raise CompileError(f"the GPU backend needs Triton: {e}") from e
    # Ops the code generator refuses move to PyTorch, between compiled segments: the ones its declared
    # support refuses all at once, the ones refused while planning (a view a library cannot read) in turn.
    refused: dict[Node, str] = {}
    for _ in range(MAX_REFUSALS):
        if refused or any(runs_on_host(n, gpu) for n in graph.nodes):
            try:
                return _segmented_executor(graph, fallbacks, refused, gpu, device)
            except Unsupported as e:
                if backend != "auto":
                    raise CompileError(f"no compiled program for this graph's segments: {e}") from e
                if not _refuse(graph, e, refused):
                    return ReferenceExecutor(graph, fallbacks, device), BackendChoice("reference", f"not supported around the host ops: {e}")
            continue
        try:
            executor, build, name = _compiled(graph, gpu)
            return executor, BackendChoice(name, native=None if gpu else build, triton=build if gpu else None)
        except Unsupported as e:
            where = "Triton" if gpu else "native"
            if backend != "auto":
                raise CompileError(f"no {where} program for this graph: {e}") from e
            if not _refuse(graph, e, refused):
                why = "not supported by the Triton backend" if gpu else "not natively supported"
                return ReferenceExecutor(graph, fallbacks, device), BackendChoice("reference", f"{why}: {e}")
    return ReferenceExecutor(graph, fallbacks, device), BackendChoice("reference", f"more than {MAX_REFUSALS} ops refused by the code generator")


def _compiled(graph: Graph, gpu: bool) -> tuple[Any, Any, str]:
    """``graph``'s program for the GPU (Triton) or the CPU (C++): its executor, its build and the backend's name."""
    if gpu:
        from disc.passes.attention import fuse_attention
        from disc.runtime.triton_runtime import TritonExecutor, build_triton, interpreting

        graph = fuse_attention(graph)  # GEMM-softmax-GEMM chains to the library's fused attention
        build = build_triton(graph)
        return TritonExecutor(graph, build), build, "triton-interpreter" if interpreting() else "triton-gpu"
    from disc.runtime.native import NativeExecutor, build_native

    build = build_native(graph)
    return NativeExecutor(graph, build), build, "native-cpu"


MAX_REFUSALS = 16  # code-generator refusals moved to PyTorch before the whole graph goes to the reference executor


def _refuse(graph: Graph, e: Exception, refused: dict[Node, str]) -> bool:
    """Record the ops ``e`` blames as refused (to run in PyTorch); False when it blames none it can move."""
    by_name = {n.name: n for n in graph.nodes}
    blamed = [by_name.get(n.name) for n in getattr(e, "nodes", ())]
    new = [n for n in blamed if n is not None and n not in refused and not n.is_index and n.op not in ("input", "constant")]
    for n in new:
        refused[n] = str(e)
    return bool(new)


def _segmented_executor(graph: Graph, fallbacks: Mapping[str, Any], refused: Mapping[Node, str], gpu: bool, device_type: str = "cpu") -> tuple[Any, BackendChoice]:
    """Compiled segments with the host ops run by PyTorch between them (``disc.runtime.segments``)."""
    from disc.runtime.segments import SegmentedExecutor, plan_segments, summary

    plan = plan_segments(graph, refused, gpu)
    name = "triton" if gpu else "native-cpu"
    for seg in plan.segments:
        seg.executor, seg.build, name = _compiled(seg.graph, gpu)
    # Where the host ops' tensors live: the segments' device, or the inputs' when every op runs on the host.
    device = (plan.segments[0].executor.device if plan.segments else torch.device(device_type)) if gpu else None
    executor = SegmentedExecutor(graph, plan, fallbacks, device)
    return executor, BackendChoice(f"{name} segments", summary(plan), segments=plan)
