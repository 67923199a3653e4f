"""A call must leave no reference cycles behind that hold tensors.

Tensors in a cycle live until Python's cycle collector happens to run: every call's outputs
(and inputs) piled up, the heap grew by tens of MB over a few hundred calls and stayed
fragmented after the collector freed them. Reference counting alone must free them.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import disc


class Passthrough(nn.Module):
    """An output that is a buffer, one that is an input, and one repeated (every output kind)."""

    def forward(self, x):
        y = torch.relu(x) * 2 + 1
        return y, x, y


class Select(nn.Module):
    """A data-dependent selection: native segments around a PyTorch op."""

    def forward(self, x):
        y = torch.relu(x) * 2
        keep = y[0, :, 0] > 0.5
        return (y[:, keep] + 1).sum(-1)


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return nn.functional.gelu(self.fc(x)).softmax(-1)


def _tensors_left_in_cycles(call: Callable[[], Any], calls: int = 4) -> list[str]:
    call()  # warm-up: first-call caches are not garbage
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(calls):
            call()
        gc.collect()
        # Real tensors only: fake and meta tensors that an earlier torch.export left for the
        # collector can become garbage during these calls, and they hold no memory.
        return [f"Tensor{tuple(o.shape)}" for o in gc.garbage if type(o) is torch.Tensor and o.device.type != "meta"]
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.enable()


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("model_cls", [Passthrough, Select, Mlp])
def test_disc_compile_calls_leave_no_tensors_in_cycles(model_cls: type[nn.Module], backend: str) -> None:
    x = torch.randn(2, 7, 8)
    cm = disc.compile(model_cls(), (x,), dynamic={"x": {1: "n"}}, backend=backend)
    assert _tensors_left_in_cycles(lambda: cm(x)) == []


def test_the_native_outputs_are_freed_by_reference_counting() -> None:
    # The case that leaked: resolve_outputs was a closure that called itself.
    x = torch.randn(3, 5, 8)
    cm = disc.compile(Passthrough(), (x,), dynamic={"x": {1: "n"}})
    assert type(cm.executor).__name__ == "NativeExecutor"
    gc.disable()
    try:
        outs = cm(x)
        written = weakref.ref(outs[0])
        del outs
        assert written() is None  # freed at once, without the cycle collector
    finally:
        gc.enable()


def test_torch_compile_calls_leave_no_tensors_in_cycles() -> None:
    torch._dynamo.reset()
    model = Mlp()
    compiled = torch.compile(model, backend="disc", dynamic=True)
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        assert _tensors_left_in_cycles(lambda: compiled(x)) == []
