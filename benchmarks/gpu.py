"""The GPU measurements of the CUDA backend: BERT-base serving streams, a Llama-style decoder's
prefill and decode, and fused-kernel bandwidth.

Run as ``python -m benchmarks.gpu [--out DIR] [--rounds N] [--parts stream,decode,bandwidth]`` on
a machine with a CUDA GPU. Writes ``results.md`` and ``results.json`` in ``--out`` after each part.
``--device cpu`` runs the same parts on the CPU (the decode is a fair CPU measurement too; the
``profile`` part needs CUDA); with ``--tiny``, at tiny sizes: a dry run of this code, which the
test suite does.

- ``stream``: BERT-base over (batch, seq) pairs in serving order: ``--model bert`` is disc's own
  (fp32 history, 24 shapes with batch 1-16 and sequence 16-512), ``--model hf-bert`` Hugging
  Face's ``BertModel`` with a padding mask over 26 shapes with batch 1-16 and sequence 1-512
  (size-1 shapes first). Systems, side by side: eager PyTorch; disc (one ``disc.compile``, the
  Triton program with its per-shape CUDA graphs); the plug-in (``torch.compile(backend="disc",
  dynamic=True)``); inductor with ``dynamic=True``, and with ``mode="reduce-overhead"`` (its CUDA
  graphs). Per shape and round, each system runs ``CALLS`` back-to-back calls between
  two synchronisations (what a serving loop sees: host overhead and GPU work, whichever is
  longer); the table gives medians over rounds, speedups over eager per shape, their geometric
  mean, compile times, compilations and disc's kernels per layer.
- ``decode``: Hugging Face's Llama (4 layers at a 1B model's width, grouped-query attention,
  rotary positions; ``benchmarks/hf_workloads.py``) as one step on tensors, the KV cache an
  input and an output. Prefill at several prompt lengths (batch 1, empty cache); then greedy-style
  generations (fixed next tokens, so every system computes the same) of ``steps`` tokens from a
  prompt at batch 1 and 8, the cache growing each step. Per generation: the first round (every
  shape new: compilation caches, CUDA graphs recorded), then the median ms per token once each
  step's shape has been seen twice.
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
from typing import Any

import torch

import disc
from benchmarks.bandwidth import _cases
from disc.models import MODELS
from disc.models.bert import BertConfig, bert

CALLS = 10  # back-to-back calls per timing
DEVICE = "cuda"  # --device: "cpu" runs the same parts on the CPU

# 24 (batch, seq) pairs, batch 1-16 and sequence 16-512, in no particular order (a serving stream).
STREAM = [
    (1, 16), (4, 64), (1, 128), (16, 16), (2, 384), (3, 33), (1, 256), (8, 96),
    (16, 128), (2, 200), (5, 48), (1, 512), (7, 24), (4, 160), (12, 64), (8, 256),
    (3, 300), (1, 64), (16, 512), (6, 192), (2, 77), (4, 384), (1, 17), (10, 40),
]  # fmt: skip
# Hugging Face BERT's stream: one-token and one-row requests first, then the same pairs.
HF_STREAM = [(1, 1), (16, 1), *STREAM]
TINY_STREAM = [(1, 1), (3, 5), (2, 17)]

# Decode: prompt lengths of the prefill (batch 1), and (batch, prompt, steps) generations.
PREFILL = [1, 16, 128, 512, 1024]
GENERATIONS = [(1, 128, 64), (8, 128, 64)]
# Quick: no 1-token prompt (decode covers 1-token steps), since each size-1 specialisation costs
# inductor a recompilation of half a minute or more on the lent machine's clock.
QUICK_PREFILL, QUICK_GENERATIONS = [128, 512], [(1, 128, 32), (8, 128, 32)]
TINY_PREFILL, TINY_GENERATIONS = [1, 6], [(1, 1, 3), (2, 4, 3)]


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _per_call_ms(fn: Callable[[], object], calls: int = CALLS) -> float:
    _sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync()
    return (time.perf_counter() - start) / calls * 1e3


def _rel_err(got, want) -> float:
    g = (got[0] if isinstance(got, (tuple, list)) else got).double()
    w = (want[0] if isinstance(want, (tuple, list)) else want).double()
    return ((g - w).norm() / w.norm()).item()


DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


class _Workload:
    """A stream's model: how to build it at a layer count and make its inputs at (batch, seq)."""

    def __init__(self, name: str, dtype: str, tiny: bool) -> None:
        self.name, self.dtype, self.tiny = name, DTYPES[dtype], tiny
        if name == "bert":
            self.entry = MODELS["bert"]
            self.dynamic = self.entry.dynamic
        else:
            from benchmarks.hf_workloads import bert_inputs

            self.hf_inputs = bert_inputs
            self.dynamic = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}

    def model(self, layers: int | None = None) -> torch.nn.Module:
        if self.name == "bert":
            if layers is None:
                model = self.entry.variants["tiny" if self.tiny else "base"]()
            else:
                size = dict(hidden_size=64, num_heads=4, intermediate_size=128) if self.tiny else dict(hidden_size=768, num_heads=12, intermediate_size=3072)
                model = bert(BertConfig(num_layers=layers, **size), 0)
        else:
            from benchmarks.hf_workloads import hf_bert

            model = hf_bert(self.tiny)
            if layers is not None:
                model.model.encoder.layer = model.model.encoder.layer[:layers]
        return model.to(DEVICE).eval().to(self.dtype)

    def inputs(self, b: int, s: int, seed: int | None = None) -> tuple:
        seed = b * 1000 + s if seed is None else seed
        if self.name == "bert":
            args = self.entry.example_inputs(batch=b, seq=s, seed=seed)
        else:
            args = self.hf_inputs(b, s, seed, vocab=100 if self.tiny else 30522)
        return tuple(t.to(DEVICE).to(self.dtype) if t.is_floating_point() else t.to(DEVICE) for t in args)


def _layer_kernels(workload: _Workload) -> tuple[int, int, int]:
    """disc's memory-bound kernels and library calls per layer, and kernels outside the layers
    (the difference between one and two layers, at batch 2, seq 64)."""
    counts = []
    for layers in (1, 2):
        args = workload.inputs(2, 64)
        k = disc.compile(workload.model(layers), args, dynamic=workload.dynamic).profile(*args).kernels
        counts.append((k["memory_bound"], k["library"]))
    (m1, l1), (m2, l2) = counts
    return m2 - m1, l2 - l1, m1 - (m2 - m1)


def _counting(backend: Callable) -> tuple[Callable, Callable[[], int]]:
    count = {"n": 0}

    def counted(gm, example_inputs):
        count["n"] += 1
        return backend(gm, example_inputs)

    return counted, lambda: count["n"]


def _inductor(model: torch.nn.Module, mode: str | None) -> tuple[Callable, Callable[[], int]]:
    """``torch.compile(dynamic=True)`` with inductor (``mode="reduce-overhead"``: its CUDA graphs),
    on a private copy of the forward code, counting inductor's compilations."""
    from benchmarks.systems.inductor import _private_forward

    def backend(gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs, config_patches={"triton.cudagraphs": True} if mode == "reduce-overhead" else None)

    counted, count = _counting(backend)
    return torch.compile(_private_forward(model), backend=counted, dynamic=True), count


def _plugin(model: torch.nn.Module) -> tuple[Callable, Callable[[], int]]:
    """``torch.compile(backend="disc", dynamic=True)`` on a private copy of the forward code, counting its graphs."""
    from benchmarks.systems.inductor import _private_forward
    from disc.frontends.torch.dynamo import disc_backend

    counted, count = _counting(disc_backend)
    return torch.compile(_private_forward(model), backend=counted, dynamic=True), count


def _compiled_systems(model: torch.nn.Module, example: tuple, dynamic: dict, systems: list[str]) -> tuple[dict, dict, dict, Any]:
    """Every asked-for system compiled (or, for the torch.compile ones, called once) at ``example``:
    runners, compile seconds, compilation counters, and disc's compiled module (or None)."""
    runners: dict[str, Callable] = {"eager": model}
    compile_s: dict[str, float] = {}
    compilations: dict[str, Callable[[], int]] = {}
    cm = None
    if "disc" in systems:
        start = time.perf_counter()
        cm = disc.compile(model, example, dynamic=dynamic)
        compile_s["disc"] = time.perf_counter() - start
        runners["disc"] = cm
        compilations["disc"] = lambda: cm.num_compilations
    made = {"disc-plugin": lambda: _plugin(model), "inductor": lambda: _inductor(model, None), "inductor-ro": lambda: _inductor(model, "reduce-overhead")}
    for name, make in made.items():
        if name not in systems:
            continue
        fn, count = make()
        start = time.perf_counter()
        fn(*example)
        _sync()
        compile_s[f"{name} (first call)"] = time.perf_counter() - start
        runners[name], compilations[name] = fn, count
    return runners, compile_s, compilations, cm


def _geomeans(rows: list[dict], runners: dict, key: str = "ms") -> dict[str, float]:
    geo = {}
    for name in runners:
        if name != "eager":
            geo[f"{name} vs eager"] = math.exp(statistics.mean(math.log(r[key]["eager"] / r[key][name]) for r in rows))
    for peer in ("inductor", "inductor-ro"):
        for ours in ("disc", "disc-plugin"):
            if ours in runners and peer in runners:
                geo[f"{ours} vs {peer}"] = math.exp(statistics.mean(math.log(r[key][peer] / r[key][ours]) for r in rows))
    return geo


def _side_by_side(runners: dict[str, Callable], run: Callable[[Callable], Any], want: Any, rounds: int, calls: int = CALLS, per: int = 1) -> dict:
    """``run(system)`` for every system: its first call's ms, its error against ``want``, and its
    median ms over ``rounds`` rounds of ``calls`` calls (systems in alternating order), each time
    divided by ``per`` (tokens in a generation)."""
    row: dict = {"first_ms": {}, "err": {}}
    for name, fn in runners.items():
        _sync()
        start = time.perf_counter()
        got = run(fn)
        _sync()
        row["first_ms"][name] = (time.perf_counter() - start) * 1e3 / per
        row["err"][name] = _rel_err(got, want)
        run(fn)  # a shape's second call is where disc (and inductor-ro) records its CUDA graph
    times: dict[str, list[float]] = {n: [] for n in runners}
    for r in range(rounds):
        for name in list(runners) if r % 2 == 0 else list(reversed(runners)):
            times[name].append(_per_call_ms(lambda fn=runners[name]: run(fn), calls) / per)
    row["ms"] = {n: statistics.median(t) for n, t in times.items()}
    row["spread"] = {n: (max(t) - min(t)) / 2 / statistics.median(t) for n, t in times.items()}
    return row


def run_stream(rounds: int, systems: list[str], dtype: str = "f32", shapes: int | None = None, model_name: str = "bert", tiny: bool = False) -> dict:
    workload = _Workload(model_name, dtype, tiny)
    stream = TINY_STREAM if tiny else (STREAM if model_name == "bert" else HF_STREAM)
    model = workload.model()
    with torch.no_grad():
        runners, compile_s, compilations, cm = _compiled_systems(model, workload.inputs(2, 64), workload.dynamic, systems)
        rows = []
        for b, s in stream[:shapes]:
            args = workload.inputs(b, s)
            row = {"batch": b, "seq": s, **_side_by_side(runners, lambda fn, args=args: fn(*args), model(*args), rounds)}
            rows.append(row)
            print(f"{b:3d} x {s:<4d} " + "  ".join(f"{n} {row['ms'][n]:8.3f} ms" for n in runners), flush=True)
    out = {"model": model_name, "dtype": dtype, "rows": rows, "geomean": _geomeans(rows, runners), "compile_s": compile_s, "compilations": {n: f() for n, f in compilations.items()}}
    if cm is not None:
        per_layer, library, outside = _layer_kernels(workload)
        triton_build = cm.report.backend.triton if cm.report.backend else None
        out["disc"] = {
            "kernels_per_layer": per_layer,
            "library_calls_per_layer": library,
            "kernels_outside_layers": outside,
            "graphs_captured": cm.executor.graphs.captures if getattr(cm.executor, "graphs", None) else 0,
            "jit_launches": sum(cm.executor.runtime.jit_launches.values()) if hasattr(cm.executor, "runtime") else 0,
            "precompile_s": triton_build.compile_seconds if triton_build else 0.0,
            "precompiled_forms": len({id(f) for f in triton_build.compiled.values()}) if triton_build else 0,
        }
    return out


def run_decode(rounds: int, systems: list[str], dtype: str = "bf16", quick: bool = False, tiny: bool = False) -> dict:
    """The Llama-style decoder's prefill and decode, every system on the same ``DecodeStep``."""
    from benchmarks.hf_workloads import DECODE_DYNAMIC, DecodeStep, empty_past, llama

    torch_dtype = DTYPES[dtype]
    step = DecodeStep(llama(tiny)).to(DEVICE).to(torch_dtype)
    config = step.model.config
    prefill = TINY_PREFILL if tiny else QUICK_PREFILL if quick else PREFILL
    generations = TINY_GENERATIONS if tiny else QUICK_GENERATIONS if quick else GENERATIONS
    g = torch.Generator().manual_seed(0)

    def ids(batch: int, length: int) -> torch.Tensor:
        return torch.randint(0, config.vocab_size, (batch, length), generator=g).to(DEVICE)

    def ones(batch: int, length: int) -> torch.Tensor:
        return torch.ones(batch, length, dtype=torch.int64, device=DEVICE)

    def past(batch: int) -> list[torch.Tensor]:
        return empty_past(step.model, batch, torch_dtype, DEVICE)

    with torch.no_grad():
        # The example grows a short cache by a few tokens: no dim is 0 or 1, so nothing is specialised.
        _, *cached = step(ids(2, 5), ones(2, 5), *past(2))
        example = (ids(2, 3), ones(2, 8), *cached)
        runners, compile_s, compilations, _ = _compiled_systems(step, example, DECODE_DYNAMIC, systems)
        prefill_rows = []
        for length in prefill:
            args = (ids(1, length), ones(1, length), *past(1))
            row = {"batch": 1, "prompt": length, **_side_by_side(runners, lambda fn, args=args: fn(*args), step(*args), rounds)}
            prefill_rows.append(row)
            print(f"prefill 1 x {length:<5d} " + "  ".join(f"{n} {row['ms'][n]:8.3f} ms" for n in runners), flush=True)
        decode_rows = []
        for batch, prompt, steps in generations:
            _, *start_past = step(ids(batch, prompt), ones(batch, prompt), *past(batch))
            tokens = [ids(batch, 1) for _ in range(steps)]

            def generate(fn: Callable, tokens: list[torch.Tensor] = tokens, start_past: list = start_past, batch: int = batch, prompt: int = prompt) -> torch.Tensor:
                cache = start_past
                for i, token in enumerate(tokens):
                    logits, *cache = fn(token, ones(batch, prompt + i + 1), *cache)
                return logits

            # ms per token: a whole generation per timing, its first round (every step's shape new) beside
            row = {"batch": batch, "prompt": prompt, "steps": steps, **_side_by_side(runners, generate, generate(step), rounds, calls=1, per=steps)}
            decode_rows.append(row)
            print(f"decode {batch} x {prompt}+{steps} " + "  ".join(f"{n} {row['ms'][n]:8.3f} ms/token" for n in runners), flush=True)
    return {
        "dtype": dtype,
        "config": {k: getattr(config, k) for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size")},
        "prefill": prefill_rows,
        "decode": decode_rows,
        "geomean": {"prefill": _geomeans(prefill_rows, runners), "decode": _geomeans(decode_rows, runners)},
        "compile_s": compile_s,
        "compilations": {n: f() for n, f in compilations.items()},
    }


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


def run_bandwidth(rounds: int, sizes_mb: list[float], dtype: str = "f32") -> list[dict]:
    """Each memory-bound case with tensors of ``mb`` MiB in ``dtype``."""
    torch_dtype = DTYPES[dtype]
    scale = torch_dtype.itemsize / 4  # _cases sizes its tensors and bytes moved in float32
    timer = _event_ms if DEVICE == "cuda" else _per_call_ms
    rows = []
    with torch.no_grad():
        for mb in sizes_mb:
            nbytes = int(mb * 2**20)
            src = torch.randn(nbytes // torch_dtype.itemsize, device=DEVICE, dtype=torch_dtype)
            dst = torch.empty_like(src)
            for name, model, args, dynamic, moved in _cases(int(nbytes / scale)):
                model = model.to(DEVICE).to(torch_dtype)
                args = tuple(a.to(DEVICE).to(torch_dtype) for a in args)
                cm = disc.compile(model, args, dynamic=dynamic)
                ex = cm.executor
                # The plain program (no CUDA graph: a graph replay first copies the inputs into its own buffers).
                run_disc = (lambda: ex.run(list(args), runtime=ex.runtime)) if hasattr(ex, "runtime") else (lambda: cm(*args))
                fns = {"copy": lambda: dst.copy_(src), "disc": run_disc, "eager": lambda: model(*args)}
                err = _rel_err(fns["disc"](), model(*args))
                t: dict[str, list[float]] = {k: [] for k in fns}
                for f in fns.values():
                    f()
                for _ in range(rounds):
                    for k, f in fns.items():
                        t[k].append(timer(f))
                med = {k: statistics.median(v) for k, v in t.items()}
                copy_gbs = 2 * nbytes / med["copy"] / 1e6
                row = {"size_mb": mb, "dtype": dtype, "kernel": name, "bytes_moved": int(moved * scale), "copy_gbs": copy_gbs, "err": err}
                for k in ("disc", "eager"):
                    row[f"{k}_ms"] = med[k]
                    row[f"{k}_gbs"] = row["bytes_moved"] / med[k] / 1e6
                    row[f"{k}_vs_copy"] = row[f"{k}_gbs"] / copy_gbs
                rows.append(row)
                print(f"{mb} MB {dtype} {name:16s} copy {copy_gbs:7.0f} GB/s  disc {row['disc_gbs']:7.0f} ({row['disc_vs_copy']:.0%})  eager {row['eager_gbs']:7.0f} ({row['eager_vs_copy']:.0%})", flush=True)
    return rows


def markdown(report: dict) -> str:
    lines = [f"Device: {report['device']}; torch {report['torch']}; triton {report['triton']}; {report['date']}", ""]
    st = report.get("stream")
    if st:
        names = list(st["rows"][0]["ms"])
        title = "Hugging Face BertModel, BERT-base config" if st.get("model") == "hf-bert" else "BERT-base (disc's own)"
        lines += [f"{title}, {st.get('dtype', 'f32')}, {len(st['rows'])} shapes", ""]
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
    dec = report.get("decode")
    if dec:
        lines += _decode_markdown(dec)
    bw = report.get("bandwidth")
    if bw:
        lines += ["| size | dtype | kernel | copy GB/s | disc GB/s | disc vs copy | eager GB/s | eager vs copy |", "|---:|---|---|---:|---:|---:|---:|---:|"]
        for r in bw:
            lines.append(
                f"| {r['size_mb']} MB | {r.get('dtype', 'f32')} | {r['kernel']} | {r['copy_gbs']:.0f} | {r['disc_gbs']:.0f} | {r['disc_vs_copy']:.0%} | {r['eager_gbs']:.0f} | {r['eager_vs_copy']:.0%} |"
            )
    return "\n".join(lines) + "\n"


def _decode_markdown(dec: dict) -> list[str]:
    c = dec["config"]
    names = list(dec["prefill"][0]["ms"]) if dec["prefill"] else list(dec["decode"][0]["ms"])
    lines = [
        f"Llama-style decoder (Hugging Face LlamaForCausalLM: {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, MLP "
        f"{c['intermediate_size']}, {c['num_attention_heads']} query / {c['num_key_value_heads']} key-value heads, vocabulary "
        f"{c['vocab_size']}), {dec['dtype']}",
        "",
        "| prefill, batch x prompt | " + " | ".join(f"{n} (ms)" for n in names) + " | " + " | ".join(f"{n} vs eager" for n in names if n != "eager") + " |",
        "|---|" + "---:|" * (2 * len(names) - 1),
    ]
    for r in dec["prefill"]:
        cells = [f"{r['ms'][n]:.3f}" for n in names] + [f"{r['ms']['eager'] / r['ms'][n]:.2f}x" for n in names if n != "eager"]
        lines.append(f"| {r['batch']} x {r['prompt']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| decode, batch x prompt + steps | " + " | ".join(f"{n} (ms/token)" for n in names) + " | " + " | ".join(f"{n} first round (ms/token)" for n in names) + " |",
        "|---|" + "---:|" * (2 * len(names)),
    ]
    for r in dec["decode"]:
        cells = [f"{r['ms'][n]:.3f}" for n in names] + [f"{r['first_ms'][n]:.1f}" for n in names]
        lines.append(f"| {r['batch']} x {r['prompt']} + {r['steps']} | " + " | ".join(cells) + " |")
    for part in ("prefill", "decode"):
        if dec["geomean"][part]:
            lines += ["", f"Geometric means, {part}: " + ", ".join(f"{k} **{v:.2f}x**" for k, v in dec["geomean"][part].items())]
    lines += ["Compile: " + ", ".join(f"{k} {v:.1f} s" for k, v in dec["compile_s"].items()) + "; compilations over prefill and decode: " + ", ".join(f"{k} {v}" for k, v in dec["compilations"].items())]
    rows = dec["prefill"] + dec["decode"]
    worst = max(max(v for n, v in r["err"].items() if n != "eager") for r in rows) if len(names) > 1 else 0.0
    return lines + [f"Largest relative error of the logits against eager: {worst:.1e}", ""]


def _write(report: dict, out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1))
    text = markdown(report)
    (out / "results.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    global DEVICE
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(os.environ["OUT"], "gpu") if os.environ.get("OUT") else "benchmarks/results/gpu")
    p.add_argument("--rounds", type=int, help="timed rounds per shape (default 5)")
    p.add_argument("--parts", help="of stream, decode, bandwidth, profile (default all)")
    p.add_argument("--systems", help="of eager, disc, disc-plugin, inductor, inductor-ro (default all but the plug-in)")
    p.add_argument("--model", choices=("bert", "hf-bert"), help="the stream's model: disc's own BERT-base (default) or Hugging Face's")
    p.add_argument("--mb", default="256", help="tensor sizes of the bandwidth part, MiB, comma-separated")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="the models' weights and float inputs, and the bandwidth part's tensors (default f32)")
    p.add_argument("--shapes", type=int, default=None, help="the first N shapes of the stream")
    p.add_argument(
        "--quick",
        action="store_true",
        help="fewer shapes (the stream's first 8, the decode's short list) and, unless given, bf16, 3 rounds, eager/disc/inductor-ro, "
        "Hugging Face BERT's stream and the decode: a few minutes on a fresh GPU",
    )
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: the same parts on the CPU (with --tiny, a dry run)")
    p.add_argument("--tiny", action="store_true", help="tiny models and 3 shapes: checks the benchmark runs")
    args = p.parse_args(argv)
    defaults = dict(parts="stream,decode,bandwidth,profile", dtype="f32", model="bert", rounds=5, systems="eager,disc,inductor,inductor-ro")
    if args.quick:
        defaults.update(parts="stream,decode", dtype="bf16", model="hf-bert", rounds=3, systems="eager,disc,inductor-ro")
        args.shapes = args.shapes or 8
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("benchmarks.gpu needs a CUDA GPU (torch.cuda.is_available() is False); --device cpu --tiny dry-runs it")
        return 2
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # the CPU dry run needs no Triton
        triton_version = "none"
    parts = args.parts.split(",")
    systems = args.systems.split(",")
    unknown = set(systems) - {"eager", "disc", "disc-plugin", "inductor", "inductor-ro"}
    if unknown:
        p.error(f"unknown system(s) {sorted(unknown)}")
    if DEVICE == "cuda":
        device = torch.cuda.get_device_name()
    else:
        from benchmarks.machine import cpu_name

        device = f"CPU, {os.cpu_count()} cores: {cpu_name()}" + (" (a dry run at tiny sizes)" if args.tiny else "")
    report: dict = {
        "device": device,
        "torch": torch.__version__,
        "triton": triton_version,
        "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
    }
    out = Path(args.out)
    # Each part's results are written as soon as it ends: a device run cut short keeps what it measured.
    if "bandwidth" in parts:
        report["bandwidth"] = run_bandwidth(args.rounds, [float(x) for x in args.mb.split(",")], args.dtype)
        _write(report, out)
    if "stream" in parts:
        report["stream"] = run_stream(args.rounds, systems, args.dtype, args.shapes, args.model, args.tiny)
        _write(report, out)
    if "decode" in parts:
        report["decode"] = run_decode(args.rounds, systems, args.dtype, args.quick, args.tiny)
        _write(report, out)
    if "profile" in parts and DEVICE == "cuda":
        report["profile_dtype"] = args.dtype
        report["profile"] = run_profile([(1, 16), (4, 64), (16, 128)], args.dtype, ("disc", "eager", "inductor"))
    print(_write(report, out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
