"""ONNX's backend test suite in CI (``onnx_conformance.py`` runs it by hand and writes the report).

Every case must pass, or be refused with a clear ``CompileError`` before anything runs: a wrong
answer or any other exception fails here. The ok counts may only grow (they are what
docs/onnx-conformance.md reports; raise them when more passes).
"""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("onnx")
sys.path.insert(0, os.path.dirname(__file__))
from onnx_conformance import run  # noqa: E402

# (category, case names (regex), least ok): the node cases in four slices for the test workers.
SLICES = [
    ("node", r"^test_[a-c]", 152),
    ("node", r"^test_[d-k]", 109),
    ("node", r"^test_[l-r]", 213),
    ("node", r"^test_[s-z]", 106),
    ("simple", ".", 2),
    ("pytorch-converted", ".", 75),
    ("pytorch-operator", ".", 33),
    ("light models", ".", 9),
]


@pytest.mark.parametrize("category, names, least_ok", SLICES, ids=[f"{c}:{n}" for c, n, _ in SLICES])
def test_every_case_passes_or_is_refused_clearly(category: str, names: str, least_ok: int) -> None:
    outcome = run(category, names)
    assert not outcome.wrong, f"wrong answers: {outcome.wrong}"
    assert not outcome.crash, f"crashes (not a clear CompileError): {outcome.crash}"
    assert len(outcome.ok) >= least_ok, f"{len(outcome.ok)} ok, fewer than the {least_ok} recorded"
