"""Measures every system on one workload, the same way, in one process.

Per workload:
1. **Cold start** in a fresh process (``benchmarks.coldstart``), one system at
   a time: ``prepare`` (export/compile) and the whole stream in order, each call
   timed. This is what a user feels: time to first result, compilations over
   the stream, end-to-end stream time with compilation included, peak memory.
2. **Warm start**: another fresh process with the scratch folder the cold start
   left, up to the first result (``System.cache_note`` says what it reuses).
3. **Checked warm-up** in this process: each system runs every shape once and
   its outputs are compared with eager's (max relative error).
4. **Steady state**, interleaved: for every shape, ``repeats`` rounds, each
   round calling every system once, in an order that changes per round so that
   every system follows every other equally often (``timing.balanced_order``):
   machine noise and cache warmth hit all systems alike. Medians per shape, and the spread of each.

Nothing a system does can stop the suite: a failure in ``prepare`` or a call
is recorded with its message and the system is dropped from that workload.
"""

from __future__ import annotations

import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.progress import Progress
from benchmarks.systems import Context, Runner, System
from benchmarks.timing import balanced_order
from benchmarks.workloads import Workload

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class SystemResult:
    """Every figure for one (workload, system); raw times kept so the JSON can be re-analysed."""

    system: str
    status: str = "ok"  # ok | skipped | failed
    reason: str = ""
    description: str = ""
    cache_note: str = ""
    compilations: int = 0
    prepare_s: float = 0.0  # export/compile before the first call
    first_result_s: float = 0.0  # prepare + first call (cold)
    cold_compile_s: float = 0.0  # first_result_s minus the steady latency at the first shape
    warm_start_s: float | None = None  # prepare + first call again, caches as the cold start left them
    cold_call_s: list[float] = field(default_factory=list)  # first call at each shape, in stream order
    stream_s: float = 0.0  # prepare + all cold calls: the end-to-end time of the stream
    peak_memory_mb: float = 0.0  # peak resident (CPU) or allocated (GPU) memory above the level before prepare
    import_mb: float = 0.0  # resident memory of the system's Python modules (System.preload), not in the peak
    max_rel_err: float = 0.0
    rel_err: list[float] = field(default_factory=list)
    steady_ms: list[list[float]] = field(default_factory=list)  # per shape: one time per round
    median_ms: list[float] = field(default_factory=list)
    rel_iqr: list[float] = field(default_factory=list)  # (p75 - p25) / median per shape: the noise
    speedup: list[float] = field(default_factory=list)  # eager median / this median, per shape
    geomean_speedup: float = 0.0
    geomean_speedup_per_round: list[float] = field(default_factory=list)
    geomean_speedup_spread: float = 0.0  # (max - min) / 2 / geomean over rounds
    profile: dict[str, Any] | None = None  # system-specific figures at the largest shape (disc: kernels, workspace)
    notes: list[str] = field(default_factory=list)


@dataclass
class WorkloadResult:
    name: str
    description: str
    x_label: str
    x: list[int]  # the plotted size of each shape in the stream
    repeats: int
    stream: list[dict[str, int]]
    systems: list[SystemResult]
    seconds: float = 0.0
    # per shape: the matmuls' and convolutions' floating-point operations, counted on eager by
    # torch.utils.flop_counter (memory-bound ops count nothing); with the machine's FMA peak it
    # bounds every system's time from below
    gflop: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- measurement helpers


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_call(runner: Runner, args: tuple, device: str) -> tuple[Any, float]:
    _sync(device)
    start = time.perf_counter()
    out = runner(*args)
    _sync(device)
    return out, time.perf_counter() - start


class MemoryMeter:
    """Peak memory above the level at ``reset``: VmHWM on Linux CPUs, the allocator's peak on GPUs."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.base = 0

    @staticmethod
    def _status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    def reset(self) -> None:
        gc.collect()
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current resident size (Linux >= 4.0)
        except OSError:
            pass
        self.base = self._status("VmRSS")

    def peak_mb(self) -> float:
        if self.device.startswith("cuda"):
            return (torch.cuda.max_memory_allocated() - self.base) / 2**20
        return max(self._status("VmHWM") - self.base, 0) / 2**20


def rel_error(out: Any, ref: Any) -> float:
    """Max over output leaves of max|out - ref| / max|ref|; inf if the structure or a shape differs."""
    outs, refs = pytree.tree_leaves(out), pytree.tree_leaves(ref)
    if len(outs) != len(refs):
        return math.inf
    worst = 0.0
    for o, r in zip(outs, refs):
        if not isinstance(r, torch.Tensor):
            continue
        o = torch.as_tensor(o)
        if tuple(o.shape) != tuple(r.shape):
            return math.inf
        if r.numel() == 0:
            continue
        o, r = o.detach().float().cpu(), r.detach().float().cpu()
        scale = max(r.abs().max().item(), 1e-6)
        worst = max(worst, (o - r).abs().max().item() / scale)
    return worst


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


# --------------------------------------------------------------------------- the run


def model_and_inputs(workload: Workload, ctx: Context, count: int | None = None) -> tuple[torch.nn.Module, list[tuple]]:
    """The workload's model on ctx's device and dtype, and the inputs of its first ``count`` shapes.

    Shape i always gets seed i, so the cold-start process and the suite's process feed identical data.
    """
    model = workload.build().to(ctx.device)
    if ctx.dtype != torch.float32:
        model = model.to(ctx.dtype)
    shapes = list(workload.stream)[:count]
    return model, [workload.inputs(shape, seed=i, device=ctx.device, dtype=ctx.dtype) for i, shape in enumerate(shapes)]


def counted_call(model: torch.nn.Module, args: tuple) -> tuple[Any, float]:
    """``model(*args)`` and the GFLOP of its matmuls and convolutions (torch.utils.flop_counter's count)."""
    counter = FlopCounterMode(display=False)
    with counter:
        out = model(*args)
    return out, counter.get_total_flops() / 1e9


def steps_for(workload: Workload, n_systems: int, repeats: int | None = None) -> int:
    """Progress steps ``run_workload`` takes: cold calls, warm start, checked calls, steady rounds."""
    return n_systems * (len(workload.stream) * (2 + (repeats or workload.repeats)) + 1)


def run_workload(
    workload: Workload,
    systems: list[System],
    ctx: Context,
    progress: Progress | None = None,
    repeats: int | None = None,
    honour_exclusions: bool = True,
) -> WorkloadResult:
    """Cold pass, warm start and interleaved steady state for every system on one workload.

    ``honour_exclusions=False`` runs the systems a workload leaves out by default (``Workload.excluded``).
    """
    started = time.perf_counter()
    repeats = repeats or workload.repeats
    tick = progress.step if progress else (lambda label, n=1: None)
    stream = list(workload.stream)
    n = len(stream)
    results = {s.name: SystemResult(system=s.name, description=s.description, cache_note=s.cache_note) for s in systems}

    with torch.no_grad():
        model, inputs = model_and_inputs(workload, ctx)
        refs, gflop = [], []
        for args in inputs:
            ref, g = counted_call(model, args)
            refs.append(ref)
            gflop.append(g)
        sizes = [sum(a.numel() for a in args) for args in inputs]
        largest = sizes.index(max(sizes))
        runners: dict[str, Runner] = {}

        for system in systems:
            res = results[system.name]
            label = f"{workload.name} · {system.name}"
            why = system.missing() or system.unsupported(workload, ctx)
            if not why and honour_exclusions:
                why = workload.excluded.get(system.name)
            if why:
                res.status, res.reason = "skipped", why
                tick(f"{label} skipped", n * (2 + repeats) + 1)
                continue
            workdir = ctx.workdir / workload.name / system.name
            workdir.mkdir(parents=True, exist_ok=True)
            progress and progress.show(f"{label} cold start (fresh process)")
            if not _cold_start(system, workload, ctx, workdir, res):
                tick(f"{label} failed", n * (2 + repeats) + 1)
                continue
            tick(f"{label} cold start done", n)
            progress and progress.show(f"{label} warm start (fresh process)")
            if system.compiles:
                res.warm_start_s = _warm_start(system, workload, ctx, workdir, res)
            tick(f"{label} warm start done")
            runner = _checked_runner(system, model, workload, inputs, refs, ctx, workdir, res, lambda s: tick(f"{label} check {s}"))
            if runner is None:
                tick(f"{label} failed", n * repeats)
                continue
            runners[system.name] = runner
            try:
                res.profile = runner.profile(inputs[largest])
                if res.profile is not None:
                    res.profile["shape"] = dict(stream[largest])
            except Exception as exc:  # a profile is a bonus, never a reason to fail
                res.notes.append(f"profile failed: {_short(exc)}")

        _steady_state(runners, inputs, stream, repeats, ctx, results, workload, tick)

    _summarise(results, n)
    del runners, refs, inputs, model
    gc.collect()
    return WorkloadResult(
        name=workload.name,
        description=workload.description,
        x_label=workload.x_label,
        x=[workload.x_of(s) for s in stream],
        repeats=repeats,
        stream=[dict(s) for s in stream],
        systems=[results[s.name] for s in systems],
        seconds=time.perf_counter() - started,
        gflop=gflop,
    )


COLD_START_TIMEOUT_S = 1200


def _fresh_process(system: System, workload: Workload, ctx: Context, workdir: Path, shapes: int) -> dict[str, Any]:
    """Run ``benchmarks.coldstart`` in a new interpreter; its JSON result, or one with ``error`` set."""
    spec = {
        "workload": workload.name,
        "system": system.name,
        "device": ctx.device,
        "dtype": str(ctx.dtype).removeprefix("torch."),
        "workdir": str(workdir),
        "shapes": shapes,
    }
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    cmd = [sys.executable, "-m", "benchmarks.coldstart", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COLD_START_TIMEOUT_S, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {COLD_START_TIMEOUT_S} s"}
    last = proc.stdout.strip().splitlines()[-1:] or [""]
    try:
        return json.loads(last[0])
    except json.JSONDecodeError:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"process exited with {proc.returncode}: {tail[:300]}"}


def _cold_start(system: System, workload: Workload, ctx: Context, workdir: Path, res: SystemResult) -> bool:
    cold = _fresh_process(system, workload, ctx, workdir, len(workload.stream))
    if cold.get("error"):
        res.status, res.reason = "failed", f"cold start: {cold['error']}"
        return False
    res.prepare_s = cold["prepare_s"]
    res.cold_call_s = cold["call_s"]
    res.first_result_s = res.prepare_s + res.cold_call_s[0]
    res.stream_s = res.prepare_s + sum(res.cold_call_s)
    res.peak_memory_mb = cold["peak_memory_mb"]
    res.import_mb = cold.get("import_mb", 0.0)
    res.compilations = cold["compilations"]
    res.notes.extend(cold["notes"])
    return True


def _warm_start(system: System, workload: Workload, ctx: Context, workdir: Path, res: SystemResult) -> float | None:
    warm = _fresh_process(system, workload, ctx, workdir, 1)
    if warm.get("error"):
        res.notes.append(f"warm start failed: {warm['error']}")
        return None
    return warm["prepare_s"] + warm["call_s"][0]


def _checked_runner(system, model, workload, inputs, refs, ctx, workdir, res, tick) -> Runner | None:
    """The runner for the steady state, called once per shape (a warm-up) with outputs checked against eager."""
    try:
        system.setup(workdir)
        runner = system.prepare(model, workload, inputs[0], ctx, workdir)
        for i, args in enumerate(inputs):
            res.rel_err.append(rel_error(runner(*args), refs[i]))
            tick(workload.shape_label(workload.stream[i]))
    except Exception as exc:
        res.status, res.reason = "failed", f"in-suite run: {_short(exc)}"
        return None
    res.max_rel_err = max(res.rel_err)
    return runner


def _steady_state(runners, inputs, stream, repeats, ctx, results, workload, tick) -> None:
    names = list(runners)
    warmed_up = {name: runners[name].compilations for name in names}  # every shape was seen once already
    for name in names:
        results[name].steady_ms = [[] for _ in stream]
    for i, args in enumerate(inputs):
        for rnd in range(repeats):
            for name in [names[k] for k in balanced_order(len(names), i * repeats + rnd)]:
                if results[name].status != "ok":
                    continue
                try:
                    _, seconds = timed_call(runners[name], args, ctx.device)
                except Exception as exc:
                    results[name].status = "failed"
                    results[name].reason = f"steady state, shape {workload.shape_label(stream[i])}: {_short(exc)}"
                    continue
                results[name].steady_ms[i].append(seconds * 1e3)
            tick(f"{workload.name} · steady {workload.shape_label(stream[i])} round {rnd + 1}/{repeats}", len(names))
    # A compile count that grew in steady state means a recompilation on a shape already seen: say so.
    for name, runner in runners.items():
        grew = runner.compilations - warmed_up[name]
        if results[name].status == "ok" and grew:
            results[name].notes.append(f"compiled {grew} more time(s) in steady state, on shapes already seen")


def _summarise(results: dict[str, SystemResult], n: int) -> None:
    eager = results.get("eager")
    base = eager.steady_ms if eager and eager.status == "ok" else None
    for res in results.values():
        if res.status != "ok" or len(res.steady_ms) != n or any(not t for t in res.steady_ms):
            continue
        res.median_ms = [statistics.median(t) for t in res.steady_ms]
        res.rel_iqr = [(_quantile(t, 0.75) - _quantile(t, 0.25)) / statistics.median(t) for t in res.steady_ms]
        res.cold_compile_s = max(res.first_result_s - res.median_ms[0] / 1e3, 0.0)
        if base is None:
            continue
        base_median = [statistics.median(t) for t in base]
        res.speedup = [b / m for b, m in zip(base_median, res.median_ms)]
        res.geomean_speedup = _geomean(res.speedup)
        rounds = min(len(t) for t in res.steady_ms + base)
        res.geomean_speedup_per_round = [_geomean([base[i][r] / res.steady_ms[i][r] for i in range(n)]) for r in range(rounds)]
        if res.geomean_speedup_per_round and res.geomean_speedup:
            spread = max(res.geomean_speedup_per_round) - min(res.geomean_speedup_per_round)
            res.geomean_speedup_spread = spread / 2 / res.geomean_speedup
