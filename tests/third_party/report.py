"""The third-party model suite's results as a Markdown table (for docs/models.md).

    DISC_SUITE_REPORT=/tmp/suite python -m pytest -n 2 tests/third_party/test_hf_models.py
    python tests/third_party/report.py /tmp/suite [more folders; later ones win]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MODES = ["plugin-infer", "plugin-train", "compile-infer"]


def _cell(row: dict | None) -> str:
    if row is None:
        return "not run"
    if "crash" in row:
        return f"CRASH `{row['crash'][:80]}`"
    verdict = "ok" if row["correct"] else "WRONG"
    errors = f"out {row['worst_output']:.0e}" + (f", grad {row['worst_gradient']:.0e}" if row["mode"] == "plugin-train" else "")
    at = ", ".join(f"{b}x{n}" for b, n in row["compiled_at"])
    graphs = f"{row['graphs']} graph(s) at {at}" if row["mode"] != "compile-infer" else "1 program"
    breaks = f", {row['graph_breaks']} breaks" if row.get("graph_breaks") else ""
    whole = f", {len(row['not_compiled'])} graph(s) left whole to PyTorch" if row.get("not_compiled") else ""
    return f"{verdict} ({errors}); {graphs}{breaks}{whole}"


def main(folders: list[str]) -> None:
    rows: dict[tuple[str, str], dict] = {}
    for folder in folders:
        for path in sorted(Path(folder).glob("*.json")):
            row = json.loads(path.read_text())
            rows[row["arch"], row["mode"]] = row
    archs = sorted({arch for arch, _ in rows})
    print("| architecture | " + " | ".join(MODES) + " | ops run by PyTorch |")
    print("|---" * (len(MODES) + 2) + "|")
    for arch in archs:
        ops: dict[str, int] = {}
        for mode in MODES:
            for op, n in (rows.get((arch, mode)) or {}).get("fallbacks", {}).items():
                ops[op] = max(ops.get(op, 0), n)
        listed = ", ".join(f"`{op.removeprefix('aten.')}` x{n}" for op, n in sorted(ops.items())) or "none"
        print(f"| {arch} | " + " | ".join(_cell(rows.get((arch, m))) for m in MODES) + f" | {listed} |")


if __name__ == "__main__":
    main(sys.argv[1:])
