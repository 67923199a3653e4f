"""Activations, pointwise math and other single ops torch.export keeps, lowered by disc
(lowering_pointwise.py, and norms, stack, glu, ... in lowering_nn.py and lowering_composite.py).

Each op is compiled once with dynamic dims and compared with eager at several shapes, 1-sized
and odd ones included, on inputs that reach the branches and tails of its formula (large
magnitudes for softplus, mish and log-sigmoid; zeros and negatives for trunc and frac). It
must run wholly in disc: no fallback, no decomposition re-trace.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import disc

OPS = {
    "hardtanh": lambda x, y: F.hardtanh(x, -0.5, 2.0),
    "relu6": lambda x, y: F.relu6(x),
    "hardsigmoid": lambda x, y: F.hardsigmoid(x),
    "hardswish": lambda x, y: F.hardswish(x),
    "leaky_relu": lambda x, y: F.leaky_relu(x, 0.2),
    "elu": lambda x, y: F.elu(x, 0.7),
    "selu": lambda x, y: F.selu(x),
    "celu": lambda x, y: F.celu(x, 1.5),
    "softplus": lambda x, y: F.softplus(x) + F.softplus(x, beta=2.0, threshold=5.0),
    "mish": lambda x, y: F.mish(x),
    "log_sigmoid": lambda x, y: F.logsigmoid(x),
    "square": lambda x, y: torch.square(x),
    "exp2": lambda x, y: torch.exp2(x.clamp(-60, 60)),
    "trunc": lambda x, y: torch.trunc(x),
    # float division with a rounding mode (the trunc mode once came back unrounded: 4.8 for 4)
    "div_rounding": lambda x, y: (torch.div(x, y, rounding_mode="trunc"), torch.div(x, y, rounding_mode="floor"), torch.div(x, 2.5, rounding_mode="trunc")),
    "frac": lambda x, y: torch.frac(x),
    "lerp": lambda x, y: torch.lerp(x, y, 0.3) + torch.lerp(x, y, 0.8) + torch.lerp(x, y, y.sigmoid()),
    "addcmul": lambda x, y: torch.addcmul(x, x, y, value=0.5),
    "addcdiv": lambda x, y: torch.addcdiv(x, x, y.abs() + 1, value=-2),
    "logs": lambda x, y: torch.log2(x) + torch.log10(x.abs()) + torch.log2(y.abs()),
    "trig": lambda x, y: (torch.tan(y), torch.atan(x), torch.asin(y / 3), torch.acos(x / 8)),
    "hyperbolic": lambda x, y: (torch.sinh(y), torch.cosh(x / 4), torch.asinh(x), torch.acosh(x.abs() + 1), torch.atanh(y / 4)),
    "isinf": lambda x, y: (torch.isinf(x / y), torch.isinf(x.long()), torch.isinf(x * 1e38) & ~torch.isnan(y)),
}


class Pointwise(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x, y):
        return self.fn(x, y)


def _inputs(b: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, n, 3, generator=g) * 4
    x.view(-1)[::5] = torch.tensor([0.0, -0.0, 30.0, -30.0, 2.5, -2.5])[torch.arange(len(x.view(-1)[::5])) % 6]
    return x, torch.randn(b, n, 3, generator=g)


def _check_runs_in_disc(fn, atol: float) -> None:
    model = Pointwise(fn)
    dynamic = {"x": {0: "b", 1: "n"}, "y": {0: "b", 1: "n"}}
    cm = disc.compile(model, _inputs(2, 5, 0), dynamic=dynamic)
    assert cm.report.decomposed_because is None
    assert not cm.report.fallbacks
    for seed, (b, n) in enumerate([(2, 5), (1, 1), (3, 7), (1, 64)]):
        x, y = _inputs(b, n, seed)
        with torch.no_grad():
            torch.testing.assert_close(cm(x, y), model(x, y), rtol=1e-5, atol=atol, equal_nan=True)  # std of one value


@pytest.mark.parametrize("name", sorted(OPS))
def test_pointwise_op_runs_in_disc_and_matches_eager(name):
    _check_runs_in_disc(OPS[name], atol=1e-6)


def test_a_core_op_without_a_lowering_runs_in_pytorch_without_a_re_trace():
    """sort is core ATen: torch's decomposition leaves it as it is, so it is not attempted."""
    model = Pointwise(lambda x, y: torch.sort(x.abs() + 1, dim=-1).values * y)
    cm = disc.compile(model, _inputs(2, 5, 0), dynamic={"x": {0: "b", 1: "n"}, "y": {0: "b", 1: "n"}})
    assert cm.report.decomposed_because is None
    assert cm.report.fallbacks == {"aten.sort.default": 1}
    for b, n in [(2, 5), (1, 1), (3, 7)]:
        x, y = _inputs(b, n, 1)
        with torch.no_grad():
            torch.testing.assert_close(cm(x, y), model(x, y))


# Reductions, normalisations and reshuffles torch.export keeps as single ops.
COMPOSITES = {
    "vector_norm": lambda x, y: torch.linalg.vector_norm(x, dim=-1) + torch.linalg.vector_norm(y, ord=1, dim=(0, 2), keepdim=True).sum(),
    "vector_norm_ords": lambda x, y: torch.linalg.vector_norm(x, ord=float("inf"), dim=1) + torch.linalg.vector_norm(x, ord=3, dim=1) + torch.linalg.vector_norm(x, ord=0, dim=1),
    "normalize": lambda x, y: F.normalize(x, dim=-1) + F.normalize(y, dim=1),
    "std": lambda x, y: (x.std(-1), y.std(dim=1, keepdim=True), x.std(dim=(0, 1), correction=0)),
    "logsumexp": lambda x, y: (x.logsumexp(-1), torch.logsumexp(y, dim=(0, 1), keepdim=True), (x * 1e30).logsumexp(1)),
    # round's decimals were dropped (plain round: wrong by up to 0.5 with no error)
    "round_decimals": lambda x, y: ((x * 300).round(decimals=2), (y * 3000).round(decimals=-2), x.round(decimals=0)),
    # A 0-d tensor's dim 0 (or -1) is the tensor itself: these reduce nothing (was a codegen crash).
    "reduce_0d": lambda x, y: (x.sum().logsumexp(0), y.amax().sum(-1, keepdim=True), torch.softmax(x.mean(), 0), y.sum().mean(dim=(0,))),
    "rms_norm": lambda x, y: F.rms_norm(x, (3,)) + F.rms_norm(y, (3,), y[0, 0], eps=1e-3),
    "group_norm": lambda x, y: (F.group_norm(x.transpose(1, 2), 1, y[0, 0], y[0, 0] * 0.1), F.group_norm(torch.cat([x, y], -1).transpose(1, 2), 2)),
    "stack": lambda x, y: (torch.stack([x, y, x * y], dim=1), torch.stack([y], dim=-1)),
    "movedim": lambda x, y: (x.movedim(2, 0) + 1, y.movedim(0, -1) * 2),
    "narrow": lambda x, y: x.narrow(2, 1, 2) + y.narrow(-1, -2, 2),
    "expand_as": lambda x, y: x[:, :1].expand_as(y) * y,
    "view_as": lambda x, y: (x * 2).flatten(1).view_as(y) + y,
    "repeat": lambda x, y: (x.repeat(1, 2, 3), y.repeat(2, 1, 1, 2)),
    "upsample_nearest": lambda x, y: (F.interpolate(x[:, None], scale_factor=2.0), F.interpolate(x.transpose(1, 2)[:, :, None], scale_factor=(3, 1))),
    "resize_nearest": lambda x, y: (
        F.interpolate(x[:, None], size=(y.shape[0] * 3, 5)),  # a size from a dynamic dim: up or down
        F.interpolate(x[:, None], size=(1, 1)),
        F.interpolate(x[:, None], size=y.shape[1:]),  # the same size: every row its own source
    ),
    "flip": lambda x, y: (x.flip(-1), y.flip(0, 1) * 2),
    "glu": lambda x, y: F.glu(torch.cat([x, y, x, y], -1), -1) + F.glu(torch.cat([x, y], -1), dim=-1).sum(-1, keepdim=True),
}


@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_composite_op_runs_in_disc_and_matches_eager(name):
    _check_runs_in_disc(COMPOSITES[name], atol=1e-5)


def test_an_op_torch_expands_itself_still_goes_through_decomposition():
    """cosine_similarity has no lowering but is CompositeImplicitAutograd: the re-trace expands it
    into ops disc lowers, so the program is decomposed rather than left to PyTorch."""
    model = Pointwise(lambda x, y: F.cosine_similarity(x, y, dim=-1))
    cm = disc.compile(model, _inputs(2, 5, 0), dynamic={"x": {0: "b", 1: "n"}, "y": {0: "b", 1: "n"}})
    assert "cosine_similarity" in (cm.report.decomposed_because or "")
    assert not cm.report.fallbacks
    for b, n in [(2, 5), (1, 1), (3, 7)]:
        x, y = _inputs(b, n, 2)
        with torch.no_grad():
            torch.testing.assert_close(cm(x, y), model(x, y))


class TopDown(nn.Module):
    """An FPN's top-down step: the coarser map resized to the finer one's size, then added."""

    def forward(self, top, lateral):
        return F.interpolate(top, size=lateral.shape[-2:], mode="nearest") + lateral


def test_nearest_resize_to_another_tensors_size_matches_eager_exactly():
    model = TopDown()
    dynamic = {"top": {0: "b", 2: "h", 3: "w"}, "lateral": {0: "b", 2: "H", 3: "W"}}
    cm = disc.compile(model, (torch.randn(1, 4, 3, 5), torch.randn(1, 4, 6, 9)), dynamic=dynamic)
    assert not cm.report.fallbacks and cm.report.decomposed_because is None
    # twice, odd ratios, 1-sized, and smaller than the top map (PyTorch then skips rows)
    for b, h, w, big_h, big_w in [(1, 3, 5, 6, 9), (2, 1, 1, 1, 1), (1, 7, 3, 5, 11), (3, 4, 4, 13, 17), (1, 10, 9, 3, 2)]:
        top, lateral = torch.randn(b, 4, h, w), torch.randn(b, 4, big_h, big_w)
        with torch.no_grad():
            assert torch.equal(cm(top, lateral), model(top, lateral)), (b, h, w, big_h, big_w)


class Diagonals(nn.Module):
    def forward(self, x, y):
        return x.diagonal(), torch.diagonal(x, 1), torch.diagonal(x, -2), torch.diagonal(y, 0, 1, 2) * 2, torch.diagonal(y, 3, -1, 0)


def test_diagonal_is_a_gather_of_the_right_length_at_every_offset_and_shape():
    """The diagonal's length, max(0, min(rows, cols - offset)), may be 0 or (below the main
    diagonal) negative before the clamp: min's bounds must not be assumed non-negative."""
    model = Diagonals()
    cm = disc.compile(model, (torch.randn(5, 7), torch.randn(3, 4, 6)), dynamic={"x": {0: "n", 1: "m"}, "y": {0: "b", 2: "k"}})
    assert not cm.report.fallbacks and cm.report.decomposed_because is None
    for n, m, b, k in [(5, 7, 3, 6), (1, 1, 1, 1), (4, 2, 2, 9), (9, 3, 5, 2), (2, 2, 1, 3), (0, 3, 1, 1)]:
        x, y = torch.randn(n, m), torch.randn(b, 4, k)
        with torch.no_grad():
            got, want = cm(x, y), model(x, y)
        assert [g.shape for g in got] == [w.shape for w in want]
        assert all(torch.equal(g, w) for g, w in zip(got, want)), (n, m, b, k)
