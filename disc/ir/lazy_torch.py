"""PyTorch for the IR's reference semantics, imported when a reference first runs.

The op registry's reference functions (what the reference executor runs and constant folding
evaluates) are written with torch. The IR, the passes, fusion and code generation never run
them on their own, so they import where torch is not installed; running a reference there is
an ImportError that says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class _LazyTorch:
    """Stands for the ``torch`` module: the first attribute read imports it."""

    def __getattr__(self, name: str) -> Any:
        try:
            import torch
        except ImportError as e:
            raise ImportError("the IR's reference semantics (the reference executor, constant folding) run on PyTorch, which is not installed here") from e
        value = getattr(torch, name)
        object.__setattr__(self, name, value)  # later reads skip __getattr__
        return value


torch: Any = _LazyTorch()


def deferred(path: str) -> Callable[..., Any]:
    """``torch.<path>`` (e.g. "nn.functional.silu"), looked up at its first call."""

    def call(*args: Any, **kwargs: Any) -> Any:
        fn: Any = torch
        for part in path.split("."):
            fn = getattr(fn, part)
        return fn(*args, **kwargs)

    call.__name__ = call.__qualname__ = path.rsplit(".", 1)[-1]
    return call
