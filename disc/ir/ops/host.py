"""``torch_fallback``: an op disc does not lower, run by PyTorch on the host.

Its result type comes from torch's own shape propagation at import time
(data-dependent dims become fresh symbols); the call itself is kept in the
importer's side table under the ``call`` key.
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
    "torch_fallback",
    "*operands",
    attrs={"call": "", "target": "", "reason": "", "dtype": "f32", "shape": ()},
    dtype=lambda types, attrs: attrs["dtype"],
    shape=_fallback_rule,
    category=SOURCE,
)
def torch_fallback(*operands: Any, call: Any, results: dict | None = None, **_: Any) -> Any:
    """Calls ``call`` (resolved by the executor to the importer's Fallback) on the operands.

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
