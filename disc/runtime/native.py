"""The native CPU executor: builds the generated program and calls it.

One call is two native calls: ``disc_shapes`` (output dims and workspace
size from the input shapes, with the program's run-time shape checks), then
``disc_run`` on torch-allocated outputs and workspace, passed zero-copy.
Parameters are passed once as a pointer table. The executor holds no per-call
state, and ctypes releases the GIL during the calls, so one program serves
several threads at once with different shapes.
"""

from __future__ import annotations

import ctypes
import math
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

# The build is the code generator's (codegen/cpu/build.py, torch-free); these names are re-exported
# for the callers that build and run here.
from disc.codegen.cpu.build import NativeBuild as NativeBuild
from disc.codegen.cpu.build import NativeSignature as NativeSignature
from disc.codegen.cpu.build import build_native as build_native
from disc.codegen.cpu.build import build_options as build_options
from disc.codegen.cpu.build import step_profile as step_profile
from disc.codegen.cpu.ops import PRELUDE
from disc.codegen.cpu.signature import signature_text
from disc.codegen.cpu.toolchain import warm_prelude
from disc.codegen.lowering import resolve_outputs, workspace_bytes
from disc.errors import ShapeError
from disc.ir.graph import Graph
from disc.ir.types import DTYPES
from disc.runtime.reference import ExecutionProfile


class NativeRunError(RuntimeError):
    """The native program reported an error (from a library call or the RAL)."""


def warm_toolchain() -> list[Path]:
    """Build what every native program's compile reuses, once per machine and compiler.

    That is the RAL library and the precompiled standard headers of generated programs
    (`toolchain.precompiled_prelude`); both are made on first use anyway, so calling this is
    only a way to pay for them at install time. Returns their cache folders.
    """
    from disc.runtime.ral import build_ral

    folders = [build_ral().path.parent]
    prelude = warm_prelude(PRELUDE, build_options()["flags"])
    if prelude is not None:
        folders.append(prelude.parent)
    return folders


def _torch_empty(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


PLANS_KEPT = 256  # input shapes whose native plan (dims, output shapes, workspace) an executor keeps
_THREAD_WORKSPACE = threading.local()  # .workspace: the calling thread's kept workspace


def release_memory() -> int:
    """Give back the memory native programs keep between calls: the calling thread's workspace
    (other threads keep theirs) and the freed output blocks the RAL holds for reuse. The next call
    allocates afresh. Returns the bytes freed."""
    from disc.runtime.ral import release_cached_outputs

    ws = getattr(_THREAD_WORKSPACE, "workspace", None)
    _THREAD_WORKSPACE.workspace = None
    return (ws.numel() if ws is not None else 0) + release_cached_outputs()


class NativeExecutor:
    """Runs a built native program on torch tensors."""

    def __init__(self, graph: Graph, native: NativeBuild, ral: Any = None) -> None:
        from disc.runtime.ral import load_ral

        self.graph = graph
        self.native = native
        self.ral = ral or load_ral()
        lib = ctypes.CDLL(str(native.build.path))
        self._shapes = lib.disc_shapes
        self._shapes.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._shapes.restype = ctypes.c_int32
        self._run = lib.disc_run
        self._run.argtypes = [ctypes.c_void_p] * 8
        self._run.restype = ctypes.c_int32
        self._lib = lib  # keeps the library loaded
        sig = native.signature
        # The arrays below are sized from `sig` (a saved folder's interface.txt, for a loaded
        # program): the library must state the same, or it would read past them.
        stated = lib.disc_signature
        stated.restype, stated.argtypes = ctypes.c_char_p, []
        self._ranks = [len(n.shape) for n in graph.inputs]
        expected = signature_text(self._ranks, sig.buffers, len(sig.arguments), sig.data_dependent)
        if stated().decode() != expected:
            raise NativeRunError(f"{native.build.path} states the signature {stated().decode()!r}; its description gives {expected!r}")
        # Parameters stay alive (and at fixed addresses) for the life of the executor.
        self._consts = [graph.constants[name].contiguous() for name in sig.arguments]
        self._const_ptrs = (ctypes.c_void_p * max(len(self._consts), 1))(*[t.data_ptr() for t in self._consts])
        if self._consts:  # the RAL's packed copies of them (conv weights) go when the last program does
            self.ral.hold_constants(self._const_ptrs, len(self._consts), True)
            weakref.finalize(self, self.ral.hold_constants, self._const_ptrs, len(self._consts), False)
        self._out_meta = [(rank, DTYPES[dtype]) for dtype, rank in sig.buffers]
        # The ctypes array types of a call's arguments, made once (a call only fills them).
        self._dims_t = ctypes.c_int64 * max(sum(self._ranks), 1)
        self._out_dims_t = ctypes.c_int64 * max(sum(r for r, _ in self._out_meta), 1)
        self._in_ptrs_t = ctypes.c_void_p * max(len(graph.inputs), 1)
        self._out_ptrs_t = ctypes.c_void_p * max(len(self._out_meta), 1)
        self._out_specs = list(sig.outputs)
        self._data_dependent = sig.data_dependent  # outputs sized at a count's bound, then viewed at the count
        self._local = _THREAD_WORKSPACE
        # Large outputs reuse freed ones' memory (see OutputCache) where the RAL has the cache.
        self._empty = self.ral.outputs.empty if self.ral.outputs is not None else _torch_empty
        self._plans: dict[tuple[torch.Size, ...], tuple[Any, list[tuple[int, ...]], int]] = {}

    def _workspace(self, nbytes: int) -> torch.Tensor:
        """This thread's workspace, at least ``nbytes`` (+64 for alignment).

        Kept between calls: a fresh multi-megabyte buffer comes from the OS as untouched pages,
        and faulting them in on every call cost as much as the softmax writing them (BERT at
        4x384: 3.5 ms of a 6 ms kernel). The program itself stays stateless; the host keeps
        one buffer per thread, so concurrent calls never share it, and every program of the
        thread uses it (a call returns before the next starts): a training step's forward and
        backward keep the larger of their workspaces, not both. It grows geometrically
        (``workspace_bytes``), the old buffer freed before the new one is taken.
        """
        ws = getattr(self._local, "workspace", None)
        if ws is None or ws.numel() < nbytes + 64:
            size = workspace_bytes(ws, nbytes + 64)
            self._local.workspace = ws = None
            ws = self._local.workspace = torch.empty(size, dtype=torch.uint8)
        return ws

    def release_workspace(self) -> None:
        """Free the calling thread's kept workspace, shared by every program (the next call allocates a fresh one)."""
        self._local.workspace = None

    def _plan(self, inputs: Sequence[torch.Tensor], ctx: Any = None) -> tuple[Any, list[tuple[int, ...]], int]:
        """Input dims for the native calls, output shapes and workspace bytes (``disc_shapes``).

        They depend on the input shapes alone, so each shape's plan is kept (a repeated shape
        skips the native call and the ctypes arrays it needs: a third of a small call's
        overhead). The dims array is only read by ``disc_run``, so threads can share it.
        """
        key = tuple([t.shape for t in inputs])
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        dims = self._dims_t(*[d for t in inputs for d in t.shape])
        ctx = ctx if ctx is not None else self.ral.Ctx()
        out_dims = self._out_dims_t()
        ws_bytes = ctypes.c_int64(0)
        rc = self._shapes(dims, out_dims, ctypes.byref(ws_bytes), ctypes.byref(ctx))
        if rc:
            self._raise(rc, ctx)
        shapes, pos = [], 0
        for rank, _ in self._out_meta:
            shapes.append(tuple(out_dims[pos : pos + rank]))
            pos += rank
        if len(self._plans) >= PLANS_KEPT:  # a stream of ever-new shapes: start afresh
            self._plans.clear()
        plan = self._plans[key] = (dims, shapes, ws_bytes.value)
        return plan

    def run(self, inputs: Sequence[torch.Tensor], out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Outputs for ``inputs``; ``out`` optionally supplies the output buffers (one per
        ``output_buffers`` entry, contiguous, of the exact shape and dtype), as torch's ``out=``.
        Where a program's output dims include a count known mid-call, that exact shape is the one
        at the count's bound (``disc_shapes``'), and the output returned is a view of its start."""
        inputs = [t.contiguous() for t in inputs]
        if out is not None and len(out) != len(self._out_meta):
            raise ValueError(f"out: expected {len(self._out_meta)} buffers, got {len(out)}")
        ctx = self.ral.Ctx()  # per call: the error of this call only
        dims, shapes, ws_bytes = self._plan(inputs, ctx)
        outs = []
        for k, ((_, dtype), shape) in enumerate(zip(self._out_meta, shapes)):
            if out is None:
                outs.append(self._empty(shape, dtype))
                continue
            given = out[k]
            if tuple(given.shape) != shape or given.dtype != dtype or not given.is_contiguous():
                raise ValueError(
                    f"out[{k}]: expected a contiguous {dtype} tensor of shape {list(shape)}, "
                    f"got {given.dtype} {list(given.shape)}{'' if given.is_contiguous() else ' (not contiguous)'}"
                )
            outs.append(given)
        workspace = self._workspace(max(ws_bytes, 1))
        ws_ptr = (workspace.data_ptr() + 63) & ~63
        in_ptrs = self._in_ptrs_t(*[t.data_ptr() for t in inputs])
        out_ptrs = self._out_ptrs_t(*[t.data_ptr() for t in outs])
        actual = self._out_dims_t() if self._data_dependent else None
        rc = self._run(self.ral.table, ctypes.byref(ctx), dims, in_ptrs, self._const_ptrs, out_ptrs, ws_ptr, actual)
        if rc:
            self._raise(rc, ctx)
        if actual is not None:
            outs = self._at_actual_shapes(outs, actual)
        return resolve_outputs(self._out_specs, outs, inputs, self.graph.constants.__getitem__)

    def _at_actual_shapes(self, outs: list[torch.Tensor], actual: Any) -> list[torch.Tensor]:
        """Each output buffer, sized for the most a count can be, viewed at the dims the call ran at.
        The program wrote the elements contiguously at those dims, so they are the buffer's first ones.
        A view using less than half of a buffer of 64 KiB or more is copied out, so a caller keeping a
        few selected boxes does not keep memory for every candidate."""
        viewed, pos = [], 0
        for (rank, _), buf in zip(self._out_meta, outs):
            shape = tuple(actual[pos : pos + rank])
            pos += rank
            if shape == tuple(buf.shape):
                viewed.append(buf)
                continue
            numel = math.prod(shape)
            view = buf.reshape(-1)[:numel].view(shape)
            viewed.append(view.clone() if 2 * numel < buf.numel() and buf.numel() * buf.element_size() >= 1 << 16 else view)
        return viewed

    def profile(self, inputs: Sequence[torch.Tensor]) -> ExecutionProfile:
        """Kernels launched per call (memory-bound, library) and the workspace bytes at these inputs."""
        self.run(inputs)
        counts = self.native.lowered.counts()
        _, _, ws_bytes = self._plan(inputs)
        kernels = {"memory_bound": counts["memory_bound"], "library": counts["library"], "fallback": 0}
        return ExecutionProfile(kernels=kernels, workspace_bytes=ws_bytes)

    def step_profile(self) -> list[dict]:
        """Per step: what it is, total nanoseconds and calls per speculation version (profiling builds only)."""
        return step_profile(self.native)

    @staticmethod
    def _raise(rc: int, ctx) -> None:
        message = bytes(ctx.error).split(b"\0", 1)[0].decode(errors="replace")
        if rc == 2:
            raise ShapeError(message)
        raise NativeRunError(message or f"native program failed (code {rc})")
