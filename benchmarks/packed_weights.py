"""What packing a model's GEMM weights buys: one program reads packed copies, its twin reads them as stored.

Run as ``python -m benchmarks.packed_weights --workload bert-small [--budget-mb MB] [--calls N]
[--shapes 1x8,4x64] [--out FILE]``. Two programs of one workload run in one process on two
copies of the same weights, alternating call by call: the RAL packs the first one's weights
(up to ``--budget-mb``; the default has room for all of them) and none of the second's (its
budget is 0 whenever the second program meets a new weight). Their outputs are compared with
each other and with eager before timing. Prints a table and writes JSON: per shape the median
call of each, the speedup, and the bytes of packed weights held.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

import disc
from benchmarks.workloads import get_workload
from disc.runtime.ral import load_ral

ALL_WEIGHTS_MB = 1 << 20  # room for every weight of any workload here


def _close(got: Any, want: Any, what: str) -> None:
    for g, w in zip(pytree.tree_leaves(got), pytree.tree_leaves(want), strict=True):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=lambda m: f"{what}: {m}")


def run(workload: str, calls: int, budget_mb: float, shapes: list[dict[str, int]] | None = None) -> dict[str, Any]:
    w = get_workload(workload)
    model = w.build().eval()
    twin = copy.deepcopy(model)  # the same values at other addresses: packed separately, or not at all
    stream = shapes or list(w.stream)
    ral = load_ral()
    previous = ral.set_packed_gemm_mb(budget_mb)
    start_bytes = ral.cache_entries()["packed_gemm_bytes"]
    rows = []
    try:
        with torch.no_grad():
            packed = disc.compile(model, w.make_inputs(stream[0], 0), dynamic=w.dynamic)
            stored = disc.compile(twin, w.make_inputs(stream[0], 0), dynamic=w.dynamic)
            for shape in stream:
                args = w.make_inputs(shape, 1)
                ral.set_packed_gemm_mb(budget_mb)
                first = packed(*args)
                ral.set_packed_gemm_mb(0)
                second = stored(*args)
                want = model(*args)
                label = w.shape_label(shape)
                _close(first, want, f"{label}: packed weights vs eager")
                _close(second, want, f"{label}: weights as stored vs eager")
                times: dict[str, list[float]] = {"packed": [], "stored": []}
                for _ in range(2):  # warm: plans and caches
                    packed(*args), stored(*args)
                for _ in range(calls):
                    for name, fn in (("packed", packed), ("stored", stored)):
                        t0 = time.perf_counter()
                        fn(*args)
                        times[name].append((time.perf_counter() - t0) * 1e3)
                p, s = statistics.median(times["packed"]), statistics.median(times["stored"])
                rows.append({"shape": label, "packed_ms": p, "stored_ms": s, "speedup": s / p})
                print(f"{label:>12s} {p:9.2f} {s:9.2f} {s / p:8.2f}x", flush=True)
            held = ral.cache_entries()["packed_gemm_bytes"] - start_bytes
    finally:
        ral.set_packed_gemm_mb(previous)
    return {
        "workload": workload,
        "budget_mb": budget_mb,
        "calls": calls,
        "packed_mb": held / 2**20,
        "speedup_geomean": statistics.geometric_mean(r["speedup"] for r in rows),
        "rows": rows,
    }


def _shapes(text: str | None, dims: tuple[str, ...]) -> list[dict[str, int]] | None:
    if not text:
        return None
    return [dict(zip(dims, (int(v) for v in item.split("x")), strict=True)) for item in text.split(",")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="bert-small")
    parser.add_argument("--budget-mb", type=float, default=ALL_WEIGHTS_MB, help="packed weights the first program may have")
    parser.add_argument("--calls", type=int, default=9, help="timed calls per shape and program")
    parser.add_argument("--shapes", help="e.g. 1x8,4x64 in the stream's dims (default: the workload's stream)")
    parser.add_argument("--out", default="/tmp/packed_weights.json", help="JSON results path")
    opts = parser.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    dims = tuple(get_workload(opts.workload).stream[0])  # every dim of a shape, e.g. (batch, seq)
    print(f"{'shape':>12s} {'packed ms':>9s} {'stored ms':>9s} {'speedup':>9s}")
    result = run(opts.workload, opts.calls, opts.budget_mb, _shapes(opts.shapes, dims))
    print(f"geomean speedup {result['speedup_geomean']:.2f}x with {result['packed_mb']:.1f} MB of packed weights")
    Path(opts.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {opts.out}")


if __name__ == "__main__":
    main()
