"""Symbolic dims printed as C++: every dim of the program is an expression over the
root symbols, which the generated host code computes once per call from the
input shapes into a ``Shapes`` struct (``s.batch``, ``s.seq``...)."""

from __future__ import annotations

import re

from disc.shape.constraints import ShapeConstraints
from disc.shape.expr import DimLike, FloorDiv, SymExpr, as_expr

# Members of the generated Shapes struct that are not dims (program.py declares them).
RESERVED_FIELDS = frozenset({"fault"})

# Dim names are the user's (``dynamic={"ids": {1: "new"}}``); as field names these would not
# compile: C++'s keywords and alternative tokens, and lowercase names GCC or libc define as macros.
CPP_RESERVED = frozenset(
    """alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t
    class compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield
    decltype default delete do double dynamic_cast else enum explicit export extern false float for friend
    goto if inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private
    protected public register reinterpret_cast requires return short signed sizeof static static_assert
    static_cast struct switch template this thread_local throw true try typedef typeid typename union
    unsigned using virtual void volatile wchar_t while xor xor_eq
    unix linux i386 errno stdin stdout stderr""".split()
)


def _unsafe_field(ident: str) -> bool:
    """A name that could not be a Shapes member as it is: not a letter first, a C++ word, or no
    lowercase letter at all (``N``, ``EOF``: the spelling of macros)."""
    return not ident[:1].isalpha() or ident in CPP_RESERVED or ident in RESERVED_FIELDS or ident == ident.upper()


class SymbolNames:
    """C identifiers for the root symbols a program uses (``s.<name>``)."""

    def __init__(self, c: ShapeConstraints) -> None:
        self.c = c
        self.fields: dict[str, str] = {}  # root symbol -> C field name

    def field(self, sym: str) -> str:
        root = self.c.find(sym)
        if root not in self.fields:
            ident = re.sub(r"\W", "_", root)
            if ident in self.fields.values() or _unsafe_field(ident):
                ident = f"d{len(self.fields)}_{ident}"
            self.fields[root] = ident
        return self.fields[root]

    def expr(self, d: DimLike, prefix: str = "s.") -> str:
        """C++ for a dim (int64 arithmetic), after normalising to root symbols."""
        e = self.c.normalize(as_expr(d))
        return self._poly(e, prefix)

    def _poly(self, e: SymExpr, prefix: str) -> str:
        if e.is_const:
            return str(e.const_value)
        parts = []
        for mono, coeff in e.terms:
            factors = [self._atom(a, prefix) for a in mono]
            if coeff != 1 or not factors:
                factors.insert(0, str(coeff))
            parts.append(" * ".join(factors))
        text = " + ".join(parts).replace("+ -", "- ")
        return f"({text})" if len(parts) > 1 else text

    def _atom(self, a, prefix: str) -> str:
        if isinstance(a, FloorDiv):
            return f"disc_floordiv_i({self._poly(a.num, prefix)}, {a.den})"
        return prefix + self.field(a.name)


def c_product(xs: list[str]) -> str:
    xs = [x for x in xs if x != "1"]
    if not xs:
        return "1"
    if "0" in xs:
        return "0"
    return " * ".join(f"({x})" if " " in x and not x.startswith("(") else x for x in xs)
