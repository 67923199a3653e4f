"""The GPU executor: builds the generated Triton program and runs it, plus the runtime it calls.

``build_triton`` lowers the graph (the same ``LoweredProgram`` as the CPU
backend), prints it as one Python module (``codegen/triton/program.py``) and
imports it from the compile cache: Triton reads a kernel's source from its
file, and the file is the readable artifact. ``TritonRuntime`` is the small
interface the generated host flow calls (the GPU counterpart of the C RAL):
output allocation, the per-thread workspace, GEMM and convolution through
torch (cuBLAS/cuDNN on a GPU), kernel launches and shape errors.

On a machine without a GPU the same program runs on CPU tensors in Triton's
interpreter (``TRITON_INTERPRET=1``): that is how CI tests every kernel form.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType

import torch

from disc.codegen.lowering import LoweredProgram, lower, resolve_outputs, workspace_bytes
from disc.errors import ShapeError
from disc.ir.graph import Graph
from disc.ir.types import DTYPES
from disc.runtime.cuda_graphs import GraphCache, graph_limits
from disc.runtime.reference import ExecutionProfile

CACHE_FORMAT = "disc-triton-cache-1"
ALIGN = 256  # bytes: every workspace slot starts on this boundary (wide vector loads on GPUs)


def interpreting() -> bool:
    """Do Triton kernels run in the interpreter (on CPU tensors) rather than on a GPU?"""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_device() -> torch.device:
    """Where a Triton program's tensors live: the GPU, or the CPU under the interpreter."""
    if interpreting():
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("the Triton backend needs a CUDA/ROCm GPU, or TRITON_INTERPRET=1 to run kernels in Triton's interpreter")
    return torch.device("cuda", torch.cuda.current_device())


@dataclass
class TritonBuild:
    lowered: LoweredProgram
    source: object  # TritonSource
    module: ModuleType
    path: str
    seconds: float
    # (step, version, constexpr values..., num_warps) -> a launcher of that site's compiled form (GPU only)
    compiled: dict = field(default_factory=dict)
    compile_seconds: float = 0.0  # of ``seconds``: Triton compiling every kernel form ahead of the first call


def build_triton(graph: Graph) -> TritonBuild:
    """Lower, generate and import ``graph``'s Triton program (raises ``Unsupported`` when it has no GPU form)."""
    import triton

    from disc.codegen.cpu.toolchain import cache_dir
    from disc.codegen.triton.program import emit_program, refusal

    start = time.perf_counter()
    lowered = lower(graph, gpu=True, refusal=refusal)
    source = emit_program(lowered)
    key = hashlib.sha256("\0".join([CACHE_FORMAT, triton.__version__, source.text]).encode()).hexdigest()[:32]
    folder = cache_dir() / "triton" / key
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"disc_{''.join(ch if ch.isalnum() else '_' for ch in graph.name)}.py"
    if not path.exists() or path.read_text() != source.text:  # a partial or stale file is rewritten, never imported
        tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(source.text)
        os.replace(tmp, path)
    module_name = f"disc_triton_{key}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[module_name] = module
    compiled, compile_seconds = ({}, 0.0) if interpreting() else precompile(module, source)
    if interpreting() and os.environ.get("DISC_TRITON_FORMS_LOG"):
        from disc.runtime.triton_target import log_forms

        log_forms(os.environ["DISC_TRITON_FORMS_LOG"], str(path), source)
    return TritonBuild(lowered, source, module, str(path), time.perf_counter() - start, compiled, compile_seconds)


# A dim argument is compiled as a 64-bit integer (the kernels index in int64 anyway), so one
# compiled form takes any dim; a small value would make Triton pick a 32-bit parameter.
_DIM_PLACEHOLDER = 1 << 40


def precompile(module: ModuleType, source) -> tuple[dict, float]:
    """Compile every form of every kernel (each version, each constexpr choice) before the first call.

    Dims are not specialised (``do_not_specialize``) and every buffer the host flow passes is
    16-byte aligned (``TritonRuntime.prepare``, slots on ``ALIGN``), so these forms are all a
    program ever launches: no shape compiles anything at run time."""
    from concurrent.futures import ThreadPoolExecutor

    start = time.perf_counter()
    # Structurally identical groups share a function, possibly over other dtypes (a copy kernel
    # prints the same for i64 and f32), so a compiled form is keyed by its dtypes too, and each
    # launch site (step, version) finds the form of its own buffers.
    jobs: dict[tuple, tuple] = {}  # (function, dtypes, constexprs, num_warps) -> warmup arguments
    sites: dict[tuple, tuple] = {}  # (step, version, constexpr values..., num_warps) -> job key
    for step, call in enumerate(source.calls):
        kernel = getattr(call, "kernel", None)
        if kernel is None:
            continue
        ptrs = tuple(DTYPES[n.dtype] for n in kernel.params)
        dims = [_DIM_PLACEHOLDER] * len(kernel.dims)
        for v, version in enumerate(kernel.versions):
            fn = getattr(module, version.function)
            for choice in version.choices:
                job = (fn, ptrs, tuple(choice.items()), version.num_warps)
                jobs.setdefault(job, (fn, [*ptrs, *dims], choice, version.num_warps))
                sites[(step, v, *choice.values(), version.num_warps)] = job
    device = torch.cuda.current_device()

    def build(args):
        fn, params, choice, num_warps = args
        torch.cuda.set_device(device)
        return _Launcher(fn.warmup(*params, grid=(1,), num_warps=num_warps, **choice))

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        built = dict(zip(jobs, pool.map(build, jobs.values())))
    return {site: built[job] for site, job in sites.items()}, time.perf_counter() - start


def _hooked(hook) -> bool:
    """Is a launch hook (a profiler's) installed? Triton 3.6 keeps a ``HookChain`` that is never
    None (hooked when it holds calls); earlier versions keep None or the hook itself."""
    return bool(getattr(hook, "calls", hook is not None))


class _Launcher:
    """Launches one compiled kernel form straight through Triton's launcher, without the per-call
    argument binding, specialisation and cache lookup of ``kernel[grid](...)``."""

    def __init__(self, compiled) -> None:
        compiled._init_handles()
        self.run = compiled.run
        self.function = compiled.function
        self.packed_metadata = compiled.packed_metadata

    def __call__(self, grid: int, stream: int, args: tuple, consts: tuple) -> None:
        self.run(grid, 1, 1, stream, self.function, self.packed_metadata, None, None, None, *args, *consts)


def place_slots(sizes: Sequence[int], clash: Sequence[Sequence[int]]) -> tuple[list[int], int]:
    """Offsets for workspace slots at this call's sizes, and the total: slots live at the same time never overlap.

    Largest first, each in the lowest gap its already placed clashing slots leave
    (the same packing as the C++ host flow's ``disc_place_slots``).
    """
    aligned = [(s + ALIGN - 1) // ALIGN * ALIGN for s in sizes]
    offsets = [0] * len(sizes)
    placed = [False] * len(sizes)
    total = 0
    for i in sorted(range(len(sizes)), key=lambda k: -aligned[k]):
        taken = sorted((offsets[j], offsets[j] + aligned[j]) for j in clash[i] if placed[j] and aligned[j] > 0)
        at = 0
        for lo, hi in taken:
            if lo >= at + aligned[i]:
                break
            at = max(at, hi)
        offsets[i], placed[i] = at, True
        total = max(total, at + aligned[i])
    return offsets, total


_THREAD_WORKSPACE = threading.local()
# Triton's interpreter patches triton.language globally while a kernel runs, so interpreted
# launches from several threads must take turns; compiled GPU launches need no lock.
_INTERPRETER_LOCK = threading.Lock()


class TritonRuntime:
    """What the generated host flow calls. Per-call state lives in the call's locals: one runtime serves every thread."""

    def __init__(self, device: torch.device, profile: bool = False, compiled: dict | None = None) -> None:
        self.device = device
        self.hits: Counter | None = Counter() if profile else None  # (step, version) -> calls
        self.compiled = compiled or {}  # TritonBuild.compiled: the launchers of the precompiled forms
        self.jit_launches: Counter = Counter()  # (kernel, constexprs, num_warps) launched through Triton's JIT path
        if self.compiled:
            from triton import knobs
            from triton.runtime.driver import driver

            self._knobs = knobs.runtime
            self._stream = driver.active.get_current_stream

    def prepare(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The inputs as the kernels read them: contiguous, and 16-byte aligned (an input that is a
        view at an odd offset is copied), so the precompiled kernels' vector loads are valid."""
        out = []
        for t in inputs:
            t = t.contiguous()
            if t.data_ptr() % 16:
                t = t.clone()
            out.append(t)
        return out

    def empty(self, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=self.device)

    def workspace(self, sizes: list[int], clash: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
        """This thread's workspace (kept between calls and programs) and the slot offsets.

        Grown geometrically (``workspace_bytes``), the old buffer released first."""
        offsets, total = place_slots(sizes, clash)
        key = str(self.device)
        kept = getattr(_THREAD_WORKSPACE, "buffers", None)
        if kept is None:
            kept = _THREAD_WORKSPACE.buffers = {}
        ws = kept.get(key)
        if ws is None or ws.numel() < total:
            size = workspace_bytes(ws, max(total, ALIGN))
            kept[key] = ws = None
            ws = kept[key] = torch.empty(size, dtype=torch.uint8, device=self.device)
        return ws, offsets

    def launch(self, step: int, version: int, kernel, grid: int, args: tuple, consts: dict, num_warps: int) -> None:
        if self.hits is not None:
            self.hits[(step, version)] += 1
        if grid <= 0:
            return
        if interpreting():
            with _INTERPRETER_LOCK:
                kernel[(grid,)](*args, num_warps=num_warps, **consts)
            return
        values = tuple(consts.values())
        launcher = self.compiled.get((step, version, *values, num_warps))
        if launcher is None or _hooked(self._knobs.launch_enter_hook):
            # Not precompiled (a runtime built without its program's forms) or a profiler's
            # launch hook is set: Triton's own launch path (which compiles on first use).
            self.jit_launches[(kernel.__name__, values, num_warps)] += 1
            kernel[(grid,)](*args, num_warps=num_warps, **consts)
            return
        launcher(grid, self._stream(self.device.index), args, values)

    def matmul(self, step: int, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, plain: bool) -> None:
        """A (batched) matrix product on strided views: cuBLAS reads transposed operands as they are.
        ``plain``: ``out`` is a row-major view the library writes in place."""
        if self.hits is not None:
            self.hits[(step, 0)] += 1
        if plain:
            torch.matmul(a, b, out=out)
        else:
            out.copy_(torch.matmul(a, b))

    def contract(self, step: int, spec: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
        """A GEMM / batched GEMM on strided views: the library reads transposes and head splits through strides."""
        if self.hits is not None:
            self.hits[(step, 0)] += 1
        out.copy_(torch.einsum(spec, a, b))

    def attention(
        self, step: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor, scale: float, grouped: bool = False
    ) -> None:
        """softmax(q k^T * scale + bias) v into ``out``, by PyTorch's attention, which picks the fused
        kernel (flash, memory-efficient, cuDNN) for these shapes at each call, under the caller's
        choices. ``grouped``: k and v have fewer heads, each serving a group of query heads (GQA)."""
        if self.hits is not None:
            self.hits[(step, 0)] += 1
        out.copy_(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale, enable_gqa=grouped))

    def conv(
        self, step: int, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, stride, padding, dilation, groups: int, channels_last: bool = False
    ) -> None:
        """A 1-, 2- or 3-d convolution into ``out``; with ``channels_last`` x and out are NHWC
        buffers, which torch reads as channels-last NCHW tensors (cuDNN's preferred layout) without a copy."""
        if self.hits is not None:
            self.hits[(step, 0)] += 1
        if channels_last:
            x, out = x.permute(0, 3, 1, 2), out.permute(0, 3, 1, 2)
        out.copy_(torch.ops.aten.convolution(x, w, None, stride, padding, dilation, False, [0] * len(stride), groups))

    def conv_backward_input(self, step: int, gy: torch.Tensor, w: torch.Tensor, out: torch.Tensor, stride, padding, dilation, groups: int, channels_last: bool) -> None:
        """dL/dx of a convolution into ``out`` (whose shape is x's; its values are not read)."""
        self._conv_grad(step, gy, out, w, out, 0, stride, padding, dilation, groups, channels_last)

    def conv_backward_weight(self, step: int, x: torch.Tensor, gy: torch.Tensor, out: torch.Tensor, stride, padding, dilation, groups: int, channels_last: bool) -> None:
        """dL/dw of a convolution into ``out`` (whose shape is w's; its values are not read)."""
        self._conv_grad(step, gy, x, out, out, 1, stride, padding, dilation, groups, channels_last)

    def _conv_grad(self, step, gy, x, w, out, which: int, stride, padding, dilation, groups, channels_last) -> None:
        if self.hits is not None:
            self.hits[(step, 0)] += 1
        if channels_last:  # NHWC buffers, read as channels-last NCHW tensors
            gy, x = gy.permute(0, 3, 1, 2), x.permute(0, 3, 1, 2)
            if which == 0:
                out = out.permute(0, 3, 1, 2)
        mask = [which == 0, which == 1, False]
        grads = torch.ops.aten.convolution_backward(gy, x, w, None, stride, padding, dilation, False, [0] * len(stride), groups, mask)
        out.copy_(grads[which])

    @staticmethod
    def shape_error(message: str) -> None:
        raise ShapeError(message)


class _GraphRuntime(TritonRuntime):
    """The runtime of a call a CUDA graph records: the thread's kept workspace may be replaced
    later, so the graph gets a workspace of its own, allocated in its private memory pool."""

    def workspace(self, sizes: list[int], clash: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
        offsets, total = place_slots(sizes, clash)
        return torch.empty(max(total, ALIGN), dtype=torch.uint8, device=self.device), offsets


def release_workspace() -> None:
    """Free the calling thread's kept GPU workspaces."""
    _THREAD_WORKSPACE.buffers = {}


class TritonExecutor:
    """Runs a built Triton program on tensors of its device."""

    def __init__(self, graph: Graph, build: TritonBuild, device: torch.device | None = None) -> None:
        self.graph = graph
        self.build = build
        self.device = device or triton_device()
        self.runtime = TritonRuntime(self.device, compiled=build.compiled)
        lp = build.lowered
        self._consts = [graph.constants[name].contiguous().to(self.device) for name in build.source.constants]
        self._const_by_name = dict(zip(build.source.constants, self._consts))
        self._out_specs = lp.outputs
        self.graphs: GraphCache | None = None
        shapes, nbytes = graph_limits()
        if self.device.type == "cuda" and not interpreting() and shapes > 0:
            self.graphs = GraphCache(self._record, shapes, nbytes)

    def run(self, inputs: Sequence[torch.Tensor], runtime: TritonRuntime | None = None) -> list[torch.Tensor]:
        if self.device.type != "cpu" and any(t.is_cpu for t in inputs):  # 0-d host scalars (the input checks allow no others)
            inputs = [t.to(self.device) if t.is_cpu else t for t in inputs]
        if runtime is None and self.graphs is not None:
            outs = self.graphs.run(inputs)
            if outs is not None:
                return resolve_outputs(self._out_specs, outs, inputs, self._constant)
        outs, _ = self.build.module.disc_run(runtime or self.runtime, list(inputs), self._consts)
        return resolve_outputs(self._out_specs, outs, inputs, self._constant)

    def _record(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """One call while a CUDA graph records it: its workspace is its own, in the graph's memory."""
        outs, _ = self.build.module.disc_run(_GraphRuntime(self.device, compiled=self.build.compiled), inputs, self._consts)
        return outs

    def _constant(self, name: str) -> torch.Tensor:
        return self._const_by_name.get(name, self.graph.constants[name])

    def versions_run(self, inputs: Sequence[torch.Tensor]) -> dict[int, str]:
        """Per kernel step, the label of the speculation version these inputs run (library steps: "library")."""
        rt = TritonRuntime(self.device, profile=True, compiled=self.build.compiled)
        self.run(inputs, rt)
        out = {}
        for (step, version) in rt.hits:
            call = self.build.source.calls[step]
            kernel = getattr(call, "kernel", None)
            out[step] = kernel.versions[version].label if kernel is not None else "library"
        return out

    def profile(self, inputs: Sequence[torch.Tensor]) -> ExecutionProfile:
        self.run(inputs)
        counts = self.build.lowered.counts()
        kernels = {"memory_bound": counts["memory_bound"], "library": counts["library"], "fallback": 0}
        return ExecutionProfile(kernels=kernels, workspace_bytes=0)
