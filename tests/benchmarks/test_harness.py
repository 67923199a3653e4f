"""The benchmark harness: error measure, summary statistics, and the smoke suite end to end."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.harness import SystemResult, _summarise, counted_call, rel_error
from benchmarks.report import embed_in_docs, workload_tables
from benchmarks.systems import SYSTEMS

ROOT = Path(__file__).resolve().parents[2]


def test_rel_error_compares_every_leaf_and_flags_shape_mismatch() -> None:
    ref = (torch.tensor([1.0, -4.0]), torch.tensor([2.0]))
    assert rel_error(ref, ref) == 0.0
    assert rel_error((torch.tensor([1.0, -3.0]), torch.tensor([2.0])), ref) == pytest.approx(0.25)
    assert rel_error((torch.tensor([1.0, -4.0]), torch.tensor([2.5])), ref) == pytest.approx(0.25)
    assert math.isinf(rel_error((torch.tensor([1.0]), torch.tensor([2.0])), ref))
    assert math.isinf(rel_error(torch.tensor([1.0, -4.0]), ref))


def test_summary_medians_speedups_and_noise() -> None:
    eager = SystemResult("eager", steady_ms=[[10.0, 12.0, 11.0], [4.0, 4.0, 4.0]], first_result_s=1.0)
    fast = SystemResult("fast", steady_ms=[[5.0, 6.0, 5.5], [1.0, 1.0, 2.0]], first_result_s=3.0)
    results = {"eager": eager, "fast": fast}
    _summarise(results, 2)
    assert fast.median_ms == [5.5, 1.0]
    assert fast.speedup == pytest.approx([2.0, 4.0])
    assert fast.geomean_speedup == pytest.approx(math.sqrt(8.0))
    assert fast.cold_compile_s == pytest.approx(3.0 - 0.0055)
    # Round 3 was slow for "fast" at shape 2, so the per-round geomeans differ: the spread shows it.
    assert len(fast.geomean_speedup_per_round) == 3 and fast.geomean_speedup_spread > 0.1
    assert eager.geomean_speedup == pytest.approx(1.0) and eager.geomean_speedup_spread == 0.0


def test_counted_call_counts_matmul_and_convolution_flops() -> None:
    linear, x = torch.nn.Linear(24, 40), torch.randn(3, 5, 24)
    out, gflop = counted_call(linear, (x,))
    torch.testing.assert_close(out, linear(x))
    assert gflop == pytest.approx(2 * 15 * 24 * 40 / 1e9)
    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    _, gflop = counted_call(conv, (torch.randn(2, 3, 7, 9),))
    assert gflop == pytest.approx(2 * (2 * 7 * 9) * 8 * (3 * 3 * 3) / 1e9)
    _, gflop = counted_call(torch.nn.LayerNorm(24), (x,))  # memory-bound ops count nothing
    assert gflop == 0


def _workload_json(gflop: list[float]) -> dict:
    eager = SystemResult("eager", steady_ms=[[10.0, 10.0], [4.0, 4.0]])
    fast = SystemResult("fast", steady_ms=[[5.0, 5.0], [1.0, 1.0]])
    _summarise({"eager": eager, "fast": fast}, 2)
    return {
        "name": "w", "description": "d", "stream": [{"batch": 2}, {"batch": 1}], "repeats": 2, "seconds": 1.0,
        "systems": [vars(eager), vars(fast)], "gflop": gflop,
    }  # fmt: skip


def test_compute_roof_bounds_the_speedup_by_the_fma_peak() -> None:
    # At 200 GFLOP/s, 1 and 0.2 GFLOP take at least 5 and 1 ms: eager's 10 and 4 ms allow 2x and 4x.
    text = "\n".join(workload_tables(_workload_json([1.0, 0.2]), [], peak_gflops=200.0))
    assert "1.2 GFLOP" in text and "6 ms per pass" in text
    assert f"**{math.sqrt(2 * 4):.2f}x**" in text
    # "fast" ran 1.2 GFLOP in 6 ms (200 GFLOP/s, all of the peak) at 2x and 4x: the roof's speedup exactly.
    assert "| fast | 200 | 100% | 2.83x | 100% |" in text
    assert "| eager | 86 | 43% | 1.00x | 35% |" in text
    # Without a peak (a GPU suite, an old results.json) or without counts there is no roof.
    assert "Compute roof" not in "\n".join(workload_tables(_workload_json([1.0, 0.2]), [], peak_gflops=None))
    assert "Compute roof" not in "\n".join(workload_tables(_workload_json([]), [], peak_gflops=200.0))


def test_embed_in_docs_replaces_only_its_block(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Bench\n\nprose stays\n")
    embed_in_docs(doc, "cpu", "old ![p](plots/a.png)\n", Path("benchmarks/cpu"))
    embed_in_docs(doc, "gpu", "gpu table\n", Path("benchmarks/gpu"))
    embed_in_docs(doc, "cpu", "new ![p](plots/a.png)\n", Path("benchmarks/cpu"))
    text = doc.read_text()
    assert "prose stays" in text and "gpu table" in text and "old" not in text
    assert "new ![p](benchmarks/cpu/plots/a.png)" in text
    assert text.count("<!-- results:cpu -->") == 1


@pytest.mark.slow
def test_smoke_suite_runs_every_installed_system(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # Every adapter, once: the four inductor systems are one adapter with different options, and
    # each costs a minute or more of compilation on 2 cores, so CI runs one of them.
    chosen = [name for name in SYSTEMS if not name.startswith("inductor-") or name == "inductor-dynamic"]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "run", "--suite", "smoke", "--systems", ",".join(chosen), "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "results.md").read_text().startswith("## Suite `smoke`")
    (workload,) = results["workloads"]
    by_name = {s["system"]: s for s in workload["systems"]}
    assert set(by_name) == set(chosen)
    for name, s in by_name.items():
        missing = SYSTEMS[name].missing()
        if missing:  # not installed: skipped with the reason, never a crash
            assert s["status"] == "skipped" and "not installed" in s["reason"]
            continue
        assert s["status"] == "ok", (name, s["reason"])
        assert s["max_rel_err"] <= 1e-4, name
        assert len(s["median_ms"]) == 2 and all(t > 0 for t in s["median_ms"]), name
        assert s["first_result_s"] > 0 and s["stream_s"] >= s["first_result_s"], name
        if SYSTEMS[name].compiles:
            assert s["warm_start_s"] is not None and s["warm_start_s"] > 0, name
    assert by_name["disc"]["compilations"] == 1
    assert by_name["eager"]["compilations"] == 0
    assert by_name["disc"]["profile"]["kernels"]["library"] > 0
    assert results["machine"]["bandwidth"]["headline_gbs"] > 0
    assert results["machine"]["compute"]["peak_gflops"] > 0
    big, one_token = workload["gflop"]  # 2x16 tokens, then 1x1
    assert big > 16 * one_token > 0
    assert "Compute roof" in (tmp_path / "results.md").read_text()
    if "matplotlib" in results["meta"]["versions"] or not results["meta"]["plot_note"]:
        assert len(list((tmp_path / "plots").glob("*.png"))) == 3
