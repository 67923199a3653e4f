"""``host_call``: an op disc does not lower, run by the host framework between compiled code.

The IR names no framework: ``host`` says which one runs the call ("torch" for the PyTorch
frontend's fallbacks) and ``call`` is a key into that frontend's own table of calls (the torch
importer's ``fallbacks``: an ATen operator and its arguments), which the executor is handed
with the graph. ``target`` (the operator's name) and ``reason`` are for the explain report. The
result type comes from the frontend (torch's shape propagation at import time; data-dependent
dims are fresh symbols).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from disc.ir.lazy_torch import torch
from disc.ir.registry import BROADCAST, SOURCE, ShapeContext, register
from disc.ir.types import Type, torch_dtype
from disc.shape.expr import parse_expr, simplify_dim


def _fallback_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    return tuple(simplify_dim(parse_expr(d)) for d in attrs["shape"])


@register(
    "host_call",
    "*operands",
    attrs={"host": "torch", "call": "", "target": "", "reason": "", "dtype": "f32", "shape": ()},
    dtype=lambda types, attrs: attrs["dtype"],
    shape=_fallback_rule,
    category=SOURCE,
)
def host_call(*operands: Any, call: Any, results: dict | None = None, **_: Any) -> Any:
    """Calls ``call`` (resolved by the executor from the frontend's table) on the operands.

    ``results`` (one dict per execution) lets the outputs of one multi-output op
    come from a single call: dropout's result and its mask must be one draw.
    """
    return call.call(operands) if results is None else call.call(operands, results)


def _index_to_tensor_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    return ()


@register("index_to_tensor", "n", attrs={"dtype": "i64"}, dtype=lambda types, attrs: attrs["dtype"], shape=_index_to_tensor_rule, category=BROADCAST)
def index_to_tensor(n: int, *, dtype: str) -> torch.Tensor:
    """A shape value used as data (e.g. the element count that a mean divides by)."""
    return torch.tensor(n, dtype=torch_dtype(dtype))
