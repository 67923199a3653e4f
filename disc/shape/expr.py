"""Symbolic dimension expressions: the small algebra every shape in disc is written in.

A dim is either a plain ``int`` or a ``SymExpr``: a polynomial with integer
coefficients over *atoms*. An atom is a named symbol (``s0``, ``batch``) or a
floor division of a polynomial by a positive integer constant (conv, pool and
slice output sizes). Expressions are kept in one canonical form, so two
expressions that are equal as polynomials are equal as Python objects and hash
alike; that is what makes CSE of shape expressions and "same shape?" queries
cheap. We deliberately avoid sympy here (see docs/internals.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Union

# A monomial is a sorted tuple of atoms; repetition encodes powers (s0*s0).
Monomial = tuple["Atom", ...]


@dataclass(frozen=True, order=True)
class Symbol:
    """A named unknown dimension."""

    name: str

    def sort_key(self) -> tuple:
        return (0, self.name)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class FloorDiv:
    """``num // den`` with a positive constant divisor that does not divide num exactly."""

    num: SymExpr
    den: int
    _key: tuple = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        # Monomials are sorted by atom keys all the time: compute this one once.
        object.__setattr__(self, "_key", (1, str(self.num), self.den))

    def sort_key(self) -> tuple:
        return self._key

    def __str__(self) -> str:
        inner = str(self.num)
        if len(self.num.terms) > 1 or self.num.terms and self.num.terms[0][1] < 0:
            inner = f"({inner})"
        return f"{inner}//{self.den}"


Atom = Union[Symbol, FloorDiv]


def _atom_key(a: Atom) -> tuple:
    return a.sort_key()


def _mono_key(m: Monomial) -> tuple:
    return (len(m), tuple(_atom_key(a) for a in m))


@dataclass(frozen=True)
class SymExpr:
    """A canonical polynomial: ``terms`` is a tuple of (monomial, coefficient).

    The constant term has the empty monomial. Terms are sorted and no
    coefficient is zero, so structural equality is mathematical equality
    (up to what the canonical form can see, which is exact for polynomials).
    """

    terms: tuple[tuple[Monomial, int], ...]
    _hash: int = field(default=0, compare=False, repr=False)
    _text: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(self.terms))

    def __hash__(self) -> int:
        return self._hash

    # -- construction -------------------------------------------------------
    @staticmethod
    def from_terms(terms: Mapping[Monomial, int]) -> SymExpr:
        items = sorted(((m, c) for m, c in terms.items() if c != 0), key=lambda t: _mono_key(t[0]))
        return SymExpr(tuple(items))

    @staticmethod
    def const(value: int) -> SymExpr:
        value = int(value)
        return SymExpr((((), value),) if value else ())  # already canonical: no sort

    @staticmethod
    def symbol(name: str) -> SymExpr:
        return SymExpr.from_terms({(Symbol(name),): 1})

    @staticmethod
    def atom(a: Atom) -> SymExpr:
        return SymExpr.from_terms({(a,): 1})

    # -- inspection ---------------------------------------------------------
    @property
    def is_const(self) -> bool:
        return all(m == () for m, _ in self.terms)

    @property
    def const_value(self) -> int:
        """The constant term (the whole value when ``is_const``)."""
        for m, c in self.terms:
            if m == ():
                return c
        return 0

    def as_symbol(self) -> str | None:
        """The symbol name when this expression is exactly one symbol."""
        if len(self.terms) == 1:
            m, c = self.terms[0]
            if c == 1 and len(m) == 1 and isinstance(m[0], Symbol):
                return m[0].name
        return None

    def symbols(self) -> set[str]:
        out: set[str] = set()
        for m, _ in self.terms:
            for a in m:
                if isinstance(a, Symbol):
                    out.add(a.name)
                else:
                    out |= a.num.symbols()
        return out

    def as_monomial(self) -> tuple[int, Monomial] | None:
        """``(coeff, monomial)`` when the expression is a single product term."""
        if len(self.terms) == 1:
            m, c = self.terms[0]
            return c, m
        if not self.terms:
            return 0, ()
        return None

    # -- arithmetic ---------------------------------------------------------
    def __add__(self, other: DimLike) -> SymExpr:
        other = as_expr(other)
        acc = dict(self.terms)
        for m, c in other.terms:
            acc[m] = acc.get(m, 0) + c
        return SymExpr.from_terms(acc)

    __radd__ = __add__

    def __neg__(self) -> SymExpr:
        return SymExpr.from_terms({m: -c for m, c in self.terms})

    def __sub__(self, other: DimLike) -> SymExpr:
        return self + (-as_expr(other))

    def __rsub__(self, other: DimLike) -> SymExpr:
        return as_expr(other) - self

    def __mul__(self, other: DimLike) -> SymExpr:
        other = as_expr(other)
        acc: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                m = tuple(sorted(m1 + m2, key=_atom_key))
                acc[m] = acc.get(m, 0) + c1 * c2
        return SymExpr.from_terms(acc)

    __rmul__ = __mul__

    def __floordiv__(self, other: DimLike) -> SymExpr:
        other = as_expr(other)
        if not other.is_const:
            quotient = exact_divide(self, other)
            if quotient is None:
                raise ValueError(f"cannot floor-divide {self} by non-constant {other}")
            return quotient
        den = other.const_value
        if den <= 0:
            raise ValueError(f"floor division by non-positive constant {den}")
        if den == 1:
            return self
        if all(c % den == 0 for _, c in self.terms):
            return SymExpr.from_terms({m: c // den for m, c in self.terms})
        if self.is_const:
            return SymExpr.const(self.const_value // den)
        return _floordiv_const(self, den)

    def __rfloordiv__(self, other: DimLike) -> SymExpr:
        return as_expr(other) // self

    def __mod__(self, other: DimLike) -> SymExpr:
        return self - (self // other) * other

    def __rmod__(self, other: DimLike) -> SymExpr:
        return as_expr(other) % self

    def ceildiv(self, other: int) -> SymExpr:
        return (self + (other - 1)) // other

    # -- evaluation and substitution ---------------------------------------
    def evaluate(self, env: Mapping[str, int]) -> int:
        total = 0
        for m, c in self.terms:
            prod = c
            for a in m:
                prod *= env[a.name] if isinstance(a, Symbol) else a.num.evaluate(env) // a.den
            total += prod
        return total

    def substitute(self, mapping: Mapping[str, SymExpr]) -> SymExpr:
        if not mapping or not (self.symbols() & mapping.keys()):
            return self
        total = SymExpr.const(0)
        for m, c in self.terms:
            prod = SymExpr.const(c)
            for a in m:
                if isinstance(a, Symbol):
                    prod = prod * mapping.get(a.name, SymExpr.atom(a))
                else:
                    prod = prod * (a.num.substitute(mapping) // a.den)
            total = total + prod
        return total

    def __str__(self) -> str:
        if self._text is None:
            object.__setattr__(self, "_text", self._format())
        return self._text  # type: ignore[return-value]

    def _format(self) -> str:
        if not self.terms:
            return "0"
        parts: list[str] = []
        # Print non-constant terms first so "s0 + 1" reads naturally.
        ordered = [t for t in self.terms if t[0] != ()] + [t for t in self.terms if t[0] == ()]
        for i, (m, c) in enumerate(ordered):
            # A floor division is parenthesised inside a product: "3*(x//2)",
            # because the parser reads "3*x//2" left to right as (3*x)//2.
            lone = len(m) == 1 and abs(c) == 1
            body = "*".join(str(a) if isinstance(a, Symbol) or lone else f"({a})" for a in m)
            if not body:
                text = str(abs(c))
            elif abs(c) == 1:
                text = body
            else:
                text = f"{abs(c)}*{body}"
            if i == 0:
                parts.append(("-" if c < 0 else "") + text)
            else:
                parts.append((" - " if c < 0 else " + ") + text)
        return "".join(parts)

    def __repr__(self) -> str:
        return f"SymExpr({self})"


DimLike = Union[int, SymExpr]


def _floordiv_const(num: SymExpr, den: int) -> SymExpr:
    """Canonical ``num // den`` for a constant ``den > 1`` and non-constant ``num``.

    Every step is an identity of floor division over the integers (all atoms
    are integer valued), so the result equals ``num // den`` at every point:

    * ``(den*q*m + r*m + ...) // den == q*m + (r*m + ...) // den`` for each
      term: coefficients (and the constant) of the remainder lie in ``[0, den)``;
    * ``(g*y + r) // (g*e) == (y + r // g) // e`` for integer ``y`` and a
      constant ``0 <= r < g*e``: ``g`` is the gcd of ``den`` and the
      remainder's non-constant coefficients (so ``(2*x + 1)//4 == x//2``);
    * ``(n//a + p) // b == (n + a*p) // (a*b)`` for integer ``p``: a nested
      floor division is absorbed when it is the only one in the remainder
      and has coefficient 1 (so the choice is unique and the form canonical).
    """
    exact: dict[Monomial, int] = {}
    rest: dict[Monomial, int] = {}
    for m, c in num.terms:
        q, r = divmod(c, den)
        if q:
            exact[m] = q
        if r:
            rest[m] = r
    quotient = SymExpr.from_terms(exact)
    if not rest or (len(rest) == 1 and () in rest):
        return quotient  # the remainder lies in [0, den): its quotient is 0
    g = den
    for m, c in rest.items():
        if m != ():
            g = math.gcd(g, c)
    if g > 1:
        const = rest.pop((), 0) // g
        rest = {m: c // g for m, c in rest.items()}
        if const:
            rest[()] = const
        den //= g
    if den == 1:
        return quotient + SymExpr.from_terms(rest)
    with_div = [m for m in rest if any(isinstance(a, FloorDiv) for a in m)]
    if len(with_div) == 1 and len(with_div[0]) == 1 and rest[with_div[0]] == 1:
        inner = with_div[0][0]
        assert isinstance(inner, FloorDiv)
        others = SymExpr.from_terms({m: c for m, c in rest.items() if m != with_div[0]})
        return quotient + (inner.num + others * inner.den) // (inner.den * den)
    return quotient + SymExpr.atom(FloorDiv(SymExpr.from_terms(rest), den))


def as_expr(d: DimLike) -> SymExpr:
    if isinstance(d, SymExpr):
        return d
    if isinstance(d, bool) or not isinstance(d, int):
        raise TypeError(f"not a dimension: {d!r}")
    return SymExpr.const(d)


def simplify_dim(d: DimLike) -> DimLike:
    """Static dims stay plain ints so mixed static/dynamic shapes print as ``[s0, 128]``."""
    if type(d) is int:  # the common case, and already simple
        return d
    e = as_expr(d)
    return e.const_value if e.is_const else e


def dim_str(d: DimLike) -> str:
    return str(d)


def exact_divide(num: SymExpr, den: SymExpr) -> SymExpr | None:
    """``num / den`` when it is a polynomial: ``den`` a single monomial dividing every term of
    ``num``, or a sum whose multiple by one monomial is ``num``.

    This is the cancellation of common factors used by reshape with ``-1``
    (``[a, b, 64] -> [a*b, -1]`` gives ``64``; a padded size over its window count,
    ``4*(h - 3*h//4)`` over ``h - 3*h//4``, gives ``4``); ``None`` when not exact.
    """
    mono = den.as_monomial()
    if mono is None:
        if not den.terms:
            return None
        # Each quotient candidate divides one term of num by den's first term.
        first = SymExpr.from_terms(dict(den.terms[:1]))
        for m, c in num.terms:
            q = exact_divide(SymExpr.from_terms({m: c}), first)
            if q is not None and den * q == num:
                return q
        return None
    dc, dm = mono
    if dc == 0:
        return None
    out: dict[Monomial, int] = {}
    for m, c in num.terms:
        if c % dc:
            return None
        rest = list(m)
        for a in dm:
            if a not in rest:
                return None
            rest.remove(a)
        out[tuple(rest)] = out.get(tuple(rest), 0) + c // dc
    return SymExpr.from_terms(out)


def monomial_gcd(a: SymExpr, b: SymExpr) -> SymExpr:
    """Greatest common single-term factor of two product expressions (``1`` if none)."""
    ma, mb = a.as_monomial(), b.as_monomial()
    if ma is None or mb is None or ma[0] == 0 or mb[0] == 0:
        return SymExpr.const(1)
    rest = list(mb[1])
    common: list[Atom] = []
    for atom in ma[1]:
        if atom in rest:
            rest.remove(atom)
            common.append(atom)
    g = math.gcd(ma[0], mb[0])
    return SymExpr.from_terms({tuple(sorted(common, key=_atom_key)): g})


def product(dims: Iterable[DimLike]) -> SymExpr:
    out = SymExpr.const(1)
    for d in dims:
        out = out * as_expr(d)
    return out


# -- parsing ------------------------------------------------------------------
_NAME = r"[A-Za-z_][A-Za-z_0-9]*"  # a symbol's name, as the IR's text writes and reads it
_TOKEN = re.compile(rf"\s*(?:(\d+)|({_NAME})|(//|[-+*%()]))")
_SYMBOL_NAME = re.compile(_NAME)
SYMBOL_NAME_RULE = "ASCII letters, digits and _, not starting with a digit"


def is_symbol_name(name: str) -> bool:
    """Can ``name`` name a symbol in the IR's text (and so in a saved program)?"""
    return isinstance(name, str) and _SYMBOL_NAME.fullmatch(name) is not None


def symbol_name_like(text: str, taken: Iterable[str]) -> str:
    """A symbol name close to ``text`` (a model's own dim name, which may hold spaces or
    operators) that is none of ``taken``."""
    base = re.sub(r"[^A-Za-z_0-9]+", "_", text).strip("_") or "d"
    if base[0].isdigit():
        base = f"d_{base}"
    taken = set(taken)
    name, i = base, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    return name


def parse_expr(text: str) -> SymExpr:
    """Parse the printed form of an expression (``s0*s1 + 3``, ``(s0 - 1)//2 + 1``)."""
    tokens: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"bad dimension expression {text!r} at {pos}")
        tokens.append(m.group(1) or m.group(2) or m.group(3))
        pos = m.end()
    parser = _ExprParser(tokens, text)
    expr = parser.parse_sum()
    if parser.i != len(tokens):
        raise ValueError(f"trailing input in dimension expression {text!r}")
    return expr


class _ExprParser:
    def __init__(self, tokens: list[str], text: str) -> None:
        self.tokens, self.text, self.i = tokens, text, 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ValueError(f"unexpected end of dimension expression {self.text!r}")
        self.i += 1
        return tok

    def parse_sum(self) -> SymExpr:
        sign = 1
        if self.peek() == "-":
            self.take()
            sign = -1
        acc = self.parse_product() * sign
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.parse_product()
            acc = acc + rhs if op == "+" else acc - rhs
        return acc

    def parse_product(self) -> SymExpr:
        acc = self.parse_atom()
        while self.peek() in ("*", "//", "%"):
            op = self.take()
            rhs = self.parse_atom()
            if op == "*":
                acc = acc * rhs
            elif op == "//":
                acc = acc // rhs
            else:
                acc = acc % rhs
        return acc

    def parse_atom(self) -> SymExpr:
        tok = self.take()
        if tok == "(":
            inner = self.parse_sum()
            if self.take() != ")":
                raise ValueError(f"missing ')' in {self.text!r}")
            return inner
        if tok.isdigit():
            return SymExpr.const(int(tok))
        if tok[0].isalpha() or tok[0] == "_":
            return SymExpr.symbol(tok)
        raise ValueError(f"unexpected {tok!r} in dimension expression {self.text!r}")
