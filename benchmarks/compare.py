"""``python -m benchmarks compare A/results.json B/results.json``: are two runs the same within noise?

For every (workload, system) in both runs: compilations must be equal, and the
geometric-mean speedups are compared with the noise each run measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _index(results: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(w["name"], s["system"]): s for w in results["workloads"] for s in w["systems"] if s["status"] == "ok"}


def compare(a_path: Path, b_path: Path) -> tuple[list[str], bool]:
    """Markdown lines comparing two runs, and whether their compile counts all agree."""
    a, b = (_index(json.loads(Path(p).read_text())) for p in (a_path, b_path))
    lines = [
        "| workload | system | compilations A / B | speedup A | speedup B | difference | noise A + B |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    same_counts = True
    for key in sorted(set(a) & set(b)):
        sa, sb = a[key], b[key]
        same_counts &= sa["compilations"] == sb["compilations"]
        ga, gb = sa["geomean_speedup"], sb["geomean_speedup"]
        diff = abs(ga - gb) / ga if ga else 0.0
        noise = sa["geomean_speedup_spread"] + sb["geomean_speedup_spread"]
        lines.append(
            f"| {key[0]} | {key[1]} | {sa['compilations']} / {sb['compilations']} | {ga:.2f}x | {gb:.2f}x | {diff * 100:.1f}% | {noise * 100:.1f}% |"
        )
    only = sorted(set(a) ^ set(b))
    if only:
        lines.append("")
        lines.append("Only in one run: " + ", ".join(f"{w}/{s}" for w, s in only))
    return lines, same_counts
