"""The per-call benchmark runs end to end: every case compiled, checked against eager, timed both ways."""

import json

from benchmarks import overhead


def test_overhead_benchmark_times_each_case_with_grad_on_and_off(monkeypatch, tmp_path):
    monkeypatch.setattr(overhead, "CALLS", 3)
    overhead.main(["--out", str(tmp_path), "--rounds", "2"])
    result = (tmp_path / "results.json").read_text()
    table = (tmp_path / "results.md").read_text()
    cases = {name for name, *_ in overhead._cases()}
    for name in cases:
        assert table.count(f"| {name} | on |") == 1 and table.count(f"| {name} | off |") == 1
    assert '"disc_us"' in result and '"eager_us"' in result
    rows = json.loads(result)["rows"]
    assert len(rows) == 2 * len(cases)
    assert all(r["disc_us"] > 0 and r["eager_us"] > 0 and len(r["disc_rounds_s"]) == 2 for r in rows)
