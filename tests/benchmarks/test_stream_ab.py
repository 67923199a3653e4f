"""The A/B stream timer runs end to end: one compile, every shape timed both ways."""

import json

from benchmarks import stream_ab


def test_stream_ab_times_every_shape_of_the_stream(tmp_path):
    out = tmp_path / "ab.json"
    stream_ab.main(["--workload", "bert-tiny-smoke", "--calls", "2", "--out", str(out)])
    result = json.loads(out.read_text())
    assert list(result["shapes"]) == ["2x16", "1x1"]
    assert all(r["eager_ms"] > 0 and r["disc_ms"] > 0 for r in result["shapes"].values())
    ratios = [r["eager_ms"] / r["disc_ms"] for r in result["shapes"].values()]
    assert min(ratios) <= result["speedup_geomean"] <= max(ratios)
