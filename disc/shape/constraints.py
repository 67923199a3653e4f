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

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Union

from disc.shape.expr import DimLike, FloorDiv, Monomial, Symbol, SymExpr, as_expr, exact_divide, simplify_dim

INF = float("inf")
# Interval ends are exact ints, or +-inf (a float) when unbounded.
Bound = Union[int, float]

# Limits of the search that proves equalities from product equalities.
_SEARCH_STATES = 64
_SEARCH_TERMS = 24


@dataclass
class SymbolFacts:
    """What is known about one symbol. ``hi`` is ``None`` for unbounded."""

    name: str
    lo: float = 0  # an int, or -inf for a value (not a size) that may be any negative number
    hi: int | None = None
    divisor: int = 1
    source: str = ""
    # The value in the example the graph was traced with, where known: a hint that disproves
    # equalities cheaply (two values that differ there are not equal), never a fact.
    example: int | None = None

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
    _revisiting: bool = field(default=False, repr=False, compare=False)
    # Bumped by every method that may change a fact. Results derived from the constraints (the
    # op registry's memo of inferred types) are valid only while it stays the same.
    revision: int = field(default=0, repr=False, compare=False)
    derived: dict = field(default_factory=dict, repr=False, compare=False)  # what was derived at `derived_revision`
    derived_revision: int = field(default=0, repr=False, compare=False)

    def changed(self) -> None:
        """Record that the facts may have changed (every mutating method calls it)."""
        self.revision += 1

    def derived_cache(self) -> dict:
        """A dict for results derived from the facts as they are now, emptied when they change."""
        if self.derived_revision != self.revision:
            self.derived.clear()
            self.derived_revision = self.revision
        return self.derived

    # -- symbols ------------------------------------------------------------
    def new_symbol(
        self,
        prefix: str = "s",
        *,
        lo: float = 0,
        hi: int | None = None,
        divisor: int = 1,
        source: str = "",
        name: str | None = None,
        example: int | None = None,
    ) -> SymExpr:
        if name is None:
            while True:
                name = f"{prefix}{next(self._counter)}"
                if name not in self.facts:
                    break
        elif name in self.facts:
            return SymExpr.symbol(name)
        self.changed()
        self.facts[name] = SymbolFacts(name, lo=lo, hi=hi, divisor=divisor, source=source, example=example)
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

    def copy(self) -> ShapeConstraints:
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

    def _roots(self, d: DimLike) -> SymExpr:
        """Rewrite symbols to their union-find roots only, keeping defined symbols.

        Facts recorded on a defined symbol (its range, divisor) stay true of
        it, so bounds and divisibility also look at this form.
        """
        e = as_expr(d)
        mapping = {s: SymExpr.symbol(self.find(s)) for s in e.symbols() if self.find(s) != s}
        return e.substitute(mapping) if mapping else e

    # -- adding facts ------------------------------------------------------
    def add_equal(self, a: DimLike, b: DimLike) -> bool:
        """Record ``a == b`` (known from op semantics or the frontend).

        Returns False when the two are provably different, in which case the
        caller must report an error: nothing is recorded then.
        """
        self.changed()
        ea, eb = self.normalize(a), self.normalize(b)
        if ea == eb:
            return True
        if self._provably_nonzero(ea - eb):
            return False
        # Cancel factors known to be nonzero: s0*s1 == s0*s2 with s0 >= 1 is s1 == s2.
        ea, eb = self._cancel_nonzero(ea, eb)
        if ea == eb:
            return True
        if self._orient(ea, eb):
            self._revisit_products()
            return True
        if (ea, eb) not in self.product_equalities and (eb, ea) not in self.product_equalities:
            self.product_equalities.append((ea, eb))
        return True

    def _orient(self, ea: SymExpr, eb: SymExpr) -> bool:
        """Turn ``ea == eb`` (normalized) into a union or a definition when possible."""
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
        if (eb.is_const and ea.as_monomial() is None) or (ea.is_const and eb.as_monomial() is None):
            # A linear relation like s0 + s1 == 8: solve for a symbol with coefficient +-1.
            return self._solve_linear(ea - eb)
        return False

    def _revisit_products(self) -> None:
        """After a union or definition, product equalities may become trivial or orientable."""
        if self._revisiting or not self.product_equalities:
            return
        self._revisiting = True
        try:
            changed = True
            while changed:
                changed = False
                pending, self.product_equalities = self.product_equalities, []
                for lhs, rhs in pending:
                    nl, nr = self._cancel_nonzero(self.normalize(lhs), self.normalize(rhs))
                    if nl == nr:
                        continue  # now implied by unions and definitions
                    if self._orient(nl, nr):
                        changed = True
                        continue
                    self.product_equalities.append((lhs, rhs))
        finally:
            self._revisiting = False

    def _cancel_nonzero(self, ea: SymExpr, eb: SymExpr) -> tuple[SymExpr, SymExpr]:
        """Divide both sides by their common factor, keeping only atoms proven nonzero."""
        coeff, atoms = _content([ea, eb])
        atoms = [a for a in atoms if self._provably_nonzero(SymExpr.atom(a))]
        if coeff == 1 and not atoms:
            return ea, eb
        g = SymExpr.from_terms({tuple(atoms): coeff})
        qa, qb = exact_divide(ea, g), exact_divide(eb, g)
        if qa is None or qb is None:  # cannot happen: g divides every term
            return ea, eb
        return qa, qb

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

        The program never proceeds past a failed check, so later proofs may
        use the assumption: ``==`` becomes an equality; ``>=``, ``!=`` and
        ``%`` between a symbol and a constant refine that symbol's range or
        divisor.
        """
        if op not in ("==", "!=", ">=", "%"):
            raise ValueError(f"unknown runtime check operator {op!r}")
        self.changed()
        check = RuntimeCheck(as_expr(lhs), op, as_expr(rhs), reason)
        # One check per condition: two ops needing the same fact (a view's -1 and the division
        # computing it) are checked once, under the first reason given.
        same = next((k for k in self.checks if (k.lhs, k.op, k.rhs) == (check.lhs, op, check.rhs)), None)
        if same is None:
            self.checks.append(check)
        else:
            check = same
        if op == "==":
            self.add_equal(lhs, rhs)
            return check
        sym_l, sym_r = check.lhs.as_symbol(), check.rhs.as_symbol()
        if op == ">=" and sym_l and check.rhs.is_const:
            self.set_range(sym_l, lo=check.rhs.const_value)
        elif op == ">=" and sym_r and check.lhs.is_const:
            self.set_range(sym_r, hi=check.lhs.const_value)
        elif op == "%" and sym_l and check.rhs.is_const and check.rhs.const_value != 0:
            f = self._facts_of(sym_l)
            k = abs(check.rhs.const_value)
            f.divisor = f.divisor * k // _gcd(f.divisor, k)
        elif op == "!=" and (sym_l and check.rhs.is_const or sym_r and check.lhs.is_const):
            name, value = (sym_l, check.rhs.const_value) if sym_l else (sym_r, check.lhs.const_value)
            f = self._facts_of(name)
            if value == f.lo:
                f.lo += 1
            elif f.hi is not None and value == f.hi:
                f.hi -= 1
        return check

    def assume_equal(self, a: DimLike, b: DimLike, reason: str) -> RuntimeCheck | None:
        """Assume ``a == b``; returns the runtime check, or None when already proven."""
        if self.prove_equal(a, b):
            return None
        if self.prove_not_equal(a, b):
            raise ValueError(f"cannot assume {a} == {b}: provably different ({reason})")
        return self.assume(a, "==", b, reason)

    def _facts_of(self, name: str) -> SymbolFacts:
        root = self.find(name)
        if root not in self.facts:
            self.facts[root] = SymbolFacts(root)
            self.parent.setdefault(root, root)
        return self.facts[root]

    def example_value(self, d: DimLike) -> int | None:
        """``d`` in the traced example (from the symbols' ``example`` hints), or None if unknown."""
        e = self.normalize(d)
        env: dict[str, int] = {}
        for name in e.symbols():
            f = self.facts.get(self.find(name))
            if f is None or f.example is None:
                return None
            env[name] = f.example
        try:
            return e.evaluate(env)
        except (KeyError, ZeroDivisionError):
            return None

    # -- proofs -------------------------------------------------------------
    def prove_equal(self, a: DimLike, b: DimLike, effort: int = _SEARCH_STATES) -> bool:
        """``a == b`` for every value; ``effort`` bounds the product-equality search (states)."""
        ea, eb = self.normalize(a), self.normalize(b)
        if ea == eb:
            return True
        if not self.product_equalities:
            return False
        # Values that differ in the traced example are not equal: no search for a proof.
        x, y = self.example_value(ea), self.example_value(eb)
        if x is not None and y is not None and x != y:
            return False
        # The search is the costly part, and the verifier and each rebuild ask the same
        # questions again (Swin: thousands of reshapes between window and image layouts).
        known = self.derived_cache()
        key = ("prove_equal", ea, eb, effort)
        if key not in known:
            known[key] = known["prove_equal", eb, ea, effort] = self._products_equal(ea, eb, effort)
        return known[key]

    def _products_equal(self, ea: SymExpr, eb: SymExpr, effort: int = _SEARCH_STATES) -> bool:
        """Prove ``ea == eb`` from the product equalities, by a bounded search.

        The difference ``ea - eb`` is rewritten by steps that keep "it is zero"
        equivalent or stronger, never weaker:

        * subtract ``q * (lhs - rhs)`` of a known ``lhs == rhs`` (``q`` a
          monomial chosen to cancel one term), after scaling by a nonzero
          integer: zero-ness is unchanged;
        * divide by a common monomial factor of all terms: if the quotient is
          zero, so is the difference, whatever the factor's value.

        Reaching ``0`` proves the equality. So ``s0*s1*k == s2*s3*k`` follows
        from ``s0*s1 == s2*s3``, and chains ``a*b == c*d == e*f`` compose. The
        facts themselves are never divided by a factor that may be zero
        (``k*a == k*b`` does not give ``a == b`` when ``k`` may be 0).
        """
        if not self.product_equalities:
            return False
        known = self.derived_cache()
        rels: list[SymExpr] | None = known.get("product_relations")
        if rels is None:
            rels = known["product_relations"] = []
            for lhs, rhs in self.product_equalities:
                rel = _primitive(self.normalize(lhs) - self.normalize(rhs), strip_atoms=False)
                if rel.terms and rel not in rels:
                    rels.append(rel)
        if not rels:
            return False
        tie = itertools.count()
        heap: list[tuple[int, int, SymExpr]] = []
        seen: set[SymExpr] = set()

        def push(d: SymExpr) -> bool:
            # Both the difference and its quotient by common atoms are states:
            # the quotient is a stronger goal, not always an easier one.
            for form in {_primitive(d, strip_atoms=False), _primitive(d, strip_atoms=True)}:
                if not form.terms:
                    return True
                if form not in seen and len(form.terms) <= _SEARCH_TERMS:
                    seen.add(form)
                    heapq.heappush(heap, (len(form.terms), next(tie), form))
            return False

        if push(ea - eb):
            return True
        while heap and len(seen) < effort:
            _, _, d = heapq.heappop(heap)
            atoms = {a for m, _ in d.terms for a in m}
            for rel in rels:
                if not any(a in atoms for m, _ in rel.terms for a in m):
                    continue  # shares nothing with the goal: cannot cancel any term
                for m, c in d.terms:
                    for rm, rc in rel.terms:
                        if rm == () and m != ():
                            continue  # multiplying a whole fact by a goal term only grows it
                        q = _mono_quotient(m, rm)
                        if q is None:
                            continue
                        if c % rc == 0:
                            nd = d - rel * SymExpr.from_terms({q: c // rc})
                        else:
                            nd = d * rc - rel * SymExpr.from_terms({q: c})
                        if push(nd):
                            return True
        return False

    def prove_not_equal(self, a: DimLike, b: DimLike) -> bool:
        return self._provably_nonzero(self.normalize(a) - self.normalize(b))

    def _provably_nonzero(self, e: SymExpr) -> bool:
        """``e != 0`` for every value: from ranges, or from divisibility (``2*s + 1``)."""
        if not e.terms:
            return False
        if e.is_const:
            return True
        lo, hi = self.bounds(e)
        if lo > 0 or hi < 0:
            return True
        for form in self._forms(e):
            g = 0
            for m, c in form.terms:
                if m != ():
                    g = math.gcd(g, c * self._monomial_divisor(m))
            if g > 1 and form.const_value % g != 0:
                return True
        return False

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

    def reshape_groups(self, a: Sequence[DimLike], b: Sequence[DimLike]) -> list[tuple[range, range]] | None:
        """Split a reshape from shape ``a`` to shape ``b`` into consecutive groups of dims whose
        products are proven equal, smallest groups first: ``(B*S, 256) -> (B, S, 4, 64)`` gives
        ``[(0:1, 0:2), (1:2, 2:4)]``. An index then moves group by group, so a row's index never
        mixes with the columns'. Dims proven to be 1 belong to no group; None when ``a`` and ``b``
        cannot be matched (then only the whole linear position is shared)."""
        ka = [i for i, d in enumerate(a) if not self.prove_is_one(d)]
        kb = [i for i, d in enumerate(b) if not self.prove_is_one(d)]
        groups: list[tuple[range, range]] = []
        i = j = 0
        while i < len(ka) and j < len(kb):
            found = next(
                (
                    (i2, j2)
                    for i2 in range(i + 1, len(ka) + 1)
                    for j2 in range(j + 1, len(kb) + 1)
                    if self.prove_same_numel([a[k] for k in ka[i:i2]], [b[k] for k in kb[j:j2]])
                ),
                None,
            )
            if found is None:
                return None
            i2, j2 = found
            groups.append((range(ka[i], ka[i2 - 1] + 1), range(kb[j], kb[j2 - 1] + 1)))
            i, j = i2, j2
        return groups if i == len(ka) and j == len(kb) else None

    def prove_ge(self, a: DimLike, b: DimLike) -> bool:
        return self.bounds(self.normalize(a) - self.normalize(b))[0] >= 0

    def prove_nonzero(self, d: DimLike) -> bool:
        return self._provably_nonzero(self.normalize(d))

    def prove_not_one(self, d: DimLike) -> bool:
        return self.prove_not_equal(d, 1)

    def prove_is_one(self, d: DimLike) -> bool:
        return self.prove_equal(d, 1)

    def prove_broadcast_noop(self, operand: Sequence[DimLike], target: Sequence[DimLike], dims: Sequence[int]) -> bool:
        """A broadcast_in_dim is a no-op when ranks match, dims are in order and each dim is equal."""
        return len(operand) == len(target) and list(dims) == list(range(len(target))) and self.prove_same_shape(operand, target)

    def prove_divisible(self, d: DimLike, k: int) -> bool:
        """Every term is a multiple of ``k`` (coefficient times the symbols' known divisors)."""
        if k == 0:
            return self.prove_equal(d, 0)
        k = abs(k)
        if k == 1:
            return True
        return any(all(c * self._monomial_divisor(m) % k == 0 for m, c in form.terms) for form in self._forms(d))

    def _monomial_divisor(self, m: Monomial) -> int:
        out = 1
        for a in m:
            if isinstance(a, Symbol):
                f = self.facts.get(self.find(a.name))
                out *= f.divisor if f is not None else 1
        return out

    def _forms(self, d: DimLike) -> list[SymExpr]:
        """Equal forms of ``d`` whose facts may differ: fully normalized, and roots only."""
        full, raw = self.normalize(d), self._roots(d)
        return [full] if full == raw else [full, raw]

    # -- ranges --------------------------------------------------------------
    def bounds(self, d: DimLike) -> tuple[Bound, Bound]:
        """Interval bounds of an expression, from symbol ranges (never from values).

        Sound: every value the expression takes when each symbol lies in its
        range (and is a multiple of its divisor) is inside ``[lo, hi]``. Ends
        are exact ints, or ``-inf`` / ``inf``. Both the normalized form and
        the form that keeps defined symbols are bounded, and the intervals
        intersected.
        """
        lo: Bound = -INF
        hi: Bound = INF
        for form in self._forms(d):
            flo, fhi = self._interval(form)
            rlo, rhi = self._relaxed_interval(form)
            lo, hi = max(lo, flo, rlo), min(hi, fhi, rhi)
        return lo, hi

    def _relaxed_interval(self, e: SymExpr) -> tuple[Bound, Bound]:
        """Bounds that keep floor divisions correlated with their numerators.

        A linear term ``c * (n // k)`` is ``c * (n - r) / k`` with ``r`` in
        ``[0, k-1]``. Scaled by the lcm ``L`` of the divisors, the expression
        becomes a polynomial in which ``n`` can cancel against other terms
        (``w - w//2`` gives ``(w + r) / 2``, at least ``w / 2``); the interval of
        ``L * e`` is divided back by ``L`` and rounded inwards, ``e`` being an
        integer.
        """
        dens = [m[0].den for m, _ in e.terms if len(m) == 1 and isinstance(m[0], FloorDiv)]
        if not dens:
            return -INF, INF
        scale = 1
        for k in dens:
            scale = scale * k // math.gcd(scale, k)
        acc = SymExpr.const(0)
        slack_lo: Bound = 0
        slack_hi: Bound = 0
        for m, c in e.terms:
            if len(m) == 1 and isinstance(m[0], FloorDiv):
                fd = m[0]
                f = c * (scale // fd.den)
                acc = acc + fd.num * f
                span = abs(f) * (fd.den - 1)  # -f*r ranges over [-f*(k-1), 0] or [0, -f*(k-1)]
                if f > 0:
                    slack_lo -= span
                else:
                    slack_hi += span
            else:
                acc = acc + SymExpr.from_terms({m: c * scale})
        lo, hi = self._interval(acc)
        lo, hi = lo + slack_lo, hi + slack_hi
        lo = -((-lo) // scale) if lo != -INF else -INF
        hi = hi // scale if hi != INF else INF
        return lo, hi

    def _interval(self, e: SymExpr) -> tuple[Bound, Bound]:
        lo_total: Bound = 0
        hi_total: Bound = 0
        for m, c in e.terms:
            lo: Bound = 1
            hi: Bound = 1
            for atom, power in Counter(m).items():
                alo, ahi = self._atom_bounds(atom)
                plo, phi = _pow_interval(alo, ahi, power)
                lo, hi = _mul_interval(lo, hi, plo, phi)
            lo, hi = (_mul(c, lo), _mul(c, hi)) if c > 0 else (_mul(c, hi), _mul(c, lo))
            lo_total += lo
            hi_total += hi
        return lo_total, hi_total

    def _atom_bounds(self, a) -> tuple[Bound, Bound]:
        if isinstance(a, Symbol):
            f = self.facts.get(self.find(a.name))
            if f is None:
                return 0, INF
            lo: Bound = f.lo
            hi: Bound = INF if f.hi is None else f.hi
            if f.divisor > 1:
                # The value is a multiple of the divisor: round the ends inwards.
                lo = -((-lo) // f.divisor) * f.divisor if lo != -INF else lo
                if hi != INF:
                    hi = (hi // f.divisor) * f.divisor
            return lo, hi
        lo, hi = self._interval(a.num)
        return (lo // a.den if lo != -INF else -INF), (hi // a.den if hi != INF else INF)

    def set_range(self, name: str, lo: int | None = None, hi: int | None = None) -> None:
        self.changed()
        f = self.facts[self.find(name)]
        if lo is not None:
            f.lo = max(f.lo, lo)
        if hi is not None:
            f.hi = hi if f.hi is None else min(f.hi, hi)

    def set_divisor(self, name: str, k: int) -> None:
        """Record that ``name`` is a multiple of ``k``."""
        self.changed()
        f = self._facts_of(name)
        f.divisor = f.divisor * k // _gcd(f.divisor, k)

    def forget_symbol(self, name: str) -> None:
        """Drop a symbol nothing mentions (one a shape rule minted in vain)."""
        self.changed()
        del self.facts[name]
        self.parent.pop(name, None)

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


def _content(exprs: Iterable[SymExpr]) -> tuple[int, list]:
    """Common factor of all terms: (gcd of coefficients, atoms every monomial contains)."""
    coeff = 0
    common: Counter | None = None
    for e in exprs:
        for m, c in e.terms:
            coeff = math.gcd(coeff, c)
            atoms = Counter(m)
            common = atoms if common is None else common & atoms
    if common is None:
        return 1, []
    return max(coeff, 1), sorted(common.elements(), key=lambda a: a.sort_key())


def _primitive(e: SymExpr, *, strip_atoms: bool) -> SymExpr:
    """``e`` divided by its integer content (and common atoms), leading coefficient positive.

    ``e == 0`` iff the result is 0 when only the integer content is divided
    out; dividing out atoms keeps "result == 0 implies e == 0".
    """
    if not e.terms:
        return e
    coeff, atoms = _content([e])
    if not strip_atoms:
        atoms = []
    if e.terms[-1][1] < 0:
        coeff = -coeff
    if coeff == 1 and not atoms:
        return e
    q = exact_divide(e, SymExpr.from_terms({tuple(atoms): coeff}))
    return e if q is None else q


def _mono_quotient(m: Monomial, d: Monomial) -> Monomial | None:
    """``m / d`` as monomials (multisets of atoms), or None if ``d`` does not divide ``m``."""
    rest = list(m)
    for a in d:
        if a not in rest:
            return None
        rest.remove(a)
    return tuple(rest)


def _mul(x: Bound, y: Bound) -> Bound:
    # 0 * inf is 0 here: a factor that is exactly 0 makes the product 0.
    if x == 0 or y == 0:
        return 0
    return x * y


def _mul_interval(alo: Bound, ahi: Bound, blo: Bound, bhi: Bound) -> tuple[Bound, Bound]:
    cands = [_mul(alo, blo), _mul(alo, bhi), _mul(ahi, blo), _mul(ahi, bhi)]
    return min(cands), max(cands)


def _pow_interval(lo: Bound, hi: Bound, k: int) -> tuple[Bound, Bound]:
    if k == 1:
        return lo, hi
    if lo >= 0:
        return lo**k, hi**k
    if hi <= 0:
        return (hi**k, lo**k) if k % 2 == 0 else (lo**k, hi**k)
    if k % 2 == 0:
        return 0, max(lo**k, hi**k)
    return lo**k, hi**k


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def is_static(d: DimLike) -> bool:
    return isinstance(simplify_dim(d), int)


__all__ = [
    "FloorDiv",
    "RuntimeCheck",
    "ShapeConstraints",
    "SymbolFacts",
    "is_static",
]


def dims_of(shape: Iterable[DimLike]) -> tuple[DimLike, ...]:
    return tuple(simplify_dim(d) for d in shape)
