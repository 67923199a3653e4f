"""Shared test set-up: quiet, deterministic, the op registry loaded."""

import os

import torch

os.environ.setdefault("DISC_VERIFY", "1")
# Without a GPU, the Triton backend's tests run its kernels in Triton's interpreter on CPU tensors.
# Set before anything imports triton's JIT (the variable is read when a kernel is decorated).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
torch.manual_seed(0)
torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
