"""Plug-in mode with Python ints as arguments: dynamo passes them as symbolic ints, which a disc
program takes as sizes. A negative one (an arange's start, a roll's shift) must still give
eager's answer: that call runs the graph in PyTorch."""

import torch

import disc


def test_negative_int_arguments_give_eagers_answer() -> None:
    def f(x: torch.Tensor, start: int, end: int) -> torch.Tensor:
        return torch.arange(start, end, dtype=torch.float32) * x.sum()

    torch._dynamo.reset()
    before = len(disc.reports())
    compiled = torch.compile(f, backend="disc", dynamic=True)
    for start, end in [(-1, 0), (2, 9), (-5, 3), (0, 4), (3, 3), (4, 11)]:
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x, start, end), f(x, start, end), msg=f"arange({start}, {end})")
    new = disc.reports()[before:]
    assert new and all(r.graph.name != "not_compiled" for r in new), [r.name for r in new]
