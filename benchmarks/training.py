"""Training step time and peak memory: a BERT-style encoder whose sequence length changes every step.

    python -m benchmarks.training --out docs/benchmarks/training
    python -m benchmarks.training --model resnet --out docs/benchmarks/training-resnet

``--model resnet`` trains a small ResNet (widths 32-256, BatchNorm in training
mode) on images whose size changes every step instead. ``--profile SIZE``
instead times disc's graphs kernel by kernel over a few steps at one size
(profiling builds: ``DISC_PROFILE=1``) and prints the costliest steps;
``--parts SIZE`` times forward, backward and the optimiser step apart, eager
and disc interleaved (medians of 30 steps).

Systems: eager, disc (``torch.compile(backend="disc", dynamic=True)``, whose
min-cut partitioner recomputes cheap ops in the backward), disc-save-all (the
same with ``options={"partitioner": "default"}``: every activation saved) and
inductor (``dynamic=True``). Each step is forward + backward + Adam on
random tokens, with the model's dropout (0.1, as BERT trains;
``DISC_BENCH_DROPOUT=0`` turns it off to time the arithmetic alone: eager's
CPU dropout draws its masks with a slow serial generator). Steady state: the stream of
sequence lengths is walked in rounds, every system stepping once per length
in a balanced order (each follows every other equally often), so machine noise hits all alike; reported are the median
step time per length and the geometric mean of eager's median over each
system's. Memory, in a fresh process per system (the kernel's high-water
mark, reset first): the peak of the first walk over the stream, compilations
included, above the resident set at its start; a step's peak at the longest
sequence above the resident set just before it (the activations and scratch
a step needs: what limits the batch); and what stays resident after the
stream (gradients, optimiser state, compiler state, kept workspace). The
heap is trimmed before resident sets are read, as glibc keeps freed pages.
Writes ``results.json`` and ``results.md``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.timing import balanced_order

BATCH = 8
SYSTEMS = ("eager", "disc", "disc-save-all", "inductor-dynamic")


DROPOUT = float(os.environ.get("DISC_BENCH_DROPOUT", "0.1"))  # the model's default; the peak children inherit it


@dataclass(frozen=True)
class Stream:
    """A model and the sizes its training steps walk through."""

    title: str
    size_name: str  # the column the sizes go in
    sizes: tuple[int, ...]
    shape: Callable[[int], dict[str, int]]  # size -> the model entry's input dims


STREAMS = {
    "bert": Stream(
        "BERT-small (4 layers, hidden 256)",
        "seq",
        (16, 48, 1, 128, 33, 96, 7, 64, 200, 24),
        lambda seq: {"batch": BATCH if seq > 1 else 1, "seq": seq},
    ),
    # BatchNorm cannot train on one value per channel, so no image is small enough to
    # leave 1x1 maps at batch 1; the sizes vary height and width separately.
    "resnet": Stream(
        "ResNet-small (basic blocks, widths 32-256, BatchNorm training)",
        "image",
        (32, 48, 17, 64, 40, 96, 24, 56),
        lambda hw: {"batch": BATCH, "height": hw, "width": hw + 8},
    ),
}


def _model(name: str):
    from disc.models import MODELS

    entry = MODELS[name]
    model = entry.build("small")
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = DROPOUT
    return entry, model.train()


def _runner(system: str, model: torch.nn.Module):
    if system == "eager":
        return model
    if system == "disc":
        import disc  # noqa: F401  (registers the backend)

        return torch.compile(model, backend="disc", dynamic=True)
    if system == "disc-save-all":  # AOTAutograd's default partitioner: no rematerialisation
        import disc  # noqa: F401

        return torch.compile(model, backend="disc", dynamic=True, options={"partitioner": "default"})
    # (importing disc turned dynamo's duck sizing off process-wide; inductor runs so too here)
    return torch.compile(model, dynamic=True)


def _step(fn, opt, args) -> None:
    opt.zero_grad(set_to_none=True)
    out = fn(*args)
    hidden = out[0] if isinstance(out, tuple) else out
    hidden.float().pow(2).mean().backward()
    opt.step()


def _inputs(entry, stream: Stream, size: int):
    return entry.inputs(stream.shape(size), seed=size)


def _peak_child(system: str, name: str) -> None:
    stream = STREAMS[name]
    entry, model = _model(name)
    fn = _runner(system, model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    # ru_maxrss never goes down, and importing the compilers already peaks above a training
    # step: reset the kernel's high-water mark (VmHWM) instead, and measure above the
    # resident set at the start of the stream.
    Path("/proc/self/clear_refs").write_text("5")
    base = _status_kb("VmRSS")
    start = time.perf_counter()
    for size in stream.sizes:
        _step(fn, opt, _inputs(entry, stream, size))
    first_peak, first_pass_s = _status_kb("VmHWM") - base, time.perf_counter() - start
    # What one step needs above what stays between steps, at the longest sequence. The heap
    # is trimmed first: glibc keeps freed pages, which would hide a step's own allocations.
    longest = _inputs(entry, stream, max(stream.sizes))
    step_peaks = []
    for _ in range(3):
        resident = _trimmed_rss_kb()
        Path("/proc/self/clear_refs").write_text("5")
        _step(fn, opt, longest)
        step_peaks.append(_status_kb("VmHWM") - resident)
    result = {
        "peak_mb": first_peak / 1024,  # the first walk over the stream, compilations included
        "step_peak_mb": statistics.median(step_peaks) / 1024,
        "resident_mb": (_trimmed_rss_kb() - base) / 1024,  # optimiser state, gradients, compiler state, kept workspace
        "first_pass_s": first_pass_s,
    }
    print(json.dumps(result))


def _profile(name: str, size: int, steps: int = 5, top: int = 8) -> None:
    """Milliseconds per call of each generated kernel and library call of disc's graphs, at one size."""
    os.environ["DISC_PROFILE"] = "1"  # before the first compilation: profiling builds
    from disc.api import reports
    from disc.runtime.native import step_profile

    stream = STREAMS[name]
    entry, model = _model(name)
    fn = _runner("disc", model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    args = _inputs(entry, stream, size)
    _step(fn, opt, args)  # compiles (and warms up)
    builds = [(r.name, r.backend.native) for r in reports() if r.backend is not None and r.backend.native is not None]
    before = [step_profile(b) for _, b in builds]
    start = time.perf_counter()
    for _ in range(steps):
        _step(fn, opt, args)
    wall = (time.perf_counter() - start) / steps
    print(f"{stream.title}, {_shape_text(stream.shape(size))}: {wall * 1e3:.1f} ms a step (wall, {steps} steps)")
    for (graph, build), old in zip(builds, before):
        rows = []
        for a, b in zip(step_profile(build), old):
            calls = sum(a["calls"].values()) - sum(b["calls"].values())
            if calls:
                ran = {v: n - b["calls"][v] for v, n in a["calls"].items() if n > b["calls"][v]}
                rows.append(((a["ns"] - b["ns"]) / steps / 1e6, a["what"], ran))
        if not rows:
            continue
        library = sum(ms for ms, _, ran in rows if "library" in ran)
        total = sum(r[0] for r in rows)
        print(
            f"  {graph}: {total:.1f} ms a step in {len(rows)} steps (library calls {library:.1f} ms, generated kernels {total - library:.1f} ms)"
        )
        print("  the costliest steps, then the costliest generated kernels:")
        rows.sort(key=lambda r: -r[0])
        kernels = [r for r in rows if "library" not in r[2]]
        for ms, what, ran in rows[:top] + [r for r in kernels[:top] if r not in rows[:top]]:
            print(f"    {ms:7.2f} ms  {what}  {ran}")


def _parts(name: str, size: int, steps: int = 30) -> None:
    """Median forward, backward and optimiser-step times of eager and disc, stepping alternately."""
    stream = STREAMS[name]
    entry, model = _model(name)
    systems = ("eager", "disc")
    models = {s: copy.deepcopy(model) for s in systems}
    fns = {s: _runner(s, models[s]) for s in systems}
    opts = {s: torch.optim.Adam(models[s].parameters(), lr=1e-4) for s in systems}
    args = _inputs(entry, stream, size)
    times: dict[str, list[tuple[float, float, float]]] = {s: [] for s in systems}
    for k in range(steps + 3):  # 3 warm-up steps (compilation)
        for s in systems:
            t0 = time.perf_counter()
            opts[s].zero_grad(set_to_none=True)
            out = fns[s](*args)
            hidden = out[0] if isinstance(out, tuple) else out
            t1 = time.perf_counter()
            hidden.float().pow(2).mean().backward()
            t2 = time.perf_counter()
            opts[s].step()
            t3 = time.perf_counter()
            if k >= 3:
                times[s].append((t1 - t0, t2 - t1, t3 - t2))
    print(f"{stream.title}, {_shape_text(stream.shape(size))}: medians of {steps} interleaved steps (ms)")
    print("| system | forward | backward | optimiser | step |")
    print("|---|---:|---:|---:|---:|")
    for s in systems:
        med = [statistics.median(t[i] for t in times[s]) * 1e3 for i in range(3)]
        print(f"| {s} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} | {sum(med):.1f} |")


def _trimmed_rss_kb() -> int:
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return _status_kb("VmRSS")


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(STREAMS), default="bert")
    ap.add_argument("--out", default=None, help="default: docs/benchmarks/training (bert) or docs/benchmarks/training-<model>")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--peak-child", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--profile", type=int, metavar="SIZE", help="per-kernel time of disc's graphs at one size, instead of the benchmark")
    ap.add_argument("--parts", type=int, metavar="SIZE", help="forward / backward / optimiser times of eager and disc at one size")
    args = ap.parse_args(argv)
    if args.parts is not None:
        _parts(args.model, args.parts)
        return 0
    if args.profile is not None:
        _profile(args.model, args.profile)
        return 0
    if args.peak_child:
        _peak_child(args.peak_child, args.model)
        return 0
    stream = STREAMS[args.model]
    sizes = stream.sizes
    entry, base_model = _model(args.model)
    models = {s: copy.deepcopy(base_model) for s in SYSTEMS}
    fns = {s: _runner(s, models[s]) for s in SYSTEMS}
    opts = {s: torch.optim.Adam(models[s].parameters(), lr=1e-4) for s in SYSTEMS}
    inputs = {q: _inputs(entry, stream, q) for q in sizes}
    for s in SYSTEMS:  # warm-up: every compilation happens here
        for q in sizes:
            _step(fns[s], opts[s], inputs[q])
    times: dict[str, dict[int, list[float]]] = {s: {q: [] for q in sizes} for s in SYSTEMS}
    for r in range(args.rounds):
        for j, q in enumerate(sizes):
            for s in [SYSTEMS[k] for k in balanced_order(len(SYSTEMS), r * len(sizes) + j)]:
                t = time.perf_counter()
                _step(fns[s], opts[s], inputs[q])
                times[s][q].append(time.perf_counter() - t)
    medians = {s: {q: statistics.median(v) for q, v in times[s].items()} for s in SYSTEMS}
    speedup = {s: math.exp(statistics.mean(math.log(medians["eager"][q] / medians[s][q]) for q in sizes)) for s in SYSTEMS}
    peaks = {}
    for s in SYSTEMS:
        cmd = [sys.executable, "-m", "benchmarks.training", "--model", args.model, "--peak-child", s]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        peaks[s] = json.loads(out.stdout.strip().splitlines()[-1])
    from disc.api import reports

    compiles = sum(1 for r in reports() if r.source == "torch.compile")
    result = {
        "model": args.model,
        "batch": BATCH,
        "dropout": DROPOUT,
        "sizes": {stream.size_name: list(sizes)},
        "shapes": [stream.shape(q) for q in sizes],
        "rounds": args.rounds,
        "median_s": medians,
        "speedup_vs_eager": speedup,
        "peak": peaks,
        "disc_graphs": compiles,
    }
    dest = Path(args.out or ("docs/benchmarks/training" if args.model == "bert" else f"docs/benchmarks/training-{args.model}"))
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "results.json").write_text(json.dumps(result, indent=2))
    name = stream.size_name
    lines = [
        f"Training step (forward + backward + Adam), {stream.title}, dropout {DROPOUT}, "
        f"inputs {', '.join(_shape_text(stream.shape(q)) for q in sizes)}, {args.rounds} interleaved rounds",
        "",
        f"| {name} | " + " | ".join(f"{s} (ms)" for s in SYSTEMS) + " |",
        "|---:|" + "---:|" * len(SYSTEMS),
    ]
    for q in sizes:
        lines.append(f"| {q} | " + " | ".join(f"{medians[s][q] * 1e3:.1f}" for s in SYSTEMS) + " |")
    lines += [
        "",
        f"| system | speedup over eager (geomean) | step peak at {name} {max(sizes)} (MB) | resident after the stream (MB) "
        "| first pass: peak (MB) | first pass (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for s in SYSTEMS:
        p = peaks[s]
        lines.append(
            f"| {s} | {speedup[s]:.2f}x | {p['step_peak_mb']:.0f} | {p['resident_mb']:.0f} | {p['peak_mb']:.0f} | {p['first_pass_s']:.1f} |"
        )
    lines.append(f"\ndisc graphs compiled in the timed process: {compiles} (forward and backward graphs of both disc systems)")
    (dest / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _shape_text(shape: dict[str, int]) -> str:
    return "x".join(str(v) for v in shape.values())


if __name__ == "__main__":
    sys.exit(main())
