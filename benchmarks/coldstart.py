"""One system's cold (or warm) start on one workload, in a fresh process.

A user's first compilation happens in a fresh process: nothing imported,
no compiled code in memory. Measuring it inside the suite's long-lived
process would let each system inherit the previous one's warm-up (loaded
modules, in-memory kernel caches), so the harness runs this module once per
(system, workload) with an empty scratch folder (cold) and once more with
the folder the cold run left (warm start: only on-disk caches help).

    python -m benchmarks.coldstart '{"workload": "bert-small", "system": "disc", "workdir": "...", "shapes": 24}'

prints one JSON line: prepare time, each call's time, compilations, peak memory, notes.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.harness import MemoryMeter, model_and_inputs, timed_call
    from benchmarks.systems import SYSTEMS, Context
    from benchmarks.workloads import get_workload

    workload = get_workload(spec["workload"])
    system = SYSTEMS[spec["system"]]
    ctx = Context(device=spec.get("device", "cpu"), dtype=getattr(torch, spec.get("dtype", "float32")), workdir=Path(spec["workdir"]))
    shapes = list(workload.stream)[: spec.get("shapes", len(workload.stream))]
    out: dict[str, Any] = {"prepare_s": 0.0, "call_s": [], "compilations": 0, "peak_memory_mb": 0.0, "import_mb": 0.0, "notes": [], "error": None}
    with torch.no_grad():
        model, inputs = model_and_inputs(workload, ctx, len(shapes))
        system.setup(ctx.workdir)  # install-time work, untimed
        meter = MemoryMeter(ctx.device)
        meter.reset()
        for module in system.preload:  # measured apart: library code, paid once per process
            try:
                importlib.import_module(module)
            except ImportError:
                pass
        out["import_mb"] = meter.peak_mb()
        meter.reset()  # peak memory counts what the system adds on top of the model and its inputs
        try:
            start = time.perf_counter()
            runner = system.prepare(model, workload, inputs[0], ctx, ctx.workdir)
            out["prepare_s"] = time.perf_counter() - start
            for i, args in enumerate(inputs):
                stage = f"shape {workload.shape_label(shapes[i])}"
                _, seconds = timed_call(runner, args, ctx.device)
                out["call_s"].append(seconds)
            out["compilations"] = runner.compilations
            out["notes"] = list(runner.notes)
        except Exception as exc:
            where = "prepare" if not out["call_s"] and not out["prepare_s"] else locals().get("stage", "call")
            lines = f"{type(exc).__name__}: {exc}".strip().splitlines()
            out["error"] = f"{where}: {lines[0][:300] if lines else type(exc).__name__}"
            out["traceback"] = traceback.format_exc(limit=4)[-2000:]
        out["peak_memory_mb"] = meter.peak_mb()
    return out


def main() -> int:
    spec = json.loads(sys.argv[1])
    print("\n" + json.dumps(measure(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
