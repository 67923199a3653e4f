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


def test_a_view_whose_minus_one_divides_by_another_inputs_size_is_compiled() -> None:
    # Swin's window_reverse: windows.view(-1, h // w, ...) where the divisor is itself a size.
    # torch gives the -1 as FloorDiv(n*c, k*c), and a later op reads that size as a number; the
    # program computes it (the graph was left to PyTorch: the size had no value to read).
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        windows = x.view(-1, w.shape[0], x.shape[-1])
        return windows.sum(1) * windows.shape[0]

    torch._dynamo.reset()
    before = len(disc.reports())
    compiled = torch.compile(f, backend="disc", dynamic=True)
    for n, k, c in [(1, 1, 1), (6, 3, 5), (12, 4, 3), (10, 5, 1), (14, 7, 2)]:
        x, w = torch.randn(n, c), torch.randn(k)
        torch.testing.assert_close(compiled(x, w), f(x, w), msg=f"n={n} k={k} c={c}")
    new = disc.reports()[before:]
    assert new and all(r.graph.name != "not_compiled" and not r.fallbacks for r in new), [r.name for r in new]
    assert any(n.op == "ifloordiv" for r in new for n in r.graph.nodes)
