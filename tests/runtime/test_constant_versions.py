"""Weights read as constants, and changed in place after compilation.

Both entry points read an inference model's parameters and buffers as constants
(merged, shared when equal, packed for the GEMM library). A weight written in place
afterwards must not leave the program computing with the old values: the next call
compiles again, and the results follow eager at every step.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

import disc
from disc.api import reports


class Block(nn.Module):
    """Two GEMMs on weights the RAL packs, a LayerNorm whose weight and bias start equal to
    every other LayerNorm's (ones and zeros: CSE may share them), and a step-count buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(48, 96)
        self.norm = nn.LayerNorm(96)
        self.norm2 = nn.LayerNorm(96)
        self.down = nn.Linear(96, 24)
        self.register_buffer("shift", torch.zeros(24))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm2(self.norm(torch.nn.functional.gelu(self.up(x))))
        return self.down(h) + self.shift


def _model() -> Block:
    torch.manual_seed(0)
    return Block().eval()


def _close(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out - ref).abs().max() / ref.abs().max())


SHAPES = [(1, 1, 48), (3, 7, 48), (2, 17, 48)]


def _updates(model: Block) -> list:
    """In-place writes, each followed by calls at every shape: a whole new state, one element
    of a packed GEMM weight (likely missed by the RAL's sampled staleness check), the LayerNorm
    weights that were equal at compilation made different, and a buffer."""
    other = Block()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p))
    return [
        lambda: model.load_state_dict(other.state_dict()),
        lambda: model.up.weight[5, 7].add_(3.0),
        lambda: model.norm2.weight.mul_(torch.linspace(0.5, 2.0, 96)),
        lambda: model.shift.fill_(0.25),
    ]


class Messages(logging.Handler):
    """The disc logger's warnings, collected (the suite runs without pytest's logging plugin)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> Messages:
        logging.getLogger("disc").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("disc").removeHandler(self)


def _run_updates(model: Block, compiled) -> list[str]:
    """Calls at every shape after each update; the warnings about recompiling."""
    with torch.no_grad(), Messages() as messages:
        for update in [lambda: None, *_updates(model)]:
            update()
            for shape in SHAPES:
                x = torch.randn(*shape)
                err = _close(compiled(x), model(x))
                assert err < 1e-5, f"after an in-place update, shape {shape}: relative error {err:.1e}"
    return [m for m in messages.lines if "changed in place since compilation" in m]


def test_disc_compile_compiles_again_after_weights_change_in_place() -> None:
    model = _model()
    with torch.no_grad():
        compiled = disc.compile(model, (torch.randn(2, 5, 48),), dynamic={"x": {0: "b", 1: "s"}}, cache=False)
    assert len(_run_updates(model, compiled)) == 4  # one warning per update, not per call
    assert compiled.num_compilations == 5


def test_torch_compile_reads_inference_weights_as_constants_and_follows_changes() -> None:
    torch._dynamo.reset()
    model = _model()
    compiled = torch.compile(model, backend="disc", dynamic=True)
    before = len(reports())
    with torch.no_grad():
        compiled(torch.randn(2, 5, 48))
    (report,) = [r for r in reports()[before:] if r.source == "torch.compile"]
    # The weights are constants of the program, not inputs: only x is.
    assert [n.name for n in report.graph.inputs] == ["x"], [n.name for n in report.graph.inputs]
    shapes = {tuple(t.shape) for t in report.graph.constants.values()}
    assert {(96, 48), (24, 96), (96,), (24,)} <= shapes, shapes
    messages = _run_updates(model, compiled)
    assert len(messages) == 4, messages
    assert "up.weight" in messages[1], messages  # the module's own name for it


def test_torch_compile_keeps_a_buffer_the_forward_writes_as_an_input() -> None:
    """A running count written by forward must stay live state, not a constant."""

    class Counting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.register_buffer("calls", torch.zeros(8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls.add_(1)
            return self.fc(x) * self.calls

    torch._dynamo.reset()
    torch.manual_seed(0)
    model, ref = Counting().eval(), Counting().eval()
    ref.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="disc", dynamic=True)
    with torch.no_grad(), Messages() as messages:
        for n in (3, 1, 5, 2):
            x = torch.randn(n, 8)
            assert _close(compiled(x), ref(x)) < 1e-5
    assert torch.equal(model.calls, ref.calls)
    assert float(model.calls[0]) == 4.0
    assert not messages.lines  # its own write is no reason to compile again


def test_training_keeps_weights_as_inputs_and_never_recompiles_for_an_optimizer_step() -> None:
    torch._dynamo.reset()
    model = _model().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, backend="disc", dynamic=True)
    before = len(reports())
    for step in range(3):
        opt.zero_grad()
        compiled(torch.randn(2, 3 + step, 48)).square().mean().backward()
        opt.step()
    names = [r.name for r in reports()[before:]]
    assert len(names) == 2, names  # one forward, one backward
    forward = [r for r in reports()[before:] if "backward" not in r.name][0]
    assert len(forward.graph.inputs) >= 8, [n.name for n in forward.graph.inputs]  # x and the weights
