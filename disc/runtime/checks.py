"""Call-time checks of inputs against the compiled program's constraints.

Every message names the input, the dim and the rule, e.g.
``input 'mask' dim 1 is 7 but must equal input 'ids' dim 1 (9)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from disc.errors import InputError, ShapeError
from disc.ir.graph import Graph
from disc.ir.types import DTYPES
from disc.shape.expr import SymExpr


def check_inputs(g: Graph, names: Sequence[str], tensors: Sequence[object]) -> None:
    inputs = g.inputs
    if len(tensors) != len(inputs):
        raise InputError(f"expected {len(inputs)} input(s) {list(names)}, got {len(tensors)}")
    c = g.constraints
    seen: dict[str, tuple[int, str, int]] = {}  # root symbol -> (value, input, axis)
    for name, node, t in zip(names, inputs, tensors):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"input {name!r} must be a tensor, got {type(t).__name__}")
        ty = node.tensor_type
        if t.dtype != DTYPES[ty.dtype]:
            raise InputError(f"input {name!r} has dtype {t.dtype}, compiled for {DTYPES[ty.dtype]}")
        if t.dim() != ty.rank:
            raise InputError(f"input {name!r} has rank {t.dim()} (shape {tuple(t.shape)}), compiled for rank {ty.rank} {ty}")
        if t.device.type != "cpu":
            raise InputError(f"input {name!r} is on {t.device}; this program was compiled for the CPU")
        for axis, (d, size) in enumerate(zip(ty.shape, t.shape)):
            size = int(size)
            if isinstance(d, int):
                if size != d:
                    raise ShapeError(f"input {name!r} dim {axis} is {size} but must be {d} (a static dim of the compiled program)")
                continue
            sym = d.as_symbol() if isinstance(d, SymExpr) else None
            if sym is None:
                continue
            root = c.find(sym)
            if root in seen and seen[root][0] != size:
                v, other, other_axis = seen[root]
                raise ShapeError(f"input {name!r} dim {axis} is {size} but must equal input {other!r} dim {other_axis} ({v})")
            seen.setdefault(root, (size, name, axis))
            facts = c.facts.get(root)
            if facts is None:
                continue
            if size < facts.lo or (facts.hi is not None and size > facts.hi):
                hi = "inf" if facts.hi is None else facts.hi
                raise ShapeError(f"input {name!r} dim {axis} is {size} but {sym} must be in [{facts.lo}, {hi}]")
            if facts.divisor > 1 and size % facts.divisor:
                raise ShapeError(f"input {name!r} dim {axis} is {size} but {sym} must be a multiple of {facts.divisor}")
