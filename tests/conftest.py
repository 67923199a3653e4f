"""Shared test set-up: quiet, deterministic, the op registry loaded."""

import os

import torch

os.environ.setdefault("DISC_VERIFY", "1")
torch.manual_seed(0)
torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
