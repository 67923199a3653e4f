"""bf16 on the CPU as an opt-in for a float32 model: ``torch.autocast("cpu", torch.bfloat16)``
through disc's plug-in next to OpenVINO's bf16 inference precision, on this machine.

Run as ``python -m benchmarks.cpu_autocast [--workload bert-small] [--reps 15] [--out DIR]``.
One float32 model of the zoo, exported once to ONNX for OpenVINO. Per shape (a subset of the
workload's stream, size 1 first), interleaved rounds of: eager float32, eager under autocast,
disc's plug-in in float32 and under autocast (one ``torch.compile(backend="disc",
dynamic=True)`` each), OpenVINO with ``INFERENCE_PRECISION_HINT`` f32 and bf16. Reports median
latencies, each system's geometric-mean speedup over eager float32, and each bf16 system's
error against float32 next to eager autocast's. The CPU line says whether the CPU has
AVX512-BF16 or AMX (without either, bf16 is converted in software and loses). Writes
``results.md`` and ``results.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ((1, 8), (1, 16), (3, 33), (8, 16), (1, 128), (4, 64), (2, 200), (4, 160))
SYSTEMS = ("eager", "eager-autocast", "disc-plugin", "disc-plugin-autocast", "openvino-f32", "openvino-bf16")


def _first(out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) else out


def run(workload_name: str, reps: int) -> dict[str, Any]:
    import numpy as np
    import openvino as ov
    import torch

    from benchmarks.systems.onnx_export import export_onnx, input_arrays
    from benchmarks.timing import interleaved
    from benchmarks.workloads import get_workload

    torch.manual_seed(0)
    workload = get_workload(workload_name)
    model = workload.build().eval()
    shapes = [dict(zip(("batch", "seq"), s)) for s in SHAPES]
    example = workload.make_inputs(shapes[-1], 0)
    onnx_path = export_onnx(model, workload, example, Path(tempfile.mkdtemp(prefix="disc-autocast-")) / "model.onnx")
    core = ov.Core()
    ov_model = core.read_model(str(onnx_path))
    names = {i.get_any_name() for i in ov_model.inputs}
    requests = {
        prec: core.compile_model(ov_model, "CPU", {"INFERENCE_PRECISION_HINT": prec, "INFERENCE_NUM_THREADS": torch.get_num_threads()}).create_infer_request()
        for prec in ("f32", "bf16")
    }
    plugin = torch.compile(model, backend="disc", dynamic=True)
    plugin_bf16 = torch.compile(model, backend="disc", dynamic=True)

    def autocast(fn: Any) -> Any:
        def call(*args: Any) -> Any:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return fn(*args)

        return call

    rows = []
    with torch.no_grad():
        for k, shape in enumerate(shapes):
            args = workload.make_inputs(shape, k)
            feeds = input_arrays(workload, args, names)
            fns = {
                "eager": lambda: model(*args),
                "eager-autocast": lambda: autocast(model)(*args),
                "disc-plugin": lambda: plugin(*args),
                "disc-plugin-autocast": lambda: autocast(plugin_bf16)(*args),
                "openvino-f32": lambda: requests["f32"].infer(feeds),
                "openvino-bf16": lambda: requests["bf16"].infer(feeds),
            }
            exact = _first(model(*args)).double()

            def off(out: Any) -> float:
                return float((out.double() - exact).abs().max() / exact.abs().max())

            errors = {
                "eager-autocast": off(_first(autocast(model)(*args))),
                "disc-plugin-autocast": off(_first(autocast(plugin_bf16)(*args))),
                "openvino-bf16": off(torch.from_numpy(np.asarray(requests["bf16"].infer(feeds)[0]))),
            }
            times = interleaved([fns[s] for s in SYSTEMS], reps, rotate=True)
            ms = {s: 1e3 * statistics.median(t) for s, t in zip(SYSTEMS, times)}
            rows.append({"shape": [shape["batch"], shape["seq"]], "ms": ms, "rel_error_vs_f32": errors})
            print(f"  {workload_name} {shape['batch']}x{shape['seq']}: " + ", ".join(f"{s} {v:.2f} ms" for s, v in ms.items()), file=sys.stderr, flush=True)
    speedup = {s: math.exp(sum(math.log(r["ms"]["eager"] / r["ms"][s]) for r in rows) / len(rows)) for s in SYSTEMS}
    worst = {s: max(r["rel_error_vs_f32"][s] for r in rows) for s in rows[0]["rel_error_vs_f32"]}
    return {"workload": workload_name, "description": workload.description, "rows": rows, "speedup_vs_eager_f32": speedup, "worst_rel_error_vs_f32": worst}


def markdown(report: dict[str, Any]) -> str:
    m, r = report["meta"], report["result"]
    lines = [
        f"## bf16 autocast on the CPU against OpenVINO's bf16 (`{m['command']}`)",
        "",
        f"{m['date']}, {m['cpu']}, {m['threads']} threads, torch {m['torch']}, OpenVINO {m['openvino']}. {r['description']}; "
        f"{len(r['rows'])} shapes, {m['reps']} interleaved rounds each (medians).",
        "",
        "| system | speedup vs eager float32 (geomean) | worst rel. error vs float32 |",
        "|---|---:|---:|",
    ]
    for s in SYSTEMS:
        err = r["worst_rel_error_vs_f32"].get(s)
        lines.append(f"| {s} | {r['speedup_vs_eager_f32'][s]:.2f}x | {'-' if err is None else f'{err:.1e}'} |")
    lines += ["", "| batch x seq | " + " | ".join(f"{s} ms" for s in SYSTEMS) + " |", "|---" * (len(SYSTEMS) + 1) + "|"]
    for row in r["rows"]:
        lines.append(f"| {row['shape'][0]}x{row['shape'][1]} | " + " | ".join(f"{row['ms'][s]:.2f}" for s in SYSTEMS) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="bert-small")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "cpu-autocast"))
    args = p.parse_args(argv)
    import importlib.metadata

    import torch

    from benchmarks.machine import cpu_identity, cpu_name

    result = run(args.workload, args.reps)
    report = {
        "meta": {
            "command": "python -m benchmarks.cpu_autocast " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "cpu": cpu_name(),
            "cpu_identity": cpu_identity(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "openvino": importlib.metadata.version("openvino"),
            "reps": args.reps,
        },
        "result": result,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "results.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
