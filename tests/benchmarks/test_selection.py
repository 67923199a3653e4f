"""The selection benchmark runs end to end (checking both compiled forms against eager) and writes its JSON."""

from __future__ import annotations

import json


def test_selection_benchmark_writes_rows(tmp_path) -> None:
    from benchmarks import selection

    out = tmp_path / "selection.json"
    selection.main(["--quick", "--rounds", "1", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 3
    assert all(r[name] > 0 for r in rows for name in selection.SYSTEMS)
    assert all(r["kept"] > 0 for r in rows)
