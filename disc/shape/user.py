"""Constraints a user gives ``disc.compile`` or ``disc.onnx.compile``, read once for every frontend.

Two forms: ranges and divisors by dim name, ``{"batch": {"min": 1, "max": 64, "multiple_of": 8}}``,
or equalities between dim expressions, ``["seq == 2*half"]``. A frontend parses them before it
imports (the ranges can guide capture) and applies them to the imported graph's constraints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from disc.errors import CompileError
from disc.shape.constraints import ShapeConstraints
from disc.shape.expr import parse_expr

UserConstraints = Mapping[str, Any] | Sequence[str]
Ranges = dict[str, tuple[int | None, int | None]]


def parse_user_constraints(constraints: UserConstraints | None) -> tuple[Ranges, list[Any]]:
    """(ranges by dim name, facts): a fact is (dim name, divisor) or (lhs, rhs) expressions that are equal."""
    ranges: Ranges = {}
    facts: list[Any] = []
    if constraints is None:
        return ranges, facts
    if isinstance(constraints, Mapping):
        for name, spec in constraints.items():
            unknown = set(spec) - {"min", "max", "multiple_of"}
            if unknown:
                raise CompileError(f"constraint for {name!r}: unknown key(s) {sorted(unknown)}; use min, max, multiple_of")
            ranges[name] = (spec.get("min"), spec.get("max"))
            if spec.get("multiple_of") is not None:
                facts.append((name, int(spec["multiple_of"])))
        return ranges, facts
    for text in constraints:
        lhs, sep, rhs = str(text).partition("==")
        if not sep:
            raise CompileError(f"constraint {text!r}: expected 'lhs == rhs'")
        facts.append((parse_expr(lhs), parse_expr(rhs)))
    return ranges, facts


def apply_user_facts(c: ShapeConstraints, facts: list[Any], ranges: Mapping[str, Any]) -> None:
    """Record ``facts`` in ``c``; every dim named (by ``ranges`` too) must be one of its dynamic dims."""
    for name in ranges:
        if name not in c.facts:
            raise CompileError(f"constraint names dim {name!r}, which is not a dynamic dim ({sorted(c.facts)})")
    for lhs, rhs in facts:
        if isinstance(rhs, int) and isinstance(lhs, str):
            c.set_divisor(lhs, rhs)
            continue
        unknown = (lhs.symbols() | rhs.symbols()) - set(c.facts)
        if unknown:
            raise CompileError(f"constraint {lhs} == {rhs} names unknown dim(s) {sorted(unknown)}")
        c.assume(lhs, "==", rhs, "user constraint")
