"""``python -m benchmarks run --suite cpu``: run a suite, write JSON, Markdown and plots, update docs.

Suites:
- ``cpu``: the CPU suite (every workload, every installed system, the machine's limits); < 30 min on 2 cores.
- ``gpu``: the same workloads on a CUDA device, float32 then bfloat16 (needs a GPU).
- ``smoke``: a tiny BERT at two shapes with every installed system and the quick machine probes (CI).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import platform
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.machine import cpu_identity, cpu_name

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"


@dataclass(frozen=True)
class Suite:
    name: str
    workloads: tuple[str, ...]
    device: str = "cpu"
    dtypes: tuple[str, ...] = ("float32",)
    machine: str = "full"  # full | quick | none


SUITES = {
    "cpu": Suite("cpu", ("bert-small", "bert-base", "gpt2-decode", "resnet18", "detector")),
    "gpu": Suite("gpu", ("bert-small", "bert-base", "gpt2-decode", "resnet18", "detector"), device="cuda", dtypes=("float32", "bfloat16")),
    # bf16 on the CPU: the generated kernels keep 16-bit buffers, the RAL's GEMMs run on oneDNN's
    # bf16 matmul (AMX or AVX512_BF16 where the CPU has them); eager and inductor alongside.
    "cpu-bf16": Suite("cpu-bf16", ("bert-small", "gpt2-decode"), dtypes=("bfloat16",), machine="none"),
    "smoke": Suite("smoke", ("bert-tiny-smoke",), machine="quick"),
}


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("disc-compiler", "numpy", "onnxruntime", "openvino", "onnx", "triton"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _workload(name: str):
    from benchmarks.workloads import get_workload

    try:
        return get_workload(name)
    except KeyError as exc:
        raise SystemExit(str(exc.args[0])) from None


def run(args: argparse.Namespace) -> int:
    from benchmarks.harness import run_workload, steps_for
    from benchmarks.progress import Progress
    from benchmarks.report import embed_in_docs, make_plots, markdown, write_json
    from benchmarks.systems import SYSTEMS, Context

    suite = SUITES[args.suite]
    device = suite.device
    if device == "cuda" and not torch.cuda.is_available():
        print("the gpu suite needs a CUDA device and torch.cuda.is_available() is False; run --suite cpu here", file=sys.stderr)
        return 2
    workload_names = args.workloads.split(",") if args.workloads else list(suite.workloads)
    workloads = [_workload(n) for n in workload_names]
    names = args.systems.split(",") if args.systems else list(SYSTEMS)
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown system(s) {unknown}; known: {', '.join(SYSTEMS)}")
    systems = [SYSTEMS[n] for n in names]
    skipped = {s.name: s.missing() for s in systems if s.missing()}
    for name, why in skipped.items():
        print(f"note: {name} skipped: {why}", file=sys.stderr)

    out = Path(args.out) if args.out else ROOT / "docs" / "benchmarks" / suite.name
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="disc-bench-"))  # fresh caches: cold starts are cold
    started = time.perf_counter()

    total = sum(steps_for(w, len(systems), args.repeats) for w in workloads) * len(suite.dtypes)
    with_machine = suite.machine != "none" and not args.no_machine
    from benchmarks.machine import compute_peak, progress_steps, run_machine_suite

    progress = Progress(total + (progress_steps(suite.machine == "quick") if with_machine else 0))
    machine = None
    if with_machine:
        machine = run_machine_suite(quick=suite.machine == "quick", progress=lambda label: progress.step(f"machine · {label}"))
    elif device == "cpu":  # a fraction of a second, and every workload's compute roof needs it
        machine = {"compute": compute_peak(quick=True)}
    results: list[Any] = []
    for dtype_name in suite.dtypes:
        ctx = Context(device=device, dtype=getattr(torch, dtype_name), workdir=scratch / dtype_name)
        for w in workloads:
            res = run_workload(w, systems, ctx, progress, repeats=args.repeats, honour_exclusions=args.systems is None)
            if dtype_name != "float32":
                res.name = f"{res.name} ({dtype_name})"
            results.append(res)
    progress.close()

    report = {
        "meta": {
            "suite": suite.name,
            "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "command": "python -m benchmarks " + " ".join(shlex.quote(a) for a in args.argv),
            "cpu": cpu_name(),
            "cpu_identity": cpu_identity(),
            "threads": torch.get_num_threads(),
            "device": device if device == "cpu" else torch.cuda.get_device_name(),
            "dtype": ", ".join(suite.dtypes),
            "versions": _versions(),
            "skipped": skipped,
            "duration_s": time.perf_counter() - started,
        },
        "machine": machine,
        "workloads": [r.to_json() for r in results],
    }
    plots, note = make_plots(report, out) if not args.no_plots else ({}, "plots not requested (--no-plots)")
    report["meta"]["plot_note"] = note
    write_json(report, out)
    md = markdown(report, plots)
    (out / "results.md").write_text(md)
    if args.out is None and suite.name != "smoke":
        embed_in_docs(DOC, suite.name, md, out.relative_to(DOC.parent))
        print(f"updated {DOC.relative_to(ROOT)}", file=sys.stderr)
    print(md)
    print(f"wrote {out}/results.json, results.md and {sum(len(p) for p in plots.values())} plots", file=sys.stderr)
    return 0


def list_things() -> int:
    from benchmarks.systems import SYSTEMS
    from benchmarks.workloads import WORKLOADS

    print("suites:")
    for s in SUITES.values():
        print(f"  {s.name:8} {s.device}, {'/'.join(s.dtypes)}: {', '.join(s.workloads)}")
    print("workloads:")
    for w in WORKLOADS.values():
        print(f"  {w.name:14} {w.description}")
    print("systems:")
    for s in SYSTEMS.values():
        why = s.missing()
        print(f"  {s.name:26} {s.description}{'  [' + why + ']' if why else ''}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description="disc's dynamic-shape benchmark suite")
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a suite and write results.json, results.md and plots")
    r.add_argument("--suite", choices=sorted(SUITES), default="cpu")
    r.add_argument("--workloads", help="comma-separated subset of the suite's workloads")
    r.add_argument("--systems", help="comma-separated subset of systems (default: all registered)")
    r.add_argument("--repeats", type=int, help="steady-state rounds per shape (default: per workload)")
    r.add_argument("--out", help="output folder (default: docs/benchmarks/SUITE, and docs/benchmarks.md is updated)")
    r.add_argument("--no-machine", action="store_true", help="skip the machine limits and memory-bound microbenchmarks (a CPU suite still measures its FMA peak, a second)")
    r.add_argument("--no-plots", action="store_true")
    sub.add_parser("list", help="list suites, workloads and systems")
    c = sub.add_parser("compare", help="compare two results.json: compile counts and speedups within noise")
    c.add_argument("a")
    c.add_argument("b")
    args = parser.parse_args(argv)
    args.argv = argv
    if args.cmd == "list":
        return list_things()
    if args.cmd == "compare":
        from benchmarks.compare import compare

        lines, same_counts = compare(Path(args.a), Path(args.b))
        print("\n".join(lines))
        print("\ncompile counts " + ("identical" if same_counts else "DIFFER"))
        return 0 if same_counts else 1
    return run(args)
