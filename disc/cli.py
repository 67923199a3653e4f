"""Command line: ``python -m disc demo`` (the main job) and ``python -m disc ops``."""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="disc", description="disc: a dynamic-shape deep-learning compiler")
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="compile a built-in BERT-style encoder once and run it over a stream of shapes")
    d.add_argument("--model", default="bert", choices=["bert", "gpt2", "llama", "t5_encoder"])
    d.add_argument("--variant", default="small")
    d.add_argument("--repeats", type=int, default=3)
    sub.add_parser("ops", help="list the IR ops of the registry")
    args = parser.parse_args(argv)
    if args.cmd == "demo":
        return demo(args.model, args.variant, args.repeats)
    return list_ops()


if __name__ == "__main__":
    sys.exit(main())
