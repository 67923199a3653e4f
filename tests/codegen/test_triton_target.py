"""Generated Triton kernels compile for a real GPU, checked on a CPU (``disc.runtime.triton_target``).

The interpreter the other Triton tests run in broadcasts what the compiler refuses, so kernels
that were right there failed to compile on an H200. Here the kernels of those cases are
compiled for an H100 (``cuda:90``) in a process without the interpreter, and a kernel the
compiler refuses is shown to fail the check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

import disc  # noqa: E402
from disc.runtime.triton_runtime import build_triton, interpreting  # noqa: E402
from disc.runtime.triton_target import log_forms  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreting(), reason="on a GPU every kernel is compiled before its first call")


def _check(log: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DISC_TRITON_FORMS_LOG")}
    return subprocess.run([sys.executable, "-m", "disc.runtime.triton_target", str(log)], env=env, capture_output=True, text=True, timeout=600)


def test_kernels_that_failed_on_a_gpu_compile(tmp_path):
    from test_triton import LastElement, StatisticsOfOneRow, SumOverAUnitDim

    log = tmp_path / "forms.jsonl"
    cases = [(StatisticsOfOneRow(), (1, 8), {"x": {1: "s"}}), (SumOverAUnitDim(), (5, 1), {"x": {0: "b"}}), (LastElement(), (7,), {"x": {0: "n"}})]
    for model, shape, dynamic in cases:
        cm = disc.compile(model, (torch.randn(shape),), dynamic=dynamic, backend="reference")
        build = build_triton(cm.graph)
        log_forms(str(log), build.path, build.source)
    done = _check(log)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 failed" in done.stdout


BAD_PROGRAM = """
import triton
import triton.language as tl


@triton.jit
def scalar_pointer(out0, in0, d0, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < 1
    tl.store(out0 + offs, tl.load(in0 + d0, mask=mask, other=0), mask=mask)
"""


def test_a_kernel_the_compiler_refuses_fails_the_check(tmp_path):
    program = tmp_path / "bad.py"
    program.write_text(BAD_PROGRAM)
    form = {"function": "scalar_pointer", "pointers": ["*fp32", "*fp32"], "dims": 1, "constexprs": {"BLOCK": 128}, "num_warps": 1}
    log = tmp_path / "forms.jsonl"
    log.write_text(json.dumps({"path": str(program), "forms": [form]}) + "\n")
    done = _check(log)
    assert done.returncode == 1
    assert "Mask argument cannot be block type if pointer argument is not a block" in done.stderr
