"""The GPU benchmark's code runs before a GPU is lent: every part at tiny sizes on the CPU.

Device time is scarce (minutes per task, when a GPU is lent at all): a benchmark that crashes
there wastes it. ``--device cpu --tiny`` runs the same code paths (Hugging Face BERT's stream
from size-1 shapes, the Llama decoder's prefill and growing-cache decode, the bandwidth cases),
and each system's answers are checked against eager here.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from benchmarks import gpu  # noqa: E402


def test_every_part_runs_on_the_cpu_and_matches_eager(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu, "CALLS", 2)
    argv = ["--device", "cpu", "--tiny", "--parts", "stream,decode,bandwidth", "--model", "hf-bert", "--systems", "eager,disc,disc-plugin"]
    assert gpu.main([*argv, "--rounds", "1", "--mb", "0.25", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "results.json").read_text())
    table = (tmp_path / "results.md").read_text()

    stream = report["stream"]
    assert [(r["batch"], r["seq"]) for r in stream["rows"]] == gpu.TINY_STREAM
    assert stream["compilations"]["disc"] == 1
    for r in stream["rows"]:
        assert r["err"]["disc"] < 1e-5 and r["err"]["disc-plugin"] < 1e-5, r
        assert all(ms > 0 for ms in r["ms"].values())
    assert stream["disc"]["kernels_per_layer"] > 0 and stream["disc"]["library_calls_per_layer"] > 0

    decode = report["decode"]
    assert [r["prompt"] for r in decode["prefill"]] == gpu.TINY_PREFILL
    assert [(r["batch"], r["prompt"], r["steps"]) for r in decode["decode"]] == gpu.TINY_GENERATIONS
    assert decode["compilations"]["disc"] == 1  # prefill with an empty cache and every decode step: one program
    for r in decode["prefill"] + decode["decode"]:
        assert r["err"]["disc"] < 1e-5 and r["err"]["disc-plugin"] < 1e-5, r
    assert {"disc vs eager", "disc-plugin vs eager"} <= set(decode["geomean"]["decode"])

    assert {r["kernel"] for r in report["bandwidth"]} == {"add+LayerNorm", "masked softmax", "bias+GELU"}
    assert all(r["err"] < 1e-5 and r["disc_gbs"] > 0 for r in report["bandwidth"])
    for heading in ("Hugging Face BertModel", "Llama-style decoder", "| decode, batch x prompt + steps |", "| 0.25 MB | f32 | bias+GELU |"):
        assert heading in table


def test_a_cuda_run_without_a_gpu_says_how_to_dry_run(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert gpu.main(["--parts", "stream"]) == 2
    assert "--device cpu --tiny" in capsys.readouterr().out
