"""CUDA graphs of a Triton program, one per input shape, for latency-bound small shapes.

A BERT layer is a dozen launches; at a small batch the GPU finishes each kernel
before the host has issued the next, so the call costs its launches, not its
work. A graph of the whole program (kernels and library calls) is replayed with
one launch. It is captured at the *second* call with a shape, so a shape seen
once costs nothing extra, and the first call has warmed cuBLAS and the
allocator for it.

The cache is bounded twice: at most ``DISC_CUDA_GRAPHS`` shapes (default 256;
0 turns capture off) and at most ``DISC_CUDA_GRAPH_MB`` MiB of device memory
held by graphs (default 2048: each graph keeps its own inputs, outputs and
workspace), the least recently used shapes going first. The program stays
stateless for its callers: a replay copies the call's inputs into the graph's
own buffers and returns fresh copies of its outputs, under a per-graph lock,
so threads may call one program at once. The shapes it remembers without a
graph (seen once; not capturable) are bounded too, so a stream of ever-new
shapes does not grow it.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch


def numerics_flags() -> tuple:
    """The settings that choose how PyTorch's GPU GEMMs and convolutions round float32 (TF32 or
    not) and reduce 16-bit inputs: the library calls of a program follow them at each call.
    The legacy ``allow_tf32`` flags are read through the new API's ``fp32_precision``, which
    reflects them (and never refuses a read); ``get_float32_matmul_precision`` tells "medium" from
    "high" but refuses a read after both APIs were used, which is keyed as unreadable."""
    cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    reads = (
        lambda: cuda.fp32_precision,
        lambda: cudnn.conv.fp32_precision,
        torch.get_float32_matmul_precision,
        lambda: cuda.allow_fp16_reduced_precision_reduction,
        lambda: cuda.allow_bf16_reduced_precision_reduction,
    )
    return tuple(_read(r) for r in reads)


def _read(setting: Callable[[], object]) -> object:
    try:
        return setting()
    except (RuntimeError, AttributeError):  # set through both APIs, or not in this PyTorch
        return "unreadable"


def graph_limits() -> tuple[int, int]:
    """(shapes, bytes) from the environment. The memory budget is the real bound: a decoder's
    generation is a new shape per token, and a shape limit under the tokens of one generation
    evicts each step's graph before the next generation replays it, recording it again each time."""
    shapes = int(os.environ.get("DISC_CUDA_GRAPHS", "256"))
    megabytes = float(os.environ.get("DISC_CUDA_GRAPH_MB", "2048"))
    return max(0, shapes), int(megabytes * 2**20)


# Shapes remembered without a graph: seen once so far, or found not capturable. Forgetting one
# costs at most a later capture attempt, never a wrong result.
REMEMBERED_SHAPES = 4096


class _RecentKeys:
    """A set of at most ``limit`` keys; adding beyond it forgets the least recently added."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._keys: OrderedDict[tuple, None] = OrderedDict()

    def __contains__(self, key: tuple) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: tuple) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self.limit:
            self._keys.popitem(last=False)

    def discard(self, key: tuple) -> None:
        self._keys.pop(key, None)


@dataclass
class _Entry:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]  # the graph's own input buffers
    outs: list[torch.Tensor]  # the graph's own outputs
    nbytes: int  # device memory the graph holds
    lock: threading.Lock = field(default_factory=threading.Lock)


class GraphCache:
    """Replays a captured graph per input shape; ``run`` returns None where the plain call should run."""

    def __init__(self, capture: Callable[[list[torch.Tensor]], list[torch.Tensor]], max_shapes: int, max_bytes: int) -> None:
        self._capture = capture  # runs the program once on the given buffers, while a graph records it
        self.max_shapes = max_shapes
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._seen_once = _RecentKeys(REMEMBERED_SHAPES)  # captured at their second call
        self._uncaptured = _RecentKeys(REMEMBERED_SHAPES)  # graph failed, or alone exceeds the budget
        self._lock = threading.Lock()
        self.captures = 0

    @staticmethod
    def key(inputs: Sequence[torch.Tensor]) -> tuple:
        # A graph holds the GEMM and convolution kernels cuBLAS and cuDNN chose when it was
        # captured, under the numerics flags of that moment; the flags are part of the key, so a
        # call made after the user changed them captures again (eager follows them per call).
        return (numerics_flags(), *((tuple(t.shape), t.dtype, t.device) for t in inputs))

    def run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
        if self.max_shapes == 0 or torch.cuda.is_current_stream_capturing():
            return None  # off, or the caller is capturing its own graph around this call
        key = self.key(inputs)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            else:
                if key in self._uncaptured:
                    return None
                if key not in self._seen_once:
                    self._seen_once.add(key)
                    return None
                self._seen_once.discard(key)
                entry = self._record(key, inputs)
                if entry is None:
                    return None
        with entry.lock:
            for mine, given in zip(entry.inputs, inputs):
                mine.copy_(given)
            entry.graph.replay()
            return [o.clone() for o in entry.outs]

    def _record(self, key: tuple, inputs: Sequence[torch.Tensor]) -> _Entry | None:
        before = torch.cuda.memory_allocated()
        mine = [t.contiguous().clone() for t in inputs]
        graph = torch.cuda.CUDAGraph()
        caller_stream = torch.cuda.current_stream()
        try:
            # thread_local: other threads may keep calling (and allocating) while this one records.
            # A stream of its own: torch.cuda.graph's default capture stream is one for the whole
            # process, which another thread's capture (of another program) would share.
            with torch.cuda.graph(graph, stream=torch.cuda.Stream(), capture_error_mode="thread_local"):
                outs = self._capture(mine)
        except RuntimeError:
            # Something in the program cannot be recorded (a library routine that syncs, say):
            # this shape keeps running as plain calls, which raise any real error themselves.
            # torch.cuda.graph does not restore the caller's stream when its capture fails, and
            # this thread's later calls would be launched onto the broken capture's stream.
            torch.cuda.set_stream(caller_stream)
            self._uncaptured.add(key)
            return None
        nbytes = torch.cuda.memory_allocated() - before
        self.captures += 1
        if nbytes > self.max_bytes:
            self._uncaptured.add(key)  # this shape keeps running uncaptured
            return None
        entry = self._entries[key] = _Entry(graph, mine, outs, nbytes)
        while len(self._entries) > self.max_shapes or self.nbytes() > self.max_bytes:
            self._entries.popitem(last=False)
        return entry

    def shapes(self) -> int:
        return len(self._entries)

    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())
