"""The limits of the machine, and how close memory-bound ops come to them.

Four measurements on the CPU, all returned as plain JSON-ready dicts:

* ``memory_bandwidth``: STREAM copy/scale/add/triad on arrays far larger than the caches: the machine's GB/s.
* ``compute_peak``: float32 fused multiply-adds on the widest vectors, no memory traffic: the GFLOP/s no
  GEMM or convolution can exceed (``fma_peak.cc``, built with disc's toolchain).
* ``gemm_throughput``: float32 ``torch.matmul`` GFLOP/s at BERT shapes: how close eager's library comes to it.
* ``memory_bound_micro``: LayerNorm, masked softmax, bias+GELU and residual+LayerNorm, each compiled once
  with ``disc.compile`` (dynamic rows, static hidden dim) and run at several sizes next to eager.

A memory-bound op can at best read each input once and write its output once, so "ideal bytes / time"
is the bandwidth it achieves, and the machine's bandwidth is its ceiling. Eager pays a round trip to
memory per op; a fusing compiler should approach one per graph. That gap is what this module shows.

The machine is shared and noisy: every figure is a median over repetitions, with its relative spread
``(p75 - p25) / median``, and the systems compared are timed interleaved so noise hits them alike.
``contention_probe`` (run before and after the suite) flags runs where another tenant held a core: then
every multi-threaded figure is dominated by scheduler waits, and the run is best repeated.
"""

from __future__ import annotations

import copy
import ctypes
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import disc
from benchmarks.timing import interleaved

Progress = Callable[[str], None]
Shape = Mapping[str, int]

F32 = 4  # bytes per float32 element
HIDDEN, FFN, HEADS, HEAD_DIM = 768, 3072, 12, 64  # BERT-base; static dims, as in a real model

# With c = a; b = s*c; c = a + b; a = b + s*c, one round maps a to s*(2+s)*a; this s makes that the identity,
# so the arrays neither overflow nor underflow into denormals however many rounds run.
STREAM_SCALAR = math.sqrt(2.0) - 1.0


# ---------------------------------------------------------------------------------------------------------
# timing


def _stats(seconds: Sequence[float]) -> dict[str, float]:
    q1, median, q3 = statistics.quantiles(seconds, n=4, method="inclusive")
    return {"median_s": median, "best_s": min(seconds), "spread": (q3 - q1) / median, "reps": len(seconds)}


# ---------------------------------------------------------------------------------------------------------
# 1. memory bandwidth


def memory_bandwidth(quick: bool) -> dict[str, Any]:
    """STREAM through torch: best and median GB/s per kernel, with all threads and with one.

    Bytes are counted the STREAM way (copy/scale move 2 arrays, add/triad 3); the write-allocate reads
    the hardware also makes are not counted, so these figures understate the raw traffic, like STREAM's.
    """
    mib, reps, budget_s = (64, 5, 1.0) if quick else (256, 10, 4.0)
    n = mib * 2**20 // F32
    a, b, c = torch.full((n,), 1.0), torch.full((n,), 2.0), torch.zeros(n)
    kernels: dict[str, tuple[Callable[[], object], int]] = {
        "copy": (lambda: c.copy_(a), 2),
        "scale": (lambda: torch.mul(c, STREAM_SCALAR, out=b), 2),
        "add": (lambda: torch.add(a, b, out=c), 3),
        "triad": (lambda: torch.add(b, c, alpha=STREAM_SCALAR, out=a), 3),
    }
    threads = torch.get_num_threads()
    result: dict[str, Any] = {
        "array_mib": mib,
        "threads": threads,
        "counting": "STREAM: copy/scale move 2 arrays, add/triad 3; write-allocate traffic not counted",
        "kernels": _stream(kernels, n, reps, budget_s),
        "one_thread": None,
    }
    if threads > 1:
        torch.set_num_threads(1)
        try:
            result["one_thread"] = _stream(kernels, n, reps, budget_s)
        finally:
            torch.set_num_threads(threads)
    headline = max(("triad", "copy"), key=lambda k: result["kernels"][k]["best_gbs"])
    result["headline_kernel"] = headline
    result["headline_gbs"] = result["kernels"][headline]["best_gbs"]
    return result


def _stream(kernels: Mapping[str, tuple[Callable[[], object], int]], n: int, reps: int, budget_s: float) -> dict[str, Any]:
    # STREAM's order every round (copy, scale, add, triad): each kernel reads what the previous one wrote.
    times = interleaved([fn for fn, _ in kernels.values()], reps, budget_s)
    out = {}
    for (name, (_, arrays)), seconds in zip(kernels.items(), times):
        s = _stats(seconds)
        nbytes = arrays * n * F32
        out[name] = {
            "bytes": nbytes,
            "best_gbs": nbytes / s["best_s"] / 1e9,
            "median_gbs": nbytes / s["median_s"] / 1e9,
            "spread": s["spread"],
            "reps": s["reps"],
        }
    return out


# ---------------------------------------------------------------------------------------------------------
# 2. GEMM throughput


@dataclass(frozen=True)
class _Gemm:
    name: str
    batch: int  # 1: a plain 2-D matmul
    m: int
    k: int
    n: int

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.k * self.n


def _gemm_shapes(quick: bool) -> list[_Gemm]:
    tokens = (128, 512) if quick else (128, 512, 2048)
    shapes = []
    for model, hidden, ffn in (("bert-base", HIDDEN, FFN), ("bert-small", 256, 1024)):
        for t in tokens:
            shapes += [
                _Gemm(f"{model} projection, {t} tokens", 1, t, hidden, hidden),
                _Gemm(f"{model} ffn up, {t} tokens", 1, t, hidden, ffn),
                _Gemm(f"{model} ffn down, {t} tokens", 1, t, ffn, hidden),
            ]
    batch, seq = (4, 128) if quick else (8, 384)
    where = f"batch {batch} x {HEADS} heads, seq {seq}"
    shapes += [
        _Gemm(f"attention scores Q@K^T, {where}", batch * HEADS, seq, HEAD_DIM, seq),
        _Gemm(f"attention context P@V, {where}", batch * HEADS, seq, seq, HEAD_DIM),
    ]
    return shapes


def gemm_throughput(quick: bool) -> dict[str, Any]:
    """float32 ``torch.matmul`` GFLOP/s at BERT shapes (median per shape); the peak is the best median."""
    reps, budget_s = (3, 0.2) if quick else (10, 1.0)
    g = torch.Generator().manual_seed(0)
    rows = []
    for shape in _gemm_shapes(quick):
        lead = (shape.batch,) if shape.batch > 1 else ()
        a = torch.randn(*lead, shape.m, shape.k, generator=g)
        b = torch.randn(*lead, shape.k, shape.n, generator=g)
        out = torch.empty(*lead, shape.m, shape.n)
        # out= keeps the allocator out of the figure: this is the kernel's rate.
        (seconds,) = interleaved([lambda: torch.matmul(a, b, out=out)], reps, budget_s)
        s = _stats(seconds)
        rows.append(
            {
                "name": shape.name,
                "batch": shape.batch,
                "m": shape.m,
                "k": shape.k,
                "n": shape.n,
                "gflop": shape.flops / 1e9,
                "median_gflops": shape.flops / s["median_s"] / 1e9,
                "best_gflops": shape.flops / s["best_s"] / 1e9,
                "spread": s["spread"],
                "reps": s["reps"],
            }
        )
    peak = max(rows, key=lambda r: r["median_gflops"])
    return {"threads": torch.get_num_threads(), "shapes": rows, "peak_gflops": peak["median_gflops"], "peak_shape": peak["name"]}


# ---------------------------------------------------------------------------------------------------------
# 3. compute peak


def _fma_probe() -> Callable[[int, int], tuple[float, float, int]]:
    """``fma_peak.cc`` built and loaded: a function (threads, rounds) -> (seconds, flops, lanes)."""
    from disc.codegen.cpu import toolchain

    lib = ctypes.CDLL(str(toolchain.build((Path(__file__).parent / "fma_peak.cc").read_text(), "fma_peak_probe").path))
    fn = lib.disc_fma_peak
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_int32, ctypes.c_int64, ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)]

    def run(threads: int, rounds: int) -> tuple[float, float, int]:
        flops, lanes, sink = ctypes.c_double(), ctypes.c_int32(), ctypes.c_float()
        seconds = fn(threads, rounds, ctypes.byref(flops), ctypes.byref(lanes), ctypes.byref(sink))
        return seconds, flops.value, lanes.value

    return run


def compute_peak(quick: bool) -> dict[str, Any]:
    """float32 FMA GFLOP/s on torch's thread count and on one thread: the ceiling of every GEMM and convolution.

    ``peak_gflops`` is the best of the runs: a ceiling is what the cores can do when nothing else
    runs, and another tenant only ever lowers a run. Each run is ~50 ms of arithmetic. ``contended``:
    the all-thread runs fell short of the one-thread figure times the threads, and that product is the peak.
    """
    probe = _fma_probe()
    threads, reps = torch.get_num_threads(), (3 if quick else 9)
    rounds = 5_000_000  # 12 vector FMAs a round: ~0.02-0.05 s a thread on current x86 cores
    probe(threads, rounds // 10)  # wakes the OpenMP pool and the cores' vector units
    result: dict[str, Any] = {"threads": threads, "runs": reps}
    for label, n in (("all_threads", threads), ("one_thread", 1)):
        rates = []
        for _ in range(reps):
            seconds, flops, lanes = probe(n, rounds)
            rates.append(flops / seconds / 1e9)
        result[label] = {"best_gflops": max(rates), "median_gflops": statistics.median(rates)}
    result["vector_floats"] = lanes
    # Another tenant holding a core for a few seconds halves the all-thread figure and leaves the
    # one-thread one whole (seen on this shared VM: 117 and 117 GFLOP/s, then 231 and 117 a minute
    # later). Then the cores' sum is the better ceiling: with every core free they reach ~99% of it.
    cores_sum = threads * result["one_thread"]["best_gflops"]
    result["contended"] = result["all_threads"]["best_gflops"] < 0.8 * cores_sum
    result["peak_gflops"] = cores_sum if result["contended"] else result["all_threads"]["best_gflops"]
    return result


# ---------------------------------------------------------------------------------------------------------
# 4. memory-bound microbenchmarks, disc vs eager


class LayerNormOp(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class MaskedSoftmax(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.softmax(scores * self.scale + mask, dim=-1)


class BiasGelu(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x + self.bias)


class ResidualLayerNorm(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.norm(x + residual)


def _randomised(model: nn.Module) -> nn.Module:
    # LayerNorm's default weight of ones lets disc fold the multiply away; random values keep the work real.
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def _rows(hidden: int) -> Callable[[Shape, torch.Generator], tuple[torch.Tensor, ...]]:
    return lambda shape, g: (torch.randn(shape["rows"], hidden, generator=g),)


def _two_rows(hidden: int) -> Callable[[Shape, torch.Generator], tuple[torch.Tensor, ...]]:
    return lambda shape, g: (torch.randn(shape["rows"], hidden, generator=g), torch.randn(shape["rows"], hidden, generator=g))


def _scores_and_mask(shape: Shape, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    b, s = shape["b"], shape["s"]
    scores = torch.randn(b, HEADS, s, s, generator=g)
    # BERT's additive padding mask: 0 to keep a key, -10000 to drop it.
    mask = torch.where(torch.rand(b, 1, 1, s, generator=g) < 0.1, -10000.0, 0.0)
    return scores, mask


@dataclass(frozen=True)
class _Micro:
    name: str
    description: str
    build: Callable[[], nn.Module]
    make_inputs: Callable[[Shape, torch.Generator], tuple[torch.Tensor, ...]]
    dynamic: Mapping[str, Mapping[int, str]]
    example: Shape  # the shape disc.compile traces at
    sizes: tuple[Shape, ...]  # small (cache-resident) to large (far beyond L2)
    quick_sizes: tuple[Shape, ...]


def _by_rows(*rows: int) -> tuple[Shape, ...]:
    return tuple({"rows": r} for r in rows)


MICROS: tuple[_Micro, ...] = (
    _Micro(
        "layernorm",
        f"LayerNorm over the last dim (weight, bias): x[rows, {HIDDEN}]",
        lambda: _randomised(LayerNormOp(HIDDEN)),
        _rows(HIDDEN),
        {"x": {0: "rows"}},
        {"rows": 16},
        _by_rows(128, 1024, 8 * 384, 16 * 512),
        _by_rows(64, 512, 2048),
    ),
    _Micro(
        "softmax",
        f"softmax(scores * scale + mask) over the last dim: scores[b, {HEADS}, s, s], mask[b, 1, 1, s]",
        lambda: MaskedSoftmax(1.0 / math.sqrt(HEAD_DIM)).eval(),
        _scores_and_mask,
        {"scores": {0: "b", 2: "s", 3: "s"}, "mask": {0: "b", 3: "s"}},
        {"b": 2, "s": 16},
        ({"b": 1, "s": 64}, {"b": 2, "s": 128}, {"b": 4, "s": 256}, {"b": 8, "s": 384}),
        ({"b": 1, "s": 32}, {"b": 2, "s": 64}, {"b": 4, "s": 128}),
    ),
    _Micro(
        "bias_gelu",
        f"gelu(x + bias), torch's default (erf) gelu: x[rows, {FFN}], the FFN activation",
        lambda: _randomised(BiasGelu(FFN)),
        _rows(FFN),
        {"x": {0: "rows"}},
        {"rows": 16},
        _by_rows(32, 256, 1024, 8 * 384),
        _by_rows(16, 128, 512),
    ),
    _Micro(
        "residual_layernorm",
        f"LayerNorm(x + residual): x, residual[rows, {HIDDEN}]",
        lambda: _randomised(ResidualLayerNorm(HIDDEN)),
        _two_rows(HIDDEN),
        {"x": {0: "rows"}, "residual": {0: "rows"}},
        {"rows": 16},
        _by_rows(128, 1024, 8 * 384, 16 * 512),
        _by_rows(64, 512, 2048),
    ),
)


def _ideal_bytes(model: nn.Module, args: Sequence[torch.Tensor], out: torch.Tensor) -> int:
    """Every input and parameter read once, the output written once: no op can move less."""
    tensors = [*args, *model.parameters(), *model.buffers(), out]
    return sum(t.numel() * t.element_size() for t in tensors)


def _max_rel_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    # Relative to the output's largest magnitude: elementwise ratios blow up where GELU or softmax is ~0.
    got, expected = got.double(), expected.double()
    return (got - expected).abs().max().item() / max(expected.abs().max().item(), 1e-300)


def _compile(model: nn.Module, example: tuple[torch.Tensor, ...], dynamic: Mapping[str, Mapping[int, str]]) -> disc.CompiledModule:
    with warnings.catch_warnings():
        # torch.export's own deprecation notices: not ours to act on, and they break the caller's progress line.
        warnings.simplefilter("ignore", FutureWarning)
        return disc.compile(model, example, dynamic=dynamic)


def _achieved(seconds: Sequence[float], ideal_bytes: int, peak_gbs: float) -> dict[str, float]:
    s = _stats(seconds)
    gbs = ideal_bytes / s["median_s"] / 1e9
    return {
        "median_s": s["median_s"],
        "spread": s["spread"],
        "reps": s["reps"],
        "gbs": gbs,
        "fraction_of_peak": gbs / peak_gbs,
        "best_gbs": ideal_bytes / s["best_s"] / 1e9,  # what a quiet machine allows: the median is the figure to quote
    }


def _run_micro(micro: _Micro, quick: bool, peak_gbs: float, reps: int, budget_s: float) -> dict[str, Any]:
    model = micro.build()
    g = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    compiled = _compile(model, micro.make_inputs(micro.example, g), micro.dynamic)
    compile_s = time.perf_counter() - start
    # A float64 run says which side drifted when disc and eager disagree.
    model64 = copy.deepcopy(model).double()
    sizes = []
    with torch.no_grad():
        for shape in micro.quick_sizes if quick else micro.sizes:
            args = micro.make_inputs(shape, g)
            expected, got = model(*args), compiled(*args)
            exact = model64(*(a.double() for a in args))
            ideal = _ideal_bytes(model, args, expected)
            eager_s, disc_s = interleaved([lambda: model(*args), lambda: compiled(*args)], reps, budget_s, rotate=True)
            eager, ours = _achieved(eager_s, ideal, peak_gbs), _achieved(disc_s, ideal, peak_gbs)
            sizes.append(
                {
                    "shape": dict(shape),
                    "input_shapes": [list(a.shape) for a in args],
                    "ideal_bytes": ideal,
                    "max_rel_error": _max_rel_error(got, expected),
                    "error_vs_float64": {"eager": _max_rel_error(expected, exact), "disc": _max_rel_error(got, exact)},
                    "eager": eager,
                    "disc": ours,
                    "disc_speedup": eager["median_s"] / ours["median_s"],
                }
            )
    return {
        "description": micro.description,
        "dynamic": {k: dict(v) for k, v in micro.dynamic.items()},
        "compile_s": compile_s,
        "sizes": sizes,
    }


def memory_bound_micro(quick: bool, peak_gbs: float, progress: Progress | None = None) -> dict[str, Any]:
    """disc vs eager on memory-bound ops at several sizes: achieved GB/s and its fraction of ``peak_gbs``.

    Sizes that fit in cache can exceed the DRAM ``peak_gbs`` (a fraction above 1): that is the cache, not an error.
    Outputs above glibc's 32 MiB mmap threshold are fresh pages on every call, so the largest sizes include page
    faults: what eager (and a runtime without a memory plan) really pays, not the kernels alone.
    """
    reps, budget_s = (5, 0.3) if quick else (15, 2.0)
    kernels = {}
    for micro in MICROS:
        if progress:
            progress(f"memory-bound {micro.name}")
        kernels[micro.name] = _run_micro(micro, quick, peak_gbs, reps, budget_s)
    return {
        "peak_gbs": peak_gbs,
        "threads": torch.get_num_threads(),
        "error_measure": "max |disc - eager| / max |eager|",
        "kernels": kernels,
    }


# ---------------------------------------------------------------------------------------------------------
# the suite


# (vendor, family, model) -> microarchitecture, for the models a shared cloud machine is likely to be:
# /proc/cpuinfo's model name is often just "Intel(R) Xeon(R) Processor" there, which says nothing of
# the vector units every figure depends on.
_INTEL_MODELS = {85: "Skylake-SP/Cascade Lake", 106: "Ice Lake-SP", 143: "Sapphire Rapids", 207: "Emerald Rapids", 173: "Granite Rapids"}


def _amd_core(family: int, model: int) -> str | None:
    if family == 0x17:
        return "Zen 2" if model >= 0x30 else "Zen/Zen+"
    if family == 0x19:
        return "Zen 4" if 0x10 <= model <= 0x1F or 0x60 <= model <= 0x7F or 0xA0 <= model <= 0xAF else "Zen 3"
    if family == 0x1A:
        return "Zen 5"
    return None


def cpu_identity(cpuinfo: str | None = None) -> dict[str, Any]:
    """The CPU's vendor, family, model, microarchitecture (where known) and the vector ISA flags
    that decide kernel choice (AVX2, AVX-512 and its bf16/fp16/VNNI parts, AMX), from /proc/cpuinfo."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor's block is enough
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    vendor = fields.get("vendor_id", "")
    family = int(fields["cpu family"]) if fields.get("cpu family", "").isdigit() else None
    model = int(fields["model"]) if fields.get("model", "").isdigit() else None
    arch = None
    if family is not None and model is not None:
        arch = _INTEL_MODELS.get(model) if vendor == "GenuineIntel" and family == 6 else _amd_core(family, model) if vendor == "AuthenticAMD" else None
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")
    return {"vendor": vendor, "family": family, "model": model, "microarchitecture": arch, "isa_flags": [f for f in wanted if f in flags]}


def isa_summary(flags: list[str]) -> str:
    """``isa_flags`` in a few words: 'AVX-512 (VNNI, bf16, fp16), AMX' or 'AVX2' or 'no AVX2'."""
    if "avx512f" in flags:
        parts = [name for flag, name in (("avx512_vnni", "VNNI"), ("avx512_bf16", "bf16"), ("avx512_fp16", "fp16")) if flag in flags]
        text = "AVX-512" + (f" ({', '.join(parts)})" if parts else "")
    else:
        text = "AVX2" if "avx2" in flags else "no AVX2"
    return text + (", AMX" if "amx_tile" in flags else ", no AMX" if "avx512f" in flags else "")


def cpu_name() -> str:
    """The model name with what it does not say: microarchitecture, family/model and vector ISA,
    e.g. 'Intel(R) Xeon(R) Processor (Emerald Rapids, family 6 model 207; AVX-512 (VNNI, bf16, fp16), no AMX)'."""
    from disc.codegen.cpu.toolchain import cpu_model

    ident = cpu_identity()
    if ident["family"] is None:
        return cpu_model()
    where = f"family {ident['family']} model {ident['model']}"
    if ident["microarchitecture"]:
        where = f"{ident['microarchitecture']}, {where}"
    return f"{cpu_model()} ({where}; {isa_summary(ident['isa_flags'])})"


def _load_average() -> list[float] | None:
    try:
        return list(os.getloadavg())
    except OSError:  # not every platform has one
        return None


def contention_probe() -> dict[str, Any]:
    """A LayerNorm timed with one thread and with all: the run's noise, in one figure.

    When another tenant keeps a core busy, each multi-threaded op waits a scheduler time slice (milliseconds)
    for its second thread: all-thread figures then collapse while one-thread ones hold. A small spread does
    not reveal this (every call waits alike); ``slowdown`` does.
    """
    x, norm = torch.randn(1024, HIDDEN), nn.LayerNorm(HIDDEN)
    threads = torch.get_num_threads()
    with torch.no_grad():
        torch.set_num_threads(1)
        try:
            (one,) = interleaved([lambda: norm(x)], 20, 0.2)
        finally:
            torch.set_num_threads(threads)
        (all_,) = interleaved([lambda: norm(x)], 20, 0.2)
    slowdown = statistics.median(all_) / statistics.median(one)
    return {
        "one_thread_s": statistics.median(one),
        "all_threads_s": statistics.median(all_),
        "slowdown": slowdown,
        "contended": threads > 1 and slowdown > 2.0,
        "load_average": _load_average(),
    }


def progress_steps(quick: bool) -> int:
    """How many times ``run_machine_suite`` calls ``progress`` (the same in both modes)."""
    return 3 + len(MICROS)


def run_machine_suite(quick: bool, progress: Progress | None = None) -> dict[str, Any]:
    """Bandwidth, compute peak, GEMM and the memory-bound microbenchmarks; ``quick`` (CI) takes seconds, full under two minutes."""
    step = progress or (lambda _label: None)
    start, before = time.perf_counter(), contention_probe()
    step("memory bandwidth (STREAM)")
    bandwidth = memory_bandwidth(quick)
    step("compute peak (FMA)")
    compute = compute_peak(quick)
    step("GEMM throughput")
    gemm = gemm_throughput(quick)
    memory_bound = memory_bound_micro(quick, bandwidth["headline_gbs"], progress=step)
    return {
        "bandwidth": bandwidth,
        "compute": compute,
        "gemm": gemm,
        "memory_bound": memory_bound,
        "threads": torch.get_num_threads(),
        "cpu": cpu_name(),
        "quick": quick,
        "duration_s": time.perf_counter() - start,
        "contention": {"before": before, "after": contention_probe()},
    }
