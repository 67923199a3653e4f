"""One workload's stream in one process: eager and disc alternating call by call, per shape.

Run as ``python -m benchmarks.stream_ab --workload detector [--calls 15] [--out FILE]``. Meant
for A/B runs of two versions of disc (a ``git worktree`` of the older commit on ``PYTHONPATH``,
each with its own ``DISC_CACHE_DIR``), run alternately: it skips the suite's cold starts and
peers, so a run of a CNN workload takes well under a minute. Prints one JSON line (and writes
it to ``--out``): per shape the median eager and disc call in ms, and the geometric mean of
eager / disc over the stream.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import disc
from benchmarks.workloads import get_workload


def _timed(fn: Any, args: tuple, times: list[float]) -> None:  # appends one call's ms
    start = time.perf_counter()
    fn(*args)
    times.append((time.perf_counter() - start) * 1e3)


def run(workload: str, calls: int) -> dict[str, Any]:
    w = get_workload(workload)
    model = w.build().eval()
    shapes = list(w.stream)
    per_shape: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        compiled = disc.compile(model, w.make_inputs(shapes[0], 0), dynamic=w.dynamic)
        for shape in shapes:
            args = w.make_inputs(shape, 1)
            for _ in range(3):  # warm: plans, packed weights, caches
                model(*args)
                compiled(*args)
            eager: list[float] = []
            ours: list[float] = []
            for _ in range(calls):
                _timed(model, args, eager)
                _timed(compiled, args, ours)
            per_shape[w.shape_label(shape)] = {"eager_ms": statistics.median(eager), "disc_ms": statistics.median(ours)}
    ratios = [r["eager_ms"] / r["disc_ms"] for r in per_shape.values()]
    return {"workload": workload, "calls": calls, "speedup_geomean": statistics.geometric_mean(ratios), "shapes": per_shape}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True)
    parser.add_argument("--calls", type=int, default=15, help="timed calls per shape and system")
    parser.add_argument("--out", help="file for the JSON line")
    args = parser.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    result = json.dumps(run(args.workload, args.calls))
    if args.out:
        Path(args.out).write_text(result + "\n")
    print(result)


if __name__ == "__main__":
    main()
