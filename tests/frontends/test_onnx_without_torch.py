"""The ONNX frontend where PyTorch is not installed: compile, run and save with numpy alone.

A process in which ``import torch`` fails runs the ONNX frontend's own tests (``test_onnx.py``,
against ONNX Runtime; the one that needs torch skips); ONNX's backend test suite runs so in
``test_onnx_conformance.py``, slice by slice, after each slice's run with torch. Without
PyTorch a model compiles to the native CPU program and runs through ``disc_runtime``; an op the
native program cannot hold is refused with a ``CompileError`` (with PyTorch it would run in
PyTorch between compiled segments), so fewer cases pass than with PyTorch, but never a wrong
answer or a crash.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NO_TORCH = "import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError


def _python(code: str, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE)])}
    return subprocess.run([sys.executable, "-c", NO_TORCH + code], capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)


def test_the_onnx_frontend_tests_pass_without_torch() -> None:
    # --noconftest: tests/conftest.py is the PyTorch suite's (it imports torch).
    code = "import pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--noconftest', 'tests/frontends/test_onnx.py']))"
    proc = _python(code, timeout=900)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "68 passed, 1 skipped" in summary, summary  # the skipped one gives torch tensors in


def test_a_program_compiled_without_torch_names_its_runtime_and_refuses_other_backends(tmp_path: Path) -> None:
    code = f"""
import numpy as np, disc_runtime, disc.onnx
from test_onnx import encoder_layer, _text_inputs
from disc.errors import CompileError
prog = disc.onnx.compile(encoder_layer())
print(prog.report.backend.name, type(prog.runner).__name__)
x, mask = _text_inputs(np.random.default_rng(0), 1, 1)
want = prog(x, mask)
folder = prog.save({str(tmp_path / "enc")!r})
got = disc_runtime.load(folder).run(x, mask)
print(all(np.array_equal(a, b) for a, b in zip(got, want)))
try:
    disc.onnx.compile(encoder_layer(), backend="reference")
except CompileError as e:
    print("refused:", e)
assert sys.modules.get("torch") is None
"""
    proc = _python(code, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "native-cpu StandaloneRunner"
    assert lines[1] == "True"
    assert lines[2].startswith("refused: backend='reference' needs PyTorch, which is not installed here")
    manifest = json.loads((tmp_path / "enc" / "manifest.json").read_text())
    assert manifest["backend"] == "native-cpu" and "out_spec" not in manifest

