"""The six model families through disc.compile and torch.compile(backend="disc").

Each runs over its whole shape stream (>= 10 shapes, 1-sized dims included)
against PyTorch eager, and must compile exactly once.
"""

from __future__ import annotations

import pytest
import torch

import disc
from disc.models import MODELS

FAMILIES = ["bert", "gpt2", "t5", "llama", "vit", "resnet"]
RTOL = 1e-5


def _max_rel_err(out, ref) -> float:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    assert len(outs) == len(refs)
    worst = 0.0
    for o, r in zip(outs, refs):
        assert o.shape == r.shape, f"shape {tuple(o.shape)} != eager {tuple(r.shape)}"
        assert o.dtype == r.dtype
        scale = max(r.abs().max().item(), 1e-6)
        worst = max(worst, (o - r).abs().max().item() / scale)
    return worst


@pytest.mark.parametrize("family", FAMILIES)
def test_disc_compile_family(family: str) -> None:
    entry = MODELS[family]
    model = entry.factory()
    # Compile at the first listed shape, which has 1-sized dims: nothing may specialise on them.
    first = entry.shapes[0]
    cm = disc.compile(model, entry.inputs(first), dynamic=entry.dynamic)
    assert not cm.report.fallbacks, f"unexpected fallbacks: {cm.report.fallbacks}"
    for shape in entry.shapes:
        args = entry.inputs(shape, seed=1)
        with torch.no_grad():
            ref = model(*args)
        err = _max_rel_err(cm(*args), ref)
        assert err <= RTOL, f"{family} at {dict(shape)}: max rel err {err:.2e}"
    assert cm.num_compilations == 1
    assert cm.report.calls == len(entry.shapes)


# torch.compile: dynamo decides guards before disc sees the graph. A size seen as 1
# on the *first* call becomes a constant (dynamo's 0/1 specialisation, which no
# backend can undo), so the stream starts at the entry's export shape, which has
# no 1s; disc then drops dynamo's [2, inf) range assumption, so later 1-sized dims
# (batch 1, 1x1 images whose feature maps shrink to 1) reuse the graph. The image
# export shapes have batch 3 = RGB channels: with dynamo's duck sizing that pinned
# the batch to 3, which importing disc turns off.


@pytest.mark.parametrize("family", FAMILIES)
def test_torch_compile_family(family: str) -> None:
    entry = MODELS[family]
    model = entry.factory()
    torch._dynamo.reset()
    before = len([r for r in disc.reports() if r.source == "torch.compile"])
    opt = torch.compile(model, backend="disc", dynamic=True)
    shapes = [entry.export_shape] + list(entry.shapes)
    for shape in shapes:
        args = entry.inputs(shape, seed=2)
        with torch.no_grad():
            ref = model(*args)
            out = opt(*args)
        err = _max_rel_err(out, ref)
        assert err <= RTOL, f"{family} at {dict(shape)}: max rel err {err:.2e}"
    new = [r for r in disc.reports() if r.source == "torch.compile"][before:]
    assert all(r.graph.name != "not_compiled" for r in new), [r.name for r in new]
    assert all(not r.fallbacks for r in new), [r.fallbacks for r in new]
    assert len(new) == 1, f"{len(new)} compilations over {len(shapes)} shapes"


def test_torch_compile_equal_first_dims_stay_apart() -> None:
    # First call with batch == seq: without duck sizing they get separate symbols,
    # so a later call with batch != seq reuses the graph.
    entry = MODELS["bert"]
    model = entry.factory()
    torch._dynamo.reset()
    before = len([r for r in disc.reports() if r.source == "torch.compile"])
    opt = torch.compile(model, backend="disc", dynamic=True)
    for shape in ({"batch": 5, "seq": 5}, {"batch": 2, "seq": 9}, {"batch": 7, "seq": 3}, {"batch": 1, "seq": 1}):
        args = entry.inputs(shape, seed=3)
        with torch.no_grad():
            err = _max_rel_err(opt(*args), model(*args))
        assert err <= RTOL, f"at {shape}: max rel err {err:.2e}"
    new = [r for r in disc.reports() if r.source == "torch.compile"][before:]
    assert len(new) == 1, [r.name for r in new]
