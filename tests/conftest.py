"""Shared test set-up: quiet, deterministic, the op registry loaded."""

import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable

import pytest
import torch

os.environ.setdefault("DISC_VERIFY", "1")
# Each test compiles what it tests: a program stored by an earlier run (or test) would skip the
# capture and passes under test. tests/runtime/test_program_cache.py turns the cache on.
os.environ.setdefault("DISC_PROGRAM_CACHE", "0")
# Without a GPU, the Triton backend's tests run its kernels in Triton's interpreter on CPU tensors.
# Set before anything imports triton's JIT (the variable is read when a kernel is decorated).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# On a GPU, eager and disc's library calls compare in full fp32: cuDNN's default TF32 convolutions
# round differently for different algorithms and layouts (~3e-4 apart on ResNet and ViT).
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.manual_seed(0)
torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


def _checks_triton_target(config) -> bool:
    """Does this session compile the interpreter's kernels for a real GPU at its end? The
    controller does (not xdist's workers), when kernels run in the interpreter and Triton is
    installed; DISC_TRITON_TARGET_CHECK=0 turns it off for a quick local run."""
    if hasattr(config, "workerinput") or os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return False
    if os.environ.get("DISC_TRITON_TARGET_CHECK", "1") == "0":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def pytest_configure(config) -> None:
    # The interpreter accepts kernels the compiler refuses: every form the tests generate is
    # logged (the workers inherit the variable) and compiled for an H100 at the end
    # (disc/runtime/triton_target.py).
    if _checks_triton_target(config):
        fd, log = tempfile.mkstemp(prefix="disc-triton-forms-", suffix=".jsonl")
        os.close(fd)
        os.environ["DISC_TRITON_FORMS_LOG"] = config._disc_forms_log = log


def pytest_sessionfinish(session, exitstatus) -> None:
    log = getattr(session.config, "_disc_forms_log", None)
    if not log or not os.path.exists(log):
        return
    if not os.path.getsize(log):  # no Triton program was built
        os.unlink(log)
        return
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DISC_TRITON_FORMS_LOG")}
    done = subprocess.run([sys.executable, "-m", "disc.runtime.triton_target", log], env=env, capture_output=True, text=True)
    report = session.config.pluginmanager.get_plugin("terminalreporter")
    text = (done.stdout + done.stderr).strip()
    if report is not None:
        report.ensure_newline()
        report.write_sep("-", "Triton kernels compiled for a GPU target (disc/runtime/triton_target.py)")
        report.write_line(text[-20000:])
    if done.returncode != 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    os.unlink(log)


def _run_in_threads(work: Callable[[int], None], n: int) -> None:
    """``work(k)`` for k in range(n), each on a thread of its own, all at once; the first exception
    a thread raised is raised here (a thread's own exception would otherwise vanish)."""
    failures: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            work(k)
        except BaseException as e:  # noqa: BLE001 (raised below, in the test's thread)
            failures.append(e)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]


@pytest.fixture
def run_in_threads() -> Callable[[Callable[[int], None], int], None]:
    return _run_in_threads
