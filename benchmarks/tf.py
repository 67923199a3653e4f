"""TensorFlow side by side: eager, ``tf.function``, XLA (``jit_compile=True``) and ``disc.tf``.

Run as ``python -m benchmarks.tf [--workloads bert,resnet50] [--reps 10] [--out DIR]``. Each
workload is a Keras model built in code with random weights, run over a stream of shapes that
starts at batch 1. Per shape: every system's first call (XLA compiles there, once per new
shape), then the median of ``--reps`` interleaved calls (in a fresh order each rep). Reports per-shape latencies, the
geometric mean of speedups over ``tf.function`` and over eager, and each system's total time
over the stream counting its compilations (disc's one ``disc.tf.compile``; XLA's first calls).
``disc-unwatched`` is disc without the per-call check of the frozen variables (``watch_variables=False``).
Writes ``results.md`` and ``results.json`` in ``--out`` and the table into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

ROOT = Path(__file__).resolve().parent.parent
# disc watches the frozen variables at every call (the default); disc-unwatched is watch_variables=False.
SYSTEMS = ("tf-eager", "tf.function", "tf-xla", "disc", "disc-unwatched")


def _bert() -> tuple[Any, list, list, Any]:
    import numpy as np
    import tensorflow as tf

    sys.path.insert(0, str(ROOT / "tests" / "frontends"))
    import tf_models

    tf.keras.utils.set_random_seed(0)
    model = tf_models.Encoder(vocab=1000, width=256, heads=4, layers=4, positions=512)
    sig = [tf.TensorSpec([None, None], tf.int32, name="ids"), tf.TensorSpec([None, None], tf.int32, name="mask")]
    shapes = [(1, 16), (1, 128), (2, 64), (4, 32), (8, 128), (1, 384), (4, 256), (16, 64)]

    def inputs(b: int, n: int) -> list:
        ids = np.random.default_rng(n).integers(0, 1000, (b, n)).astype(np.int32)
        return [ids, np.ones_like(ids)]

    return (lambda ids, mask: model(ids, mask, training=False)), sig, [inputs(*s) for s in shapes], shapes


def _resnet50() -> tuple[Any, list, list, Any]:
    import numpy as np

    sys.path.insert(0, str(ROOT / "tests" / "frontends"))
    import tf_models

    model, sig = tf_models.cnn("ResNet50")
    shapes = [(1, 224, 224), (1, 160, 160), (2, 192, 256), (4, 128, 128), (1, 320, 240), (2, 224, 224)]

    def inputs(b: int, h: int, w: int) -> list:
        return [np.random.default_rng(h * w).standard_normal((b, h, w, 3)).astype(np.float32)]

    return (lambda x: model(x, training=False)), sig, [inputs(*s) for s in shapes], shapes


WORKLOADS = {
    "bert": ("Keras BERT-style encoder, 4 layers / 256, float32", _bert),
    "resnet50": ("keras.applications ResNet50 (weights=None, avg pool), float32", _resnet50),
}


def _max_rel(a: Any, b: Any) -> float:
    import numpy as np
    import tensorflow as tf

    errs = []
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        errs.append(float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-12)))
    return max(errs)


def run_workload(name: str, reps: int) -> dict[str, Any]:
    import tensorflow as tf

    import disc.tf

    description, build = WORKLOADS[name]
    call, sig, batches, shapes = build()
    fns: dict[str, Any] = {
        "tf-eager": call,
        "tf.function": tf.function(call, input_signature=sig),
        "tf-xla": tf.function(call, input_signature=sig, jit_compile=True),
    }
    compile_s = {"tf-eager": 0.0, "tf.function": 0.0, "tf-xla": 0.0}
    for system, watch in (("disc", True), ("disc-unwatched", False)):
        t0 = time.perf_counter()
        fns[system] = disc.tf.compile(tf.function(call), sig, watch_variables=watch)
        compile_s[system] = time.perf_counter() - t0
    per_shape, first_calls, errors = [], {s: 0.0 for s in SYSTEMS}, []
    for shape, xs in zip(shapes, batches):
        want = None
        for s in SYSTEMS:  # first calls: tracing, XLA's compilation for this shape
            t0 = time.perf_counter()
            out = fns[s](*xs)
            tf.nest.map_structure(lambda t: t.numpy(), out)
            first_calls[s] += time.perf_counter() - t0
            if s == "tf.function":
                want = out
        errors.append(_max_rel(fns["disc"](*xs), want))
        times: dict[str, list[float]] = {s: [] for s in SYSTEMS}
        order = random.Random(len(per_shape))
        for _ in range(reps):
            # A fresh order each rep: a system run right after TensorFlow's meets its thread pools
            # still spinning (measured: 0.3-1.5 ms a call), so no one system always follows another.
            for s in order.sample(SYSTEMS, len(SYSTEMS)):
                t0 = time.perf_counter()
                tf.nest.map_structure(lambda t: t.numpy(), fns[s](*xs))
                times[s].append(time.perf_counter() - t0)
        per_shape.append({"shape": list(shape), "ms": {s: 1e3 * sorted(ts)[len(ts) // 2] for s, ts in times.items()}})
        print(f"  {name} {shape}: " + ", ".join(f"{s} {v:.2f} ms" for s, v in per_shape[-1]["ms"].items()), file=sys.stderr, flush=True)

    def geomean(system: str, base: str) -> float:
        return math.exp(sum(math.log(p["ms"][base] / p["ms"][system]) for p in per_shape) / len(per_shape))

    steady = {s: sum(p["ms"][s] for p in per_shape) / 1e3 for s in SYSTEMS}
    return {
        "name": name,
        "description": description,
        "shapes": [list(s) for s in shapes],
        "per_shape": per_shape,
        "speedup_vs_tf_function": {s: geomean(s, "tf.function") for s in SYSTEMS},
        "speedup_vs_eager": {s: geomean(s, "tf-eager") for s in SYSTEMS},
        "compile_s": compile_s,
        "first_calls_s": first_calls,
        # The stream once: compilation, each shape's first call and one steady call per shape.
        "stream_total_s": {s: compile_s[s] + first_calls[s] for s in SYSTEMS},
        "steady_stream_s": steady,
        "xla_compilations": len(shapes),
        "disc_compilations": 1,
        "max_rel_error_vs_tf": max(errors),
    }


def markdown(report: dict[str, Any]) -> str:
    m = report["meta"]
    lines = [
        f"## TensorFlow frontend (`{m['command']}`)",
        "",
        f"{m['date']}, {m['cpu']}, {m['threads']} threads, TensorFlow {m['tensorflow']}, disc {m['disc']}. disc's compile cache: "
        f"`{m['disc_cache']}`; its runtime library and the TensorFlow variable watch's library, built once per installation, took {m['ral_build_s']:.1f} s before the first workload "
        "(not counted in any compile time). XLA compiles at each new shape's first call, counted in its first calls.",
        "",
    ]
    for w in report["workloads"]:
        lines += [
            f"### {w['description']}",
            "",
            f"{len(w['shapes'])} shapes: {', '.join('x'.join(map(str, s)) for s in w['shapes'])}; disc vs TensorFlow max relative error {w['max_rel_error_vs_tf']:.1e}.",
            "",
        ]
        lines += [
            "| system | speedup vs tf.function (geomean) | vs eager | compilations | compile (s) | first calls (s) | stream once, all in (s) |",
            "|---|---|---|---|---|---|---|",
        ]
        for s in SYSTEMS:
            comps = {"disc": w["disc_compilations"], "disc-unwatched": w["disc_compilations"], "tf-xla": w["xla_compilations"]}.get(s, "-")
            row = f"| {s} | {w['speedup_vs_tf_function'][s]:.2f}x | {w['speedup_vs_eager'][s]:.2f}x | {comps} | {w['compile_s'][s]:.2f} "
            lines.append(row + f"| {w['first_calls_s'][s]:.2f} | {w['stream_total_s'][s]:.2f} |")
        lines += ["", "| shape | " + " | ".join(f"{s} ms" for s in SYSTEMS) + " |", "|---" * (len(SYSTEMS) + 1) + "|"]
        for p in w["per_shape"]:
            lines.append(f"| {'x'.join(map(str, p['shape']))} | " + " | ".join(f"{p['ms'][s]:.2f}" for s in SYSTEMS) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="bert,resnet50")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "tf"))
    p.add_argument("--no-docs", action="store_true", help="do not update docs/benchmarks.md")
    args = p.parse_args(argv)
    import importlib.metadata

    import tensorflow as tf

    from benchmarks.machine import cpu_name
    from benchmarks.report import embed_in_docs
    from disc.frontends.tf.variables import buffers_library
    from disc.runtime.ral_build import build_ral

    started = time.perf_counter()
    build_ral()  # once per installation (cached on disk), whatever the model: not a compilation of it
    buffers_library()  # the variable watch's TensorFlow library: likewise once per installation
    ral_build_s = time.perf_counter() - started
    workloads = [run_workload(n, args.reps) for n in args.workloads.split(",")]
    report = {
        "meta": {
            "command": "python -m benchmarks.tf " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "cpu": cpu_name(),
            "threads": tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count(),
            "tensorflow": tf.__version__,
            "disc": importlib.metadata.version("disc-compiler"),
            "duration_s": time.perf_counter() - started,
            "ral_build_s": ral_build_s,
            "disc_cache": os.environ.get("DISC_CACHE_DIR", "~/.cache/disc"),
        },
        "workloads": workloads,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1))
    md = markdown(report)
    (out / "results.md").write_text(md)
    if not args.no_docs:
        embed_in_docs(ROOT / "docs" / "benchmarks.md", "tf", md, out.relative_to(ROOT / "docs"))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
