"""Shared test set-up: quiet, deterministic, the op registry loaded."""

import os
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
