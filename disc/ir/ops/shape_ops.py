"""Shape-computation ops: host integers that compute the program's shapes.

They are ordinary IR, so CSE, folding and DCE apply to shape arithmetic like to
anything else, and the executor compiles them into one function per program
instead of re-deriving shapes op by op.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from disc.ir.lazy_torch import torch
from disc.ir.registry import SHAPE, ShapeContext, fixed_dtype, index_value, normalize_axis, register, tensor
from disc.ir.types import Type
from disc.shape.expr import SymExpr, as_expr, exact_divide

_index = fixed_dtype("index")


def _dim_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    t = tensor(types[0], "dim")
    return t.shape[normalize_axis(attrs["axis"], t.rank, "dim")]


@register("dim", "x", attrs={"axis": 0}, dtype=_index, shape=_dim_rule, category=SHAPE)
def dim(x: torch.Tensor, *, axis: int) -> int:
    """The size of one axis of a tensor."""
    return int(x.shape[axis])


@register("index_const", "", attrs={"value": 0}, dtype=_index, shape=lambda ctx, types, attrs: attrs["value"], category=SHAPE)
def index_const(*, value: int) -> int:
    """A constant host integer."""
    return value


def _binary_index(fn):
    def rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
        a, b = (as_expr(index_value(t, ctx.op)) for t in types)
        return fn(ctx, a, b)

    return rule


def fresh_symbol(ctx: ShapeContext, kind: str, a: SymExpr, b: SymExpr, lo: float = 0, hi: float = math.inf) -> SymExpr:
    """A symbol for a value no expression captures, named by what computes it, in ``[lo, hi]``.

    The name is a function of the operands, so inferring the same op twice
    (the verifier re-infers every node) yields the same symbol.
    """
    digest = hashlib.sha1(f"{kind}({a}, {b})".encode()).hexdigest()[:6]
    bound_hi = None if hi == math.inf else int(hi)
    c = ctx.constraints
    x, y = c.example_value(a), c.example_value(b)
    example = None if x is None or y is None or (kind == "div" and y == 0) else _EXAMPLE_OPS[kind](x, y)
    return c.new_symbol(name=f"{kind}_{digest}", lo=lo, hi=bound_hi, source=f"{kind}({a}, {b})", example=example)


_EXAMPLE_OPS = {"div": lambda x, y: x // y, "max": max, "min": min}


def _floordiv(ctx: ShapeContext, a: SymExpr, b: SymExpr):
    if b.is_const:
        ctx.check(b.const_value > 0, f"division by non-positive constant {b}")
        return a // b
    q = exact_divide(ctx.constraints.normalize(a), ctx.constraints.normalize(b))
    if q is not None:
        return q
    # Not expressible: the quotient is a new symbol, computed at run time. Its bounds follow
    # from the operands': with b > 0 (b = 0 fails at run time), a // b lies between min(a, 0)
    # and max(a, 0), so it is only non-negative when a is (a difference of sizes may not be).
    c = ctx.constraints
    if not c.prove_ge(b, 1):
        c.assume(b, ">=", 1, "ifloordiv: the divisor must be positive")
    if not c.prove_ge(b, 0):
        return fresh_symbol(ctx, "div", a, b, lo=-math.inf)
    alo, ahi = c.bounds(a)
    return fresh_symbol(ctx, "div", a, b, lo=min(alo, 0), hi=max(ahi, 0))


def _max_min(pick_max: bool):
    def rule(ctx: ShapeContext, a: SymExpr, b: SymExpr):
        c = ctx.constraints
        if c.prove_ge(a, b):
            return a if pick_max else b
        if c.prove_ge(b, a):
            return b if pick_max else a
        # The result lies between the operands' bounds: a min may be negative (min(n, m - 1) at
        # m = 0), and assuming otherwise would let max(0, that) be simplified away.
        (alo, ahi), (blo, bhi) = c.bounds(a), c.bounds(b)
        pick = max if pick_max else min
        return fresh_symbol(ctx, "max" if pick_max else "min", a, b, lo=pick(alo, blo), hi=pick(ahi, bhi))

    return rule


@register("iadd", "a b", dtype=_index, shape=_binary_index(lambda ctx, a, b: a + b), category=SHAPE)
def iadd(a: int, b: int) -> int:
    return a + b


@register("isub", "a b", dtype=_index, shape=_binary_index(lambda ctx, a, b: a - b), category=SHAPE)
def isub(a: int, b: int) -> int:
    return a - b


@register("imul", "a b", dtype=_index, shape=_binary_index(lambda ctx, a, b: a * b), category=SHAPE)
def imul(a: int, b: int) -> int:
    return a * b


@register("ifloordiv", "a b", dtype=_index, shape=_binary_index(_floordiv), category=SHAPE)
def ifloordiv(a: int, b: int) -> int:
    return a // b


@register("imax", "a b", dtype=_index, shape=_binary_index(_max_min(True)), category=SHAPE)
def imax(a: int, b: int) -> int:
    return max(a, b)


@register("imin", "a b", dtype=_index, shape=_binary_index(_max_min(False)), category=SHAPE)
def imin(a: int, b: int) -> int:
    return min(a, b)


def settle_minted_symbols(graph: Any) -> int:
    """Equate each index op's minted symbol (an inexact ``//``, an undecided max/min) with the
    expression its operands give now, where facts learned after the op was added decide it (Swin's
    padded side over its window count, exact only once a view tied the sizes). The symbol names
    exactly the op's value, so the equality is a fact; without it the verifier, re-inferring the op,
    found a value its consumers never saw. Returns how many symbols were settled."""
    from disc.ir.registry import infer_type
    from disc.ir.types import IndexType

    c, settled = graph.constraints, 0
    for n in graph.nodes:
        if n.op not in _MINTING_OPS or not isinstance(n.type, IndexType):
            continue
        name = as_expr(n.type.value).as_symbol()
        facts = c.facts.get(name) if name is not None else None
        if facts is None or facts.source == "" or not name.startswith(_MINTING_OPS[n.op]):
            continue
        again = as_expr(infer_type(graph, n.op, list(n.inputs), n.attrs).value)  # type: ignore[union-attr]
        minted = SymExpr.symbol(name)
        if again.as_symbol() is None and not c.prove_equal(minted, again) and c.add_equal(minted, again):
            settled += 1
    return settled


_MINTING_OPS = {"ifloordiv": "div_", "imax": "max_", "imin": "min_"}
