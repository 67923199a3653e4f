"""Shape constraints: what is known about symbolic dims, and queries that prove facts.

This is disc's counterpart of BladeDISC's SymbolicDimMgr. It keeps

* per-symbol facts (range, divisibility, known != 0 / != 1, where it came from),
* dim equality as a union-find over symbols (``batch == s3``),
* definitions ``symbol := expression`` (``s7 == s1*s2`` from a reshape with ``-1``),
* product equalities that cannot be oriented (``s0*s1 == s2*s3``), compared
  after cancelling common factors.

Two families of questions have different names on purpose:

* ``prove_*`` answers "is it provably true for every value the symbols may take?"
  It never guesses and never adds a check; ``False`` means "not proven".
* ``assume_*`` records an assumption that the generated program checks at run
  time (``RuntimeCheck``). Speculation (later issues) uses it to pick a kernel
  version; the frontend uses it for facts it could not prove.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from disc.shape.expr import DimLike, FloorDiv, SymExpr, Symbol, as_expr, monomial_gcd, simplify_dim

INF = float("inf")


@dataclass
class SymbolFacts:
    """What is known about one symbol. ``hi`` is ``None`` for unbounded."""

    name: str
    lo: int = 0
    hi: int | None = None
    divisor: int = 1
    source: str = ""

    def describe(self) -> str:
        hi = "inf" if self.hi is None else str(self.hi)
        text = f"{self.name} in [{self.lo}, {hi}]"
        if self.divisor > 1:
            text += f", multiple of {self.divisor}"
        if self.source:
            text += f"  ({self.source})"
        return text


@dataclass(frozen=True)
class RuntimeCheck:
    """An assumption the compiled program verifies when it runs: ``lhs <op> rhs``."""

    lhs: SymExpr
    op: str  # "==", "!=", ">=", "%"
    rhs: SymExpr
    reason: str

    def holds(self, env: dict[str, int]) -> bool:
        a, b = self.lhs.evaluate(env), self.rhs.evaluate(env)
        if self.op == "==":
            return a == b
        if self.op == "!=":
            return a != b
        if self.op == ">=":
            return a >= b
        if self.op == "%":
            return b != 0 and a % b == 0
        raise ValueError(self.op)

    def __str__(self) -> str:
        op = "divisible by" if self.op == "%" else self.op
        return f"{self.lhs} {op} {self.rhs}  [{self.reason}]"


@dataclass
class ShapeConstraints:
    """The constraint set of one graph. Cheap to copy; passes may add facts."""

    facts: dict[str, SymbolFacts] = field(default_factory=dict)
    parent: dict[str, str] = field(default_factory=dict)
    definitions: dict[str, SymExpr] = field(default_factory=dict)
    product_equalities: list[tuple[SymExpr, SymExpr]] = field(default_factory=list)
    checks: list[RuntimeCheck] = field(default_factory=list)
    _counter: itertools.count = field(default_factory=itertools.count, repr=False)

    # -- symbols ------------------------------------------------------------
    def new_symbol(
        self,
        prefix: str = "s",
        *,
        lo: int = 0,
        hi: int | None = None,
        divisor: int = 1,
        source: str = "",
        name: str | None = None,
    ) -> SymExpr:
        if name is None:
            while True:
                name = f"{prefix}{next(self._counter)}"
                if name not in self.facts:
                    break
        elif name in self.facts:
            return SymExpr.symbol(name)
        self.facts[name] = SymbolFacts(name, lo=lo, hi=hi, divisor=divisor, source=source)
        self.parent[name] = name
        return SymExpr.symbol(name)

    def declare(self, name: str, **kw) -> SymExpr:
        return self.new_symbol(name=name, **kw)

    def find(self, name: str) -> str:
        root = name
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        # Path compression keeps later look-ups flat.
        while self.parent.get(name, name) != root:
            self.parent[name], name = root, self.parent[name]
        return root

    def copy(self) -> "ShapeConstraints":
        c = ShapeConstraints(
            {k: SymbolFacts(**vars(v)) for k, v in self.facts.items()},
            dict(self.parent),
            dict(self.definitions),
            list(self.product_equalities),
            list(self.checks),
        )
        c._counter = itertools.count(len(self.facts))
        return c

    # -- normal form --------------------------------------------------------
    def normalize(self, d: DimLike) -> SymExpr:
        """Rewrite to canonical representatives: union-find roots, then definitions."""
        e = as_expr(d)
        for _ in range(32):  # definitions are acyclic; the bound is a safety net
            syms = e.symbols()
            mapping: dict[str, SymExpr] = {}
            for s in syms:
                root = self.find(s)
                if root in self.definitions:
                    mapping[s] = self.definitions[root]
                elif root != s:
                    mapping[s] = SymExpr.symbol(root)
            if not mapping:
                return e
            e = e.substitute(mapping)
        return e

    # -- adding facts ------------------------------------------------------
    def add_equal(self, a: DimLike, b: DimLike) -> bool:
        """Record ``a == b`` (known from op semantics or the frontend).

        Returns False when the two are provably different, in which case the
        caller must report an error: nothing is recorded then.
        """
        ea, eb = self.normalize(a), self.normalize(b)
        if ea == eb:
            return True
        diff = ea - eb
        if diff.is_const:
            return False
        sa, sb = ea.as_symbol(), eb.as_symbol()
        if sa and sb:
            self._union(sa, sb)
            return True
        if sa and sa not in eb.symbols():
            self._define(sa, eb)
            return True
        if sb and sb not in ea.symbols():
            self._define(sb, ea)
            return True
        if eb.is_const and ea.as_monomial() is None:
            # A linear relation like s0 + s1 == 8: solve for a symbol with coefficient +-1.
            solved = self._solve_linear(ea - eb)
            if solved:
                return True
        self.product_equalities.append((ea, eb))
        return True

    def _union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        # Keep the older (input) symbol as the root: it reads better in printed IR.
        if self._age(rb) < self._age(ra):
            ra, rb = rb, ra
        self.parent[rb] = ra
        fa, fb = self.facts.setdefault(ra, SymbolFacts(ra)), self.facts.setdefault(rb, SymbolFacts(rb))
        fa.lo = max(fa.lo, fb.lo)
        if fb.hi is not None:
            fa.hi = fb.hi if fa.hi is None else min(fa.hi, fb.hi)
        fa.divisor = fa.divisor * fb.divisor // _gcd(fa.divisor, fb.divisor)
        if rb in self.definitions:
            self._define(ra, self.definitions.pop(rb))

    def _age(self, name: str) -> int:
        keys = list(self.facts)
        return keys.index(name) if name in self.facts else len(keys)

    def _define(self, name: str, expr: SymExpr) -> None:
        root = self.find(name)
        if root in self.definitions:
            self.add_equal(self.definitions[root], expr)
            return
        self.definitions[root] = expr

    def _solve_linear(self, zero: SymExpr) -> bool:
        for m, c in zero.terms:
            if len(m) == 1 and isinstance(m[0], Symbol) and abs(c) == 1:
                name = m[0].name
                rest = zero - SymExpr.from_terms({m: c})
                if name in rest.symbols():
                    continue
                self._define(name, rest * (-c))
                return True
        return False

    def assume(self, lhs: DimLike, op: str, rhs: DimLike, reason: str) -> RuntimeCheck:
        """Record an assumption that the program checks at run time.

        For ``==`` the equality is also used by later proofs, since the
        program never proceeds past a failed check.
        """
        check = RuntimeCheck(as_expr(lhs), op, as_expr(rhs), reason)
        if check not in self.checks:
            self.checks.append(check)
        if op == "==":
            self.add_equal(lhs, rhs)
        return check

    def assume_equal(self, a: DimLike, b: DimLike, reason: str) -> RuntimeCheck | None:
        """Assume ``a == b``; returns the runtime check, or None when already proven."""
        if self.prove_equal(a, b):
            return None
        if self.prove_not_equal(a, b):
            raise ValueError(f"cannot assume {a} == {b}: provably different ({reason})")
        return self.assume(a, "==", b, reason)

    # -- proofs -------------------------------------------------------------
    def prove_equal(self, a: DimLike, b: DimLike) -> bool:
        ea, eb = self.normalize(a), self.normalize(b)
        if ea == eb:
            return True
        return self._products_equal(ea, eb)

    def _products_equal(self, ea: SymExpr, eb: SymExpr) -> bool:
        # Product equalities are compared after cancelling common factors,
        # so s0*s1*k == s2*s3*k follows from s0*s1 == s2*s3.
        target = _cancel_common(ea, eb)
        for lhs, rhs in self.product_equalities:
            nl, nr = _cancel_common(self.normalize(lhs), self.normalize(rhs))
            if target in ((nl, nr), (nr, nl)):
                return True
        return False

    def prove_not_equal(self, a: DimLike, b: DimLike) -> bool:
        lo, hi = self.bounds(self.normalize(a) - self.normalize(b))
        return lo > 0 or hi < 0

    def prove_same_shape(self, a: Sequence[DimLike], b: Sequence[DimLike]) -> bool:
        return len(a) == len(b) and all(self.prove_equal(x, y) for x, y in zip(a, b))

    def prove_same_numel(self, a: Sequence[DimLike], b: Sequence[DimLike]) -> bool:
        pa = SymExpr.const(1)
        for d in a:
            pa = pa * self.normalize(d)
        pb = SymExpr.const(1)
        for d in b:
            pb = pb * self.normalize(d)
        return self.prove_equal(pa, pb)

    def prove_ge(self, a: DimLike, b: DimLike) -> bool:
        return self.bounds(self.normalize(a) - self.normalize(b))[0] >= 0

    def prove_nonzero(self, d: DimLike) -> bool:
        lo, hi = self.bounds(self.normalize(d))
        return lo > 0 or hi < 0

    def prove_not_one(self, d: DimLike) -> bool:
        return self.prove_not_equal(d, 1)

    def prove_is_one(self, d: DimLike) -> bool:
        return self.prove_equal(d, 1)

    def prove_broadcast_noop(self, operand: Sequence[DimLike], target: Sequence[DimLike], dims: Sequence[int]) -> bool:
        """A broadcast_in_dim is a no-op when ranks match, dims are in order and each dim is equal."""
        return (
            len(operand) == len(target)
            and list(dims) == list(range(len(target)))
            and self.prove_same_shape(operand, target)
        )

    def prove_divisible(self, d: DimLike, k: int) -> bool:
        e = self.normalize(d)
        return all(c % k == 0 or self._monomial_divisor(m) * c % k == 0 for m, c in e.terms)

    def _monomial_divisor(self, m) -> int:
        out = 1
        for a in m:
            if isinstance(a, Symbol):
                out *= self.facts[a.name].divisor if a.name in self.facts else 1
        return out

    # -- ranges --------------------------------------------------------------
    def bounds(self, d: DimLike) -> tuple[float, float]:
        """Interval bounds of an expression, from symbol ranges (never from values)."""
        e = self.normalize(d)
        lo_total: float = 0
        hi_total: float = 0
        for m, c in e.terms:
            lo, hi = 1.0, 1.0
            for a in m:
                alo, ahi = self._atom_bounds(a)
                cands = [lo * alo, lo * ahi, hi * alo, hi * ahi]
                cands = [0.0 if x != x else x for x in cands]  # 0*inf
                lo, hi = min(cands), max(cands)
            lo, hi = (c * lo, c * hi) if c >= 0 else (c * hi, c * lo)
            lo_total += lo
            hi_total += hi
        return lo_total, hi_total

    def _atom_bounds(self, a) -> tuple[float, float]:
        if isinstance(a, Symbol):
            f = self.facts.get(self.find(a.name))
            if f is None:
                return 0.0, INF
            return float(f.lo), INF if f.hi is None else float(f.hi)
        lo, hi = self.bounds(a.num)
        return (lo // a.den if lo != -INF else -INF), (hi // a.den if hi != INF else INF)

    def set_range(self, name: str, lo: int | None = None, hi: int | None = None) -> None:
        f = self.facts[self.find(name)]
        if lo is not None:
            f.lo = max(f.lo, lo)
        if hi is not None:
            f.hi = hi if f.hi is None else min(f.hi, hi)

    # -- reporting ------------------------------------------------------------
    def equal_classes(self) -> list[list[str]]:
        groups: dict[str, list[str]] = {}
        for name in self.facts:
            groups.setdefault(self.find(name), []).append(name)
        return [g for g in groups.values() if len(g) > 1]

    def describe(self) -> list[str]:
        lines = [f.describe() for name, f in self.facts.items() if self.find(name) == name and name not in self.definitions]
        lines += [" == ".join(g) for g in self.equal_classes()]
        lines += [f"{name} == {expr}" for name, expr in self.definitions.items()]
        lines += [f"{a} == {b}" for a, b in self.product_equalities]
        lines += [f"checked at run time: {c}" for c in self.checks]
        return lines


def _cancel_common(a: SymExpr, b: SymExpr) -> tuple[SymExpr, SymExpr]:
    g = monomial_gcd(a, b)
    if g == SymExpr.const(1):
        return a, b
    return a // g, b // g


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def is_static(d: DimLike) -> bool:
    return isinstance(simplify_dim(d), int)


__all__ = [
    "ShapeConstraints",
    "SymbolFacts",
    "RuntimeCheck",
    "FloorDiv",
    "is_static",
]


def dims_of(shape: Iterable[DimLike]) -> tuple[DimLike, ...]:
    return tuple(simplify_dim(d) for d in shape)
