"""Counter-based random numbers: a value is a pure function of (seed, site, position).

``random_uniform(seed, *sizes)`` gives each element a float in [0, 1) from a
SplitMix64 mix of ``seed + (site + 1) * C1 + linear_index * C2`` (C2 is
SplitMix64's own increment, so positions of one site are consecutive states
of a SplitMix64 stream; C1 moves each site to its own stream). Nothing is
carried from one element to the next, so a kernel computes any element
anywhere, in any order, on any thread, and duplicating the op into several
kernels (dropout's output and its mask) gives the same numbers: it is a cheap
producer like ``iota``. The host draws ``seed`` from torch's generator per
call, so ``torch.manual_seed`` reproduces a run.

The reference below and the C++ ``disc_uniform`` compute the same bits
(64-bit wrap-around arithmetic; torch has no unsigned shift, hence the masks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from disc.ir.lazy_torch import torch
from disc.ir.registry import BROADCAST, ShapeContext, index_value, register, tensor
from disc.ir.types import Type

SITE_STEP = 0xD1B54A32D192ED03  # odd; separates the streams of different sites
STATE_STEP = 0x9E3779B97F4A7C15  # SplitMix64's increment (the golden ratio in 64 bits)
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB


def _rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    seed = tensor(types[0], "random_uniform", "seed")
    ctx.check(seed.dtype == "i64" and seed.shape == (1,), f"seed must be i64[1], got {seed}")
    return tuple(index_value(t, "random_uniform") for t in types[1:])


def site_offset(site: int) -> int:
    """What ``site`` adds to the seed, modulo 2**64 (the C++ kernel adds the same constant)."""
    return (site + 1) * SITE_STEP % (1 << 64)


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical (unsigned) right shift of int64 values."""
    return (z >> k) & ((1 << (64 - k)) - 1)


@register("random_uniform", "seed *sizes", attrs={"site": 0}, dtype=lambda types, attrs: "f32", shape=_rule, category=BROADCAST)
def random_uniform(seed: torch.Tensor, *sizes: int, site: int) -> torch.Tensor:
    """Uniform floats in [0, 1) of shape ``sizes``, a function of the seed, ``site`` and each position."""
    n = 1
    for s in sizes:
        n *= int(s)
    z = torch.arange(n, dtype=torch.int64) * _signed(STATE_STEP)
    z = z + _signed((int(seed.reshape(-1)[0]) + site_offset(site)) % (1 << 64))
    z = (z ^ _shr(z, 30)) * _signed(MIX1)
    z = (z ^ _shr(z, 27)) * _signed(MIX2)
    z = z ^ _shr(z, 31)
    return (_shr(z, 40).to(torch.float32) * 2.0**-24).reshape(tuple(int(s) for s in sizes))
