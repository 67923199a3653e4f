"""Command line: ``disc demo`` (the main job), ``disc compile``/``explain`` for ONNX files,
``disc run`` (a saved program, numpy alone) and ``disc ops``."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

# The demo's shape stream: batch 1-8, sequence 1-384, 1-sized dims included.
DEMO_STREAM = [(1, 8), (4, 64), (1, 1), (8, 128), (2, 33), (3, 384), (8, 1), (1, 200), (5, 77), (2, 256), (7, 16), (4, 300)]


def _median_ms(fn, args, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def demo(model_name: str = "bert", variant: str = "small", repeats: int = 3) -> int:
    import torch

    import disc
    from disc.models import MODELS

    entry = MODELS[model_name]
    model = entry.build(variant)
    print(f"disc {disc.__version__} demo: {model_name}/{variant}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"dynamic dims: {entry.dynamic}")
    first = dict(zip(entry.dims, DEMO_STREAM[0]))
    start = time.perf_counter()
    cm = disc.compile(model, entry.inputs(first), dynamic=entry.dynamic)
    hit = cm.report.cache.startswith("hit")
    print(f"{'loaded from the program cache' if hit else 'compiled once'} in {time.perf_counter() - start:.2f} s "
          f"({sum(cm.graph.op_counts().values())} IR ops, fallbacks: {cm.report.fallbacks or 'none'})")
    if hit:
        print("(compiled by an earlier run; DISC_PROGRAM_CACHE=0 compiles it again)")
    print()
    print(f"{'batch':>5} {'seq':>5} {'eager ms':>9} {'disc ms':>9} {'ratio':>6} {'max rel err':>12}")
    worst = 0.0
    with torch.no_grad():
        for batch, seq in DEMO_STREAM:
            args = entry.inputs(dict(zip(entry.dims, (batch, seq))), seed=batch * 1000 + seq)
            ref = model(*args)
            out = cm(*args)
            refs = ref if isinstance(ref, tuple) else (ref,)
            outs = out if isinstance(out, tuple) else (out,)
            err = max(((o - r).abs().max() / r.abs().max().clamp_min(1e-6)).item() for o, r in zip(outs, refs))
            worst = max(worst, err)
            eager_ms = _median_ms(model, args, repeats)
            disc_ms = _median_ms(cm, args, repeats)
            print(f"{batch:>5} {seq:>5} {eager_ms:>9.2f} {disc_ms:>9.2f} {eager_ms / disc_ms:>5.2f}x {err:>12.2e}")
    print()
    print(f"shapes: {len(DEMO_STREAM)}, compilations: {cm.num_compilations}, max rel err: {worst:.2e}")
    choice = cm.report.backend
    if choice is not None and choice.native is not None:
        counts = choice.native.lowered.counts()
        print(f"execution: native CPU program ({counts['memory_bound']} fused kernels + {counts['library']} library calls per call); see disc.explain(cm)")
    elif choice is not None and choice.segments is not None:
        print(f"execution: native CPU segments ({choice.reason}); see disc.explain(cm)")
    else:
        print(f"execution: reference executor (op by op through torch): {choice.reason if choice else 'no backend recorded'}")
    same = _deploy(cm, entry) if choice is not None and choice.native is not None else True
    return 0 if worst <= 1e-4 and same else 1


def _deploy(cm, entry) -> bool:
    """Save the program and run it again through the standalone runtime (numpy, no torch)."""
    import tempfile
    from pathlib import Path

    import torch

    import disc_runtime

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model.disc"
        cm.save(folder)
        start = time.perf_counter()
        m = disc_runtime.load(folder)
        loaded = time.perf_counter() - start
        batch, seq = DEMO_STREAM[4]
        args = entry.inputs(dict(zip(entry.dims, (batch, seq))), seed=7)
        with torch.no_grad():
            want = cm(*args)
        want = want if isinstance(want, tuple) else (want,)
        got = m.run(*[a.numpy() for a in args])
        diff = max(float(abs(g - w.numpy()).max()) for g, w in zip(got, want))
        inputs = ", ".join(f"{t.name}: {t.dtype}[{', '.join(map(str, t.dims))}]" for t in m.inputs)
        print(f"deployed: saved, loaded by disc_runtime (numpy only) in {loaded * 1e3:.0f} ms ({inputs}); "
              f"at {batch}x{seq} its outputs differ from the compiled module's by {diff:.1e}")
        print("  without PyTorch: disc-run <folder> --input name=file.npy ... (see README, 'Deploy without PyTorch')")
    return diff <= 1e-6


def list_ops() -> int:
    from disc.ir.registry import OPS, get_spec

    get_spec("add")  # loads the registry
    for name in sorted(OPS):
        spec = OPS[name]
        print(f"{name:18} {spec.category:12} ({', '.join(spec.operands)}) {dict(spec.attrs) if spec.attrs else ''}")
    return 0


def _dynamic(specs: list[str]) -> dict[str, dict[int, str | int]]:
    """``NAME:AXIS=SYMBOL`` (or ``=SIZE`` to pin the dim) as ``disc.onnx.compile``'s ``dynamic=``."""
    out: dict[str, dict[int, str | int]] = {}
    for spec in specs:
        name, sep, rest = spec.rpartition(":")
        axis, eq, dim = rest.partition("=")
        if not sep or not eq or not axis.isdigit() or not dim:
            raise SystemExit(f"disc: --dynamic {spec!r}: write NAME:AXIS=SYMBOL (or NAME:AXIS=SIZE)")
        out.setdefault(name, {})[int(axis)] = int(dim) if dim.isdigit() else dim
    return out


def _values(specs: list[str]) -> dict[str, Any] | None:
    import numpy as np

    out = {}
    for spec in specs:
        name, eq, path = spec.partition("=")
        if not eq:
            raise SystemExit(f"disc: --value {spec!r}: write NAME=FILE.npy")
        try:
            out[name] = np.load(path, allow_pickle=False)  # nothing is executed from data files
        except (OSError, ValueError) as e:
            raise SystemExit(f"disc: cannot read {path}: {e}") from None
    return out or None


def compile_onnx(path: str, folder: str | None, dynamic: list[str], values: list[str], explain: bool) -> int:
    import disc.onnx
    from disc.errors import DiscError

    start = time.perf_counter()
    try:
        prog = disc.onnx.compile(path, dynamic=_dynamic(dynamic), values=_values(values))
        if isinstance(prog, disc.onnx.ValueSpecializedProgram):
            if prog.sequence_inputs or prog.optional_inputs:
                print(f"disc: {path} takes sequence or optional input(s) {prog.sequence_inputs + prog.optional_inputs}, compiled per call structure; use disc.onnx.compile from Python", file=sys.stderr)
                return 2
            print(f"disc: {path} uses the values of input(s) {prog.value_inputs} as shapes; give them with --value NAME=FILE.npy", file=sys.stderr)
            return 2
        if explain:
            print(prog.report.text())
            return 0
        saved = prog.save(folder)
    except DiscError as e:
        print(f"disc: {e}", file=sys.stderr)
        return 1
    print(f"compiled {path} in {time.perf_counter() - start:.2f} s; saved to {saved}")
    print(f"run it with numpy alone: disc run {saved} --input {prog.input_names[0]}=FILE.npy ...")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"]:  # the standalone runner's own options
        from disc_runtime.cli import main as run_main

        return run_main(argv[1:])
    parser = argparse.ArgumentParser(prog="disc", description="disc: a dynamic-shape deep-learning compiler")
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="compile a built-in BERT-style encoder once and run it over a stream of shapes")
    d.add_argument("--model", default="bert", choices=["bert", "gpt2", "llama", "t5_encoder"])
    d.add_argument("--variant", default="small")
    d.add_argument("--repeats", type=int, default=3)
    for cmd, text in (("compile", "compile an ONNX model once for all its shapes and save the program"), ("explain", "compile an ONNX model and print what disc made of it")):
        c = sub.add_parser(cmd, help=text)
        c.add_argument("model", help="the .onnx file")
        if cmd == "compile":
            c.add_argument("-o", "--output", required=True, help="the folder to write the program to")
        c.add_argument("--dynamic", action="append", default=[], metavar="NAME:AXIS=SYMBOL", help="name (or pin, with a number) an input's dim")
        c.add_argument("--value", action="append", default=[], metavar="NAME=FILE.npy", help="an input fixed at compile time (one used as a shape)")
    sub.add_parser("run", help="run a saved program on .npy files with numpy alone (disc run --help)")
    sub.add_parser("ops", help="list the IR ops of the registry")
    args = parser.parse_args(argv)
    if args.cmd == "demo":
        return demo(args.model, args.variant, args.repeats)
    if args.cmd in ("compile", "explain"):
        return compile_onnx(args.model, getattr(args, "output", None), args.dynamic, args.value, args.cmd == "explain")
    return list_ops()
