"""A native CPU program, built: its library and how a host calls it, without PyTorch.

``build_native`` lowers, generates and compiles a graph; ``NativeBuild`` is the result (or a saved
program's library, opened with no compiler), and ``NativeSignature`` what a host needs to call it.
The executor that runs a build on torch tensors is ``runtime/native.py``; the standalone runtime
(``disc_runtime``) runs the same build on numpy arrays through ``interface.txt``
(``runtime/artifact.py`` reads a signature back from it).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass

from disc.codegen.cpu.kernel import MAX_VERSIONS
from disc.codegen.cpu.program import NativeSource, build_options, native_source
from disc.codegen.cpu.toolchain import BuildResult, build
from disc.codegen.lowering import LoweredProgram
from disc.ir.graph import Graph

__all__ = ["NativeBuild", "NativeSignature", "build_native", "build_options", "native_source"]


@dataclass(frozen=True)
class NativeSignature:
    """How a host calls a built program, read with no compiler: the constants in the order of its
    table, the output buffers it writes (dtype, rank), each graph output (as
    ``LoweredProgram.outputs``) and whether ``disc_run`` reports the dims outputs ran at.
    A saved program's ``interface.txt`` holds the same."""

    arguments: tuple[str, ...]
    buffers: tuple[tuple[str, int], ...]
    outputs: tuple[tuple[str, object], ...]
    data_dependent: bool

    @staticmethod
    def of(lowered: LoweredProgram, source: NativeSource) -> NativeSignature:
        buffers = tuple((o.tensor_type.dtype, len(o.shape)) for o in lowered.output_buffers)
        return NativeSignature(tuple(source.constants), buffers, tuple(lowered.outputs), source.data_dependent)


class NativeBuild:
    """A built native program: its library, how to call it, and (on demand) the lowering and C++ it
    came from. A program loaded from a folder has no lowering until something asks for it (an
    explain page, a profile): loading needs no compiler."""

    def __init__(
        self,
        build: BuildResult,
        seconds: float,
        profile: bool,
        signature: NativeSignature,
        graph: Graph,
        lowered: LoweredProgram | None = None,
        source: NativeSource | None = None,
    ) -> None:
        self.build = build
        self.seconds = seconds
        self.profile = profile  # built with the per-step counters (DISC_PROFILE)
        self.signature = signature
        self._graph = graph
        self._lowered = lowered
        self._source = source
        self._lock = threading.Lock()

    def _lower(self) -> tuple[LoweredProgram, NativeSource]:
        with self._lock:
            if self._lowered is None or self._source is None:
                self._lowered, self._source = native_source(self._graph)
            return self._lowered, self._source

    @property
    def lowered(self) -> LoweredProgram:
        return self._lower()[0]

    @property
    def source(self) -> NativeSource:
        return self._lower()[1]

    def source_text(self) -> str:
        """The C++ the library was built from (its saved copy, for a loaded program)."""
        return self._source.text if self._source is not None else self.build.source_path.read_text()


def build_native(graph: Graph, *, profile: bool | None = None) -> NativeBuild:
    """Lower, generate and compile ``graph`` (raises ``Unsupported`` when it has no native form).

    ``profile`` compiles in per-step timers and speculation-version counters
    (``step_profile``); by default it is on when the environment sets
    ``DISC_PROFILE=1``, so programs compiled deep inside ``torch.compile`` can be profiled.
    """
    if profile is None:
        profile = os.environ.get("DISC_PROFILE") == "1"
    start = time.perf_counter()
    lowered, source = native_source(graph)
    result = build(source.text, f"disc_{graph.name}", **build_options(profile))
    return NativeBuild(result, time.perf_counter() - start, profile, NativeSignature.of(lowered, source), graph, lowered, source)


def step_profile(native: NativeBuild) -> list[dict]:
    """Per step of a profiling build: what it is, total nanoseconds and calls per speculation version.

    The counters live in the loaded library and add up over every call of the
    program in this process (read twice and subtract to time a stretch).
    """
    lib = ctypes.CDLL(str(native.build.path))  # the already loaded library: the same counters
    try:
        n = lib.disc_profile_steps()
    except AttributeError:
        raise RuntimeError("this program was built without profiling; use build_native(graph, profile=True) or DISC_PROFILE=1") from None
    ns = (ctypes.c_int64 * max(n, 1)).in_dll(lib, "disc_profile_ns")
    hits = (ctypes.c_int64 * (MAX_VERSIONS * max(n, 1))).in_dll(lib, "disc_profile_hits")
    out = []
    for k, call in enumerate(native.source.calls):
        kernel = getattr(call, "kernel", None)
        if kernel is not None:
            what = f"{kernel.name} -> %{call.step.group.nodes[-1].name}"
        else:
            epilogue = getattr(call, "epilogue", None)
            what = f"{call.node.op} %{call.node.name}" + (f" {epilogue.describe()}" if epilogue is not None else "")
        versions = kernel.versions if kernel is not None else ["library"]
        out.append({"step": k, "what": what, "ns": ns[k], "calls": {v: hits[MAX_VERSIONS * k + i] for i, v in enumerate(versions)}})
    return out
