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


def test_an_as_strided_that_reorders_runs_in_pytorch_with_eagers_answer() -> None:
    # disc holds tensors contiguously: only a contiguous as_strided is a reshape it can do.
    def transpose_by_strides(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        return torch.as_strided(y, (y.shape[1], y.shape[0]), (1, y.shape[1])) + 1

    torch._dynamo.reset()
    before = len(disc.reports())
    compiled = torch.compile(transpose_by_strides, backend="disc", dynamic=True)
    for shape in [(3, 5), (1, 1), (4, 7)]:
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), transpose_by_strides(x))
    assert all(r.fallbacks == {"aten.as_strided.default": 1} for r in disc.reports()[before:])
