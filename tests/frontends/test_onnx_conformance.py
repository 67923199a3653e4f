"""ONNX's backend test suite in CI (``onnx_conformance.py`` runs it by hand and writes the report).

Every case must pass, or be refused with a clear ``CompileError`` before anything runs: a wrong
answer or any other exception fails here. The ok counts may only grow (they are what
docs/onnx-conformance.md reports; raise them when more passes).

Each slice then runs again in a process where ``import torch`` fails (the native program through
``disc_runtime``; the programs the first run built are in the build cache, so this costs no
compiles): every case that passed must pass again, or be refused because the native program
cannot hold one of its ops (with PyTorch that op ran in PyTorch between segments).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnx")
sys.path.insert(0, os.path.dirname(__file__))
from onnx_conformance import run  # noqa: E402

# (category, case names (regex), least ok): the node cases in four slices for the test workers.
SLICES = [
    ("node", r"^test_[a-c]", 654),
    ("node", r"^test_[d-k]", 238),
    ("node", r"^test_[l-r]", 612),
    ("node", r"^test_[s-z]", 293),
    ("simple", ".", 14),
    ("pytorch-converted", ".", 79),
    ("pytorch-operator", ".", 35),
    ("light models", ".", 9),
]


HERE = Path(__file__).resolve().parent
WITHOUT_TORCH = """
import json, sys
sys.modules["torch"] = None  # any `import torch` now fails
from onnx_conformance import run
o = run(sys.argv[1], sys.argv[2])
print(json.dumps({"ok": o.ok, "refused": o.refused, "wrong": o.wrong, "crash": o.crash}))
"""
NEEDS_TORCH = "the native CPU program cannot hold this graph"  # the refusal only a run without PyTorch gives


@pytest.mark.parametrize("category, names, least_ok", SLICES, ids=[f"{c}:{n}" for c, n, _ in SLICES])
def test_every_case_passes_or_is_refused_clearly(category: str, names: str, least_ok: int) -> None:
    outcome = run(category, names)
    assert not outcome.wrong, f"wrong answers: {outcome.wrong}"
    assert not outcome.crash, f"crashes (not a clear CompileError): {outcome.crash}"
    assert len(outcome.ok) >= least_ok, f"{len(outcome.ok)} ok, fewer than the {least_ok} recorded"

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), str(HERE)])}
    proc = subprocess.run([sys.executable, "-c", WITHOUT_TORCH, category, names], capture_output=True, text=True, env=env, timeout=1800, cwd=HERE)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    without = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not without["wrong"], f"wrong answers without torch: {without['wrong']}"
    assert not without["crash"], f"crashes without torch (not a clear CompileError): {without['crash']}"
    lost = {t: without["refused"].get(t, "not run") for t in outcome.ok if t not in without["ok"] and NEEDS_TORCH not in without["refused"].get(t, "")}
    assert not lost, f"ok with torch, not without it, for another reason than an op the native program cannot hold: {lost}"
