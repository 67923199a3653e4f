"""Deterministic construction shared by the model factories."""

from __future__ import annotations

from typing import Any, TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


def build_seeded(cls: type[M], config: Any, seed: int) -> M:
    """``cls(config)`` with weights drawn from ``seed``, in eval mode; the global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    return model.eval()
