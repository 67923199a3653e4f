"""The GPU measurements of the CUDA backend: a BERT-base serving stream, and fused-kernel bandwidth.

Run as ``python -m benchmarks.gpu [--out DIR] [--rounds N] [--parts stream,bandwidth]`` on a
machine with a CUDA GPU. Writes ``results.md`` and ``results.json`` in ``--out``.

- ``stream``: BERT-base (12 layers, hidden 768, fp32) over 24 (batch, seq) pairs with batch
  1-16 and sequence 16-512, in serving order. Systems, side by side: eager PyTorch; disc (one
  ``disc.compile``, the Triton program with its per-shape CUDA graphs); inductor with
  ``dynamic=True``. Per shape and round, each system runs ``CALLS`` back-to-back calls between
  two synchronisations (what a serving loop sees: host overhead and GPU work, whichever is
  longer); the table gives medians over rounds, speedups over eager per shape, their geometric
  mean, compile times, compilations and disc's kernels per layer.
- ``profile``: GPU time per call by kind (cuBLAS GEMMs, disc's kernels, the rest) for disc
  and eager at three shapes, from ``torch.profiler``.
- ``bandwidth``: copy, disc and eager on the memory-bound kernels a transformer spends its
  time in (residual add + LayerNorm, masked softmax, bias + GELU) at sizes far over the L2
  cache; bandwidth is the least bytes the kernel must move over its median time (CUDA
  events around ``CALLS`` back-to-back calls), and ``vs copy`` compares it with
  ``out.copy_(x)`` measured in the same rounds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

import disc
from benchmarks.bandwidth import _cases
from disc.models import MODELS
from disc.models.bert import BertConfig, bert

CALLS = 10  # back-to-back calls per timing

# 24 (batch, seq) pairs, batch 1-16 and sequence 16-512, in no particular order (a serving stream).
STREAM = [
    (1, 16), (4, 64), (1, 128), (16, 16), (2, 384), (3, 33), (1, 256), (8, 96),
    (16, 128), (2, 200), (5, 48), (1, 512), (7, 24), (4, 160), (12, 64), (8, 256),
    (3, 300), (1, 64), (16, 512), (6, 192), (2, 77), (4, 384), (1, 17), (10, 40),
]  # fmt: skip


def _per_call_ms(fn: Callable[[], object], calls: int = CALLS) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e3


def _rel_err(got, want) -> float:
    g = (got[0] if isinstance(got, (tuple, list)) else got).double()
    w = (want[0] if isinstance(want, (tuple, list)) else want).double()
    return ((g - w).norm() / w.norm()).item()


def _layer_kernels(layers: int) -> tuple[int, int]:
    """disc's memory-bound kernels and library calls per call of a BERT with ``layers`` layers (batch 2, seq 64)."""
    entry = MODELS["bert"]
    model = bert(BertConfig(num_layers=layers, hidden_size=768, num_heads=12, intermediate_size=3072), 0).cuda()
    args = tuple(t.cuda() for t in entry.example_inputs(batch=2, seq=64))
    k = disc.compile(model, args, dynamic=entry.dynamic).profile(*args).kernels
    return k["memory_bound"], k["library"]


DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def _inductor(model: torch.nn.Module, mode: str | None) -> tuple[Callable, Callable[[], int]]:
    """``torch.compile(dynamic=True)`` with inductor (``mode="reduce-overhead"``: its CUDA graphs),
    on a private copy of the forward code, counting inductor's compilations."""
    from benchmarks.systems.inductor import _private_forward

    count = {"n": 0}

    def backend(gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        count["n"] += 1
        return compile_fx(gm, example_inputs, config_patches={"triton.cudagraphs": True} if mode == "reduce-overhead" else None)

    return torch.compile(_private_forward(model), backend=backend, dynamic=True), lambda: count["n"]


def run_stream(rounds: int, systems: list[str], dtype: str = "f32", shapes: int = len(STREAM)) -> dict:
    entry = MODELS["bert"]
    model = entry.variants["base"]().cuda().eval().to(DTYPES[dtype])

    def inputs(b: int, s: int) -> tuple:
        args = entry.example_inputs(batch=b, seq=s, seed=b * 1000 + s)
        return tuple(t.cuda().to(DTYPES[dtype]) if t.is_floating_point() else t.cuda() for t in args)

    runners: dict[str, Callable] = {"eager": model}
    compile_s: dict[str, float] = {}
    compilations: dict[str, Callable[[], int]] = {}
    example = inputs(2, 64)
    with torch.no_grad():
        if "disc" in systems:
            start = time.perf_counter()
            cm = disc.compile(model, example, dynamic=entry.dynamic)
            compile_s["disc"] = time.perf_counter() - start
            runners["disc"] = cm
            compilations["disc"] = lambda: cm.num_compilations
            triton_build = cm.report.backend.triton if cm.report.backend else None
        for name, mode in (("inductor", None), ("inductor-ro", "reduce-overhead")):
            if name not in systems:
                continue
            ind, count = _inductor(model, mode)
            start = time.perf_counter()
            ind(*example)
            torch.cuda.synchronize()
            compile_s[f"{name} (first call)"] = time.perf_counter() - start
            runners[name], compilations[name] = ind, count
        rows = []
        for b, s in STREAM[:shapes]:
            args = inputs(b, s)
            want = model(*args)
            row: dict = {"batch": b, "seq": s, "first_ms": {}, "err": {}, "ms": {}}
            for name, fn in runners.items():
                torch.cuda.synchronize()
                start = time.perf_counter()
                got = fn(*args)
                torch.cuda.synchronize()
                row["first_ms"][name] = (time.perf_counter() - start) * 1e3
                row["err"][name] = _rel_err(got, want)
                fn(*args)  # the second call at a shape is where disc records its CUDA graph
            times: dict[str, list[float]] = {n: [] for n in runners}
            for r in range(rounds):
                order = list(runners) if r % 2 == 0 else list(reversed(runners))
                for name in order:
                    times[name].append(_per_call_ms(lambda fn=runners[name]: fn(*args)))
            row["ms"] = {n: statistics.median(t) for n, t in times.items()}
            row["spread"] = {n: (max(t) - min(t)) / 2 / statistics.median(t) for n, t in times.items()}
            rows.append(row)
            print(f"{b:3d} x {s:<4d} " + "  ".join(f"{n} {row['ms'][n]:8.3f} ms" for n in runners), flush=True)
    geo = {}
    for name in runners:
        if name != "eager":
            geo[f"{name} vs eager"] = math.exp(statistics.mean(math.log(r["ms"]["eager"] / r["ms"][name]) for r in rows))
    for peer in ("inductor", "inductor-ro"):
        if "disc" in runners and peer in runners:
            geo[f"disc vs {peer}"] = math.exp(statistics.mean(math.log(r["ms"][peer] / r["ms"]["disc"]) for r in rows))
    out = {"dtype": dtype, "rows": rows, "geomean": geo, "compile_s": compile_s, "compilations": {n: f() for n, f in compilations.items()}}
    if "disc" in runners:
        one, two = _layer_kernels(1), _layer_kernels(2)
        out["disc"] = {
            "kernels_per_layer": two[0] - one[0],
            "library_calls_per_layer": two[1] - one[1],
            "kernels_outside_layers": one[0] - (two[0] - one[0]),
            "graphs_captured": cm.executor.graphs.captures if getattr(cm.executor, "graphs", None) else 0,
            "jit_launches": sum(cm.executor.runtime.jit_launches.values()),
            "precompile_s": triton_build.compile_seconds if triton_build else 0.0,
            "precompiled_forms": len({id(f) for f in triton_build.compiled.values()}) if triton_build else 0,
        }
    return out


def _kernel_kind(name: str) -> str:
    name = name.lower()
    if any(k in name for k in ("fmha", "flash", "attention")):
        return "attention"
    if any(k in name for k in ("gemm", "cutlass", "xmma", "splitk", "cublas", "nvjet")):
        return "gemm"
    if name.startswith(("loop_", "stitch_", "input_", "kernel_", "column_", "scatter_", "triton_")):
        return "generated"
    return "other"


def _gpu_time_by_kind(fn: Callable[[], object], calls: int = 5, top: int = 8) -> dict:
    """GPU milliseconds and launches per call, by kind (cuBLAS GEMMs, fused attention, generated
    Triton kernels, the rest), and the ``top`` kernels by GPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kinds: dict[str, list[float]] = {}
    kernels = []
    for e in prof.key_averages():
        if e.device_type.name != "CUDA":
            continue
        t = kinds.setdefault(_kernel_kind(e.key), [0.0, 0])
        t[0] += e.device_time_total / calls / 1e3
        t[1] += e.count // calls
        kernels.append((e.device_time_total / calls / 1e3, e.count // calls, e.key[:90]))
    kernels.sort(reverse=True)
    return {"kinds": {k: (v[0], int(v[1])) for k, v in kinds.items()}, "top": kernels[:top]}


def run_profile(shapes: list[tuple[int, int]], dtype: str = "f32", systems: tuple[str, ...] = ("disc", "eager", "inductor")) -> list[dict]:
    """Where the GPU time of one BERT-base call goes: disc (without graphs: each launch visible),
    eager and inductor (without its CUDA graphs), in ``dtype``."""
    entry = MODELS["bert"]
    model = entry.variants["base"]().cuda().eval().to(DTYPES[dtype])

    def inputs(b: int, s: int) -> tuple:
        args = entry.example_inputs(batch=b, seq=s)
        return tuple(t.cuda().to(DTYPES[dtype]) if t.is_floating_point() else t.cuda() for t in args)

    runners: dict[str, Callable] = {}
    with torch.no_grad():
        if "disc" in systems:
            ex = disc.compile(model, inputs(2, 64), dynamic=entry.dynamic).executor
            runners["disc"] = lambda *a: ex.run(list(a), runtime=ex.runtime)
        if "eager" in systems:
            runners["eager"] = model
        if "inductor" in systems:
            runners["inductor"] = _inductor(model, None)[0]
        rows = []
        for b, s in shapes:
            args = inputs(b, s)
            row: dict = {"batch": b, "seq": s}
            for name, fn in runners.items():
                fn(*args)
                fn(*args)
                row[name] = _gpu_time_by_kind(lambda fn=fn: fn(*args))
            rows.append(row)
            for name in runners:
                k = row[name]
                print(f"{b} x {s} {name}: " + ", ".join(f"{n} {v[0]:.3f} ms ({v[1]})" for n, v in sorted(k["kinds"].items())), flush=True)
                for ms, count, kname in k["top"]:
                    print(f"    {ms:8.3f} ms {count:4d}x  {kname}", flush=True)
    return rows


def _event_ms(fn: Callable[[], object], calls: int = CALLS) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def run_bandwidth(rounds: int, sizes_mb: list[int]) -> list[dict]:
    rows = []
    with torch.no_grad():
        for mb in sizes_mb:
            nbytes = mb * 2**20
            src, dst = torch.randn(nbytes // 4, device="cuda"), torch.empty(nbytes // 4, device="cuda")
            for name, model, args, dynamic, moved in _cases(nbytes):
                model = model.cuda()
                args = tuple(a.cuda() for a in args)
                cm = disc.compile(model, args, dynamic=dynamic)
                ex = cm.executor
                # The plain program (no CUDA graph: a graph replay first copies the inputs into its own buffers).
                fns = {"copy": lambda: dst.copy_(src), "disc": lambda: ex.run(list(args), runtime=ex.runtime), "eager": lambda: model(*args)}
                err = _rel_err(fns["disc"](), model(*args))
                t: dict[str, list[float]] = {k: [] for k in fns}
                for f in fns.values():
                    f()
                for _ in range(rounds):
                    for k, f in fns.items():
                        t[k].append(_event_ms(f))
                med = {k: statistics.median(v) for k, v in t.items()}
                copy_gbs = 2 * nbytes / med["copy"] / 1e6
                row = {"size_mb": mb, "kernel": name, "bytes_moved": moved, "copy_gbs": copy_gbs, "err": err}
                for k in ("disc", "eager"):
                    row[f"{k}_ms"] = med[k]
                    row[f"{k}_gbs"] = moved / med[k] / 1e6
                    row[f"{k}_vs_copy"] = row[f"{k}_gbs"] / copy_gbs
                rows.append(row)
                print(f"{mb} MB {name:16s} copy {copy_gbs:7.0f} GB/s  disc {row['disc_gbs']:7.0f} ({row['disc_vs_copy']:.0%})  eager {row['eager_gbs']:7.0f} ({row['eager_vs_copy']:.0%})", flush=True)
    return rows


def markdown(report: dict) -> str:
    lines = [f"GPU: {report['device']}; torch {report['torch']}; triton {report['triton']}; {report['date']}", ""]
    st = report.get("stream")
    if st:
        names = list(st["rows"][0]["ms"])
        lines += [f"BERT-base (disc's own), {st.get('dtype', 'f32')}, {len(st['rows'])} shapes", ""]
        lines += ["| batch x seq | " + " | ".join(f"{n} (ms)" for n in names) + " | " + " | ".join(f"{n} vs eager" for n in names if n != "eager") + " |"]
        lines += ["|---|" + "---:|" * (2 * len(names) - 1)]
        for r in st["rows"]:
            cells = [f"{r['ms'][n]:.3f}" for n in names] + [f"{r['ms']['eager'] / r['ms'][n]:.2f}x" for n in names if n != "eager"]
            lines.append(f"| {r['batch']} x {r['seq']} | " + " | ".join(cells) + " |")
        lines += ["", "Geometric means: " + ", ".join(f"{k} **{v:.2f}x**" for k, v in st["geomean"].items())]
        lines += ["Compile: " + ", ".join(f"{k} {v:.1f} s" for k, v in st["compile_s"].items()) + "; compilations over the stream: " + ", ".join(f"{k} {v}" for k, v in st["compilations"].items())]
        if "disc" in st:
            d = st["disc"]
            lines += [
                f"disc: {d['kernels_per_layer']} memory-bound kernels and {d['library_calls_per_layer']} library calls per layer "
                f"({d['kernels_outside_layers']} kernels outside the layers); {d['precompiled_forms']} kernel forms precompiled in "
                f"{d['precompile_s']:.1f} s; {d['jit_launches']} launches through Triton's JIT path; {d['graphs_captured']} CUDA graphs recorded"
            ]
        worst = max(max(r["err"].values()) for r in st["rows"])
        lines += [f"Largest relative error against eager over the stream: {worst:.1e}", ""]
    pr = report.get("profile")
    if pr:
        systems = [n for n in pr[0] if n not in ("batch", "seq")]
        kinds = ("gemm", "attention", "generated", "other")
        lines += [f"GPU time per call by kind (ms, launches), {report.get('profile_dtype', 'f32')}, disc without graphs:", ""]
        lines += ["| batch x seq | system | " + " | ".join(kinds) + " | total |", "|---|---|" + "---:|" * (len(kinds) + 1)]
        for r in pr:
            for system in systems:
                k = r[system]["kinds"]
                cells = [f"{k[n][0]:.3f} ({k[n][1]})" if n in k else "-" for n in kinds]
                lines.append(f"| {r['batch']} x {r['seq']} | {system} | " + " | ".join(cells) + f" | {sum(v[0] for v in k.values()):.3f} |")
        last = pr[-1]
        lines += ["", f"Top kernels at {last['batch']} x {last['seq']} (ms per call, launches):", ""]
        for system in systems:
            lines += [f"- {system}: " + "; ".join(f"`{n}` {ms:.3f} ({c})" for ms, c, n in last[system]["top"])]
        lines.append("")
    bw = report.get("bandwidth")
    if bw:
        lines += ["| size | kernel | copy GB/s | disc GB/s | disc vs copy | eager GB/s | eager vs copy |", "|---:|---|---:|---:|---:|---:|---:|"]
        for r in bw:
            lines.append(
                f"| {r['size_mb']} MB | {r['kernel']} | {r['copy_gbs']:.0f} | {r['disc_gbs']:.0f} | {r['disc_vs_copy']:.0%} | {r['eager_gbs']:.0f} | {r['eager_vs_copy']:.0%} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(os.environ["OUT"], "gpu") if os.environ.get("OUT") else "benchmarks/results/gpu")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--parts", default="stream,bandwidth,profile")
    p.add_argument("--systems", default="eager,disc,inductor")
    p.add_argument("--mb", default="256", help="tensor sizes of the bandwidth part, MiB, comma-separated")
    p.add_argument("--dtype", default="f32", choices=sorted(DTYPES), help="the stream's model and float inputs")
    p.add_argument("--shapes", type=int, default=len(STREAM), help="the first N shapes of the stream")
    p.add_argument("--quick", action="store_true", help="the stream only, bf16, 12 shapes, 3 rounds, eager/disc/inductor-ro: a few minutes on a fresh GPU")
    args = p.parse_args(argv)
    if args.quick:
        args.parts, args.dtype, args.shapes, args.rounds, args.systems = "stream", "bf16", 12, 3, "eager,disc,inductor-ro"
    if not torch.cuda.is_available():
        print("benchmarks.gpu needs a CUDA GPU (torch.cuda.is_available() is False)")
        return 2
    import triton

    parts = args.parts.split(",")
    report: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
    }
    if "bandwidth" in parts:
        report["bandwidth"] = run_bandwidth(args.rounds, [int(x) for x in args.mb.split(",")])
    if "stream" in parts:
        report["stream"] = run_stream(args.rounds, args.systems.split(","), args.dtype, args.shapes)
    if "profile" in parts:
        report["profile_dtype"] = args.dtype
        report["profile"] = run_profile([(1, 16), (4, 64), (16, 128)], args.dtype, ("disc", "eager", "inductor"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1))
    text = markdown(report)
    (out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
