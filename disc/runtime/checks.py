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

SHAPES_KEPT = 256  # input shapes an InputChecker remembers as valid


def _elsewhere(t: torch.Tensor, device: str) -> bool:
    """Is ``t`` on a device a program for ``device`` cannot take? 0-d host tensors mix with
    device tensors, as in PyTorch (the executor copies them over)."""
    return t.device.type != device and not (t.is_cpu and t.dim() == 0)


class InputChecker:
    """Checks call inputs against ``g`` (dtype, rank, device, dims and their constraints), raising a clear error.

    What to compare is worked out once per graph; a call only compares sizes. The dim rules
    depend on the shapes alone, so shapes that passed are remembered: a call at one of them
    only checks dtypes and devices.
    """

    def __init__(self, g: Graph, names: Sequence[str], device: str = "cpu") -> None:
        self.names = list(names)
        self.device = device  # the device type the program runs on
        self.n = len(g.inputs)
        c = g.constraints
        # Per input: (name, dtype, rank, type text, [(axis, static size | None, root | None, symbol, facts)]).
        self.plan = []
        for name, node in zip(self.names, g.inputs):
            ty = node.tensor_type
            dims = []
            for axis, d in enumerate(ty.shape):
                if isinstance(d, int):
                    dims.append((axis, d, None, None, None))
                    continue
                sym = d.as_symbol() if isinstance(d, SymExpr) else None
                root = c.find(sym) if sym is not None else None
                # A dim that is an expression of other dims (a user's `seq == 2*half` defines seq)
                # is checked against it once the others are seen, with their values in the message.
                definition = c.definitions.get(root) if root is not None else (d if isinstance(d, SymExpr) else None)
                if definition is not None and definition.as_symbol() is None:
                    expr = definition.substitute({x: SymExpr.symbol(c.find(x)) for x in definition.symbols()})
                    dims.append((axis, None, None, f"{sym} = {definition}" if sym else str(definition), expr))
                elif root is not None:
                    dims.append((axis, None, root, sym, c.facts.get(root)))
            self.plan.append((name, DTYPES[ty.dtype], ty.rank, ty, dims))
        self.dtypes = [dtype for _, dtype, _, _, _ in self.plan]
        self.passed: set[tuple[object, ...]] = set()  # input shapes whose dims met every rule

    def __call__(self, tensors: Sequence[object]) -> None:
        if len(tensors) != self.n:
            raise InputError(f"expected {self.n} input(s) {self.names}, got {len(tensors)}")
        shapes = tuple([getattr(t, "shape", None) for t in tensors])
        if shapes in self.passed:
            on_cpu = self.device == "cpu"  # t.is_cpu costs a seventh of building t.device
            for dtype, t in zip(self.dtypes, tensors):
                if not isinstance(t, torch.Tensor) or t.dtype != dtype or (not t.is_cpu if on_cpu else _elsewhere(t, self.device)) or t.layout is not torch.strided:
                    break  # the full check below names what is wrong
            else:
                return
        self._check(tensors)
        if len(self.passed) >= SHAPES_KEPT:
            self.passed.clear()
        self.passed.add(shapes)

    def _check(self, tensors: Sequence[object]) -> None:
        seen: dict[object, tuple[int, str, int]] = {}  # root symbol -> (value, input, axis)
        derived: list[tuple[str, int, int, str, SymExpr]] = []  # dims that are expressions: checked once every symbol is seen
        for (name, dtype, rank, ty, dims), t in zip(self.plan, tensors):
            if not isinstance(t, torch.Tensor):
                raise InputError(f"input {name!r} must be a tensor, got {type(t).__name__}")
            if t.layout != torch.strided:
                raise InputError(f"input {name!r} is a {str(t.layout).removeprefix('torch.')} tensor; disc takes dense tensors (pass {name}.to_dense())")
            if t.dtype != dtype:
                raise InputError(f"input {name!r} has dtype {t.dtype}, compiled for {dtype}")
            if t.dim() != rank:
                raise InputError(f"input {name!r} has rank {t.dim()} (shape {tuple(t.shape)}), compiled for rank {rank} {ty}")
            if _elsewhere(t, self.device):
                raise InputError(f"input {name!r} is on {t.device}; this program was compiled for {self.device}")
            shape = t.shape
            for axis, static, root, sym, facts in dims:
                size = int(shape[axis])
                if static is not None:
                    if size != static:
                        raise ShapeError(f"input {name!r} dim {axis} is {size} but must be {static} (a static dim of the compiled program)")
                    continue
                if root is None:
                    derived.append((name, axis, size, sym, facts))
                    continue
                got = seen.get(root)
                if got is not None:
                    if got[0] != size:
                        raise ShapeError(f"input {name!r} dim {axis} is {size} but must equal input {got[1]!r} dim {got[2]} ({got[0]})")
                    continue
                seen[root] = (size, name, axis)
                if facts is None:
                    continue
                if size < facts.lo or (facts.hi is not None and size > facts.hi):
                    hi = "inf" if facts.hi is None else facts.hi
                    raise ShapeError(f"input {name!r} dim {axis} is {size} but {sym} must be in [{facts.lo}, {hi}]")
                if facts.divisor > 1 and size % facts.divisor:
                    raise ShapeError(f"input {name!r} dim {axis} is {size} but {sym} must be a multiple of {facts.divisor}")
        for name, axis, size, text, expr in derived:
            if not expr.symbols() <= set(seen):
                continue  # a symbol no input dim binds: the program's own check reports it
            want = expr.evaluate({sym: value for sym, (value, _, _) in seen.items()})
            if size != want:
                if not expr.symbols():  # e.g. an exporter that traced the dim at 1 and kept a 1 in the graph
                    raise ShapeError(f"input {name!r} dim {axis} is {size} but must be {want} (the compiled graph fixes it: {text})")
                known = ", ".join(f"{sym} = {seen[sym][0]} from input {seen[sym][1]!r} dim {seen[sym][2]}" for sym in sorted(expr.symbols()))
                raise ShapeError(f"input {name!r} dim {axis} is {size} but must equal {text} = {want} ({known})")
