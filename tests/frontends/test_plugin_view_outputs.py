"""Plug-in mode, a graph returning views of its inputs (``chunk``, ``expand``, ``t``): AOTAutograd
rebuilds such outputs from the argument with the strides of what the backend returns, so each
must come back as the very view eager makes. A fresh contiguous result was read at the wrong
places (chunk: wrong values, no error) or past the argument's storage (expand: a crash)."""

import pytest
import torch

import disc


def views(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    a, b = x.chunk(2, -1)
    return a, b * 2, x.expand(3, *x.shape), x.t(), x[1:, ::2]


@pytest.mark.parametrize("train", [False, True], ids=["infer", "train"])
def test_views_of_inputs_come_back_as_eagers_views(train: bool) -> None:
    torch._dynamo.reset()
    before = len(disc.reports())
    compiled = torch.compile(views, backend="disc", dynamic=True)
    for shape in [(4, 6), (1, 2), (5, 4), (2, 8), (3, 3)]:
        x = torch.randn(shape, requires_grad=train)
        got, want = compiled(x), views(x)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, msg=f"at {shape}")
            assert g.stride() == w.stride(), f"{g.stride()} against eager {w.stride()} at {shape}"
        if train:
            weights = [torch.randn(w.shape) for w in want]
            (gx,) = torch.autograd.grad(sum((g * r).sum() for g, r in zip(got, weights)), x)
            (wx,) = torch.autograd.grad(sum((w * r).sum() for w, r in zip(want, weights)), x)
            torch.testing.assert_close(gx, wx, msg=f"gradient at {shape}")
    new = disc.reports()[before:]
    assert new and all(r.graph.name != "not_compiled" for r in new), [r.name for r in new]
