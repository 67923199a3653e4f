"""Property tests of the symbolic dim algebra against brute-force integer evaluation.

Expressions are generated as trees and evaluated two ways: directly with
Python integers (the ground truth, floor division included) and through the
canonical ``SymExpr``. Canonical forms must agree with the ground truth at
every point, survive printing and parsing, and (for polynomials, where it is
decidable) be equal exactly when the functions are.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disc.shape.expr import FloorDiv, SymExpr, as_expr, exact_divide, monomial_gcd, parse_expr, product, simplify_dim

SYMS = ("a", "b", "c")
S = {n: SymExpr.symbol(n) for n in SYMS}
settings.register_profile("disc_expr", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("disc_expr")


# -- expression trees ----------------------------------------------------------------------
# A tree is ("sym", name) | ("int", k) | (op, lhs, rhs) for + - * | ("div", sub, k) | ("neg", sub).
def trees(with_div: bool, max_leaves: int = 6):
    leaf = st.one_of(st.sampled_from([("sym", n) for n in SYMS]), st.integers(-5, 7).map(lambda k: ("int", k)))

    def extend(inner):
        options = [
            st.tuples(st.sampled_from(["+", "-", "*"]), inner, inner),
            st.tuples(st.just("neg"), inner),
        ]
        if with_div:
            options.append(st.tuples(st.just("div"), inner, st.integers(1, 6)))
        return st.one_of(*options)

    return st.recursive(leaf, extend, max_leaves=max_leaves)


def build(t) -> SymExpr:
    kind = t[0]
    if kind == "sym":
        return S[t[1]]
    if kind == "int":
        return SymExpr.const(t[1])
    if kind == "neg":
        return -build(t[1])
    if kind == "div":
        return build(t[1]) // t[2]
    a, b = build(t[1]), build(t[2])
    return a + b if kind == "+" else a - b if kind == "-" else a * b


def ev(t, env) -> int:
    kind = t[0]
    if kind == "sym":
        return env[t[1]]
    if kind == "int":
        return t[1]
    if kind == "neg":
        return -ev(t[1], env)
    if kind == "div":
        return ev(t[1], env) // t[2]
    a, b = ev(t[1], env), ev(t[2], env)
    return a + b if kind == "+" else a - b if kind == "-" else a * b


def degree(t) -> int:
    kind = t[0]
    if kind == "sym":
        return 1
    if kind == "int":
        return 0
    if kind in ("neg", "div"):
        return degree(t[1])
    if kind == "*":
        return degree(t[1]) + degree(t[2])
    return max(degree(t[1]), degree(t[2]))


# Sample points include negative values: every canonicalization step is an
# identity over all integers, not only over sizes.
POINTS = [dict(zip(SYMS, p)) for p in itertools.product(range(-4, 6), repeat=3)][::7]
SMALL = [dict(zip(SYMS, p)) for p in itertools.product(range(-3, 4), repeat=3)]


# -- canonical form vs ground truth ----------------------------------------------------------
@given(trees(with_div=True))
def test_canonical_form_evaluates_like_the_tree(t):
    e = build(t)
    for env in POINTS:
        assert e.evaluate(env) == ev(t, env), (t, str(e), env)


@given(trees(with_div=True))
def test_print_parse_round_trip(t):
    e = build(t)
    assert parse_expr(str(e)) == e, str(e)
    assert hash(parse_expr(str(e))) == hash(e)


@given(trees(with_div=False), trees(with_div=False))
def test_polynomials_equal_iff_equal_as_functions(t1, t2):
    # A polynomial of degree <= d in each variable that vanishes on a grid of
    # d + 1 values per variable is zero, so a large enough grid decides equality.
    d = max(degree(t1), degree(t2))
    grid = range(-(d // 2) - 1, d - d // 2 + 1)
    same = all(ev(t1, env) == ev(t2, env) for env in (dict(zip(SYMS, p)) for p in itertools.product(grid, repeat=3)))
    assert (build(t1) == build(t2)) == same, (str(build(t1)), str(build(t2)))


@given(trees(with_div=True), trees(with_div=True))
def test_equal_canonical_forms_are_equal_functions(t1, t2):
    e1, e2 = build(t1), build(t2)
    if e1 == e2:
        assert all(ev(t1, env) == ev(t2, env) for env in SMALL)


@given(
    st.integers(-6, 6),
    st.integers(-9, 9),
    st.integers(1, 6),
    st.integers(-3, 3),
    st.integers(-6, 6),
    st.integers(-9, 9),
    st.integers(1, 6),
    st.integers(-3, 3),
)
def test_affine_floordiv_family_is_canonical(p1, q1, d1, c1, p2, q2, d2, c2):
    # c*x + (p*x + q)//d in one variable: equal as functions iff equal canonically.
    x = S["a"]
    e1 = c1 * x + (p1 * x + q1) // d1
    e2 = c2 * x + (p2 * x + q2) // d2
    f1 = [c1 * v + (p1 * v + q1) // d1 for v in range(-80, 80)]
    f2 = [c2 * v + (p2 * v + q2) // d2 for v in range(-80, 80)]
    assert (e1 == e2) == (f1 == f2), (str(e1), str(e2))


@given(trees(with_div=True), st.dictionaries(st.sampled_from(SYMS), trees(with_div=True, max_leaves=3), max_size=3))
def test_substitution_commutes_with_evaluation(t, mapping_trees):
    e = build(t)
    mapping = {k: build(v) for k, v in mapping_trees.items()}
    sub = e.substitute(mapping)
    for env in POINTS[::3]:
        inner = dict(env)
        for k, v in mapping_trees.items():
            inner[k] = ev(v, env)
        assert sub.evaluate(env) == ev(t, inner)


@given(trees(with_div=True), st.integers(1, 7))
def test_mod_and_ceildiv(t, k):
    e = build(t)
    for env in POINTS[::2]:
        v = ev(t, env)
        assert (e % k).evaluate(env) == v % k
        assert e.ceildiv(k).evaluate(env) == -((-v) // k)


# -- exact division, gcd, helpers ---------------------------------------------------------------
@given(trees(with_div=False, max_leaves=4), st.sampled_from([S["a"], S["b"] * S["c"], 3 * S["a"], SymExpr.const(4), -2 * S["b"]]))
def test_exact_divide_is_exact(t, den):
    num = build(t) * den
    q = exact_divide(num, den)
    assert q is not None and q * den == num
    assert num // den == q


def test_exact_divide_by_a_sum_finds_a_monomial_quotient():
    # Swin's window size: its padded side 4*ceil(h/4), written 4*(h - 3*h//4), over the window count
    a, b = S["a"], S["b"]
    windows = a - (3 * a) // 4
    assert exact_divide(4 * a - 4 * ((3 * a) // 4), windows) == SymExpr.const(4)
    assert exact_divide(b * windows * 3, windows) == 3 * b
    assert exact_divide(windows, windows) == SymExpr.const(1)
    assert exact_divide(windows + 1, windows) is None
    assert exact_divide(a * a + b * b, a + b) is None  # (a + b)^2 - 2ab: no monomial multiple
    assert (4 * a - 4 * ((3 * a) // 4)) // windows == SymExpr.const(4)


def test_exact_divide_refuses_inexact():
    a, b = S["a"], S["b"]
    assert exact_divide(a * b + 1, a) is None
    assert exact_divide(3 * a, SymExpr.const(2)) is None
    assert exact_divide(a, a + b) is None
    assert exact_divide(a, SymExpr.const(0)) is None
    with pytest.raises(ValueError):
        _ = (a + 1) // b
    with pytest.raises(ValueError):
        _ = a // 0


def test_monomial_gcd_and_product():
    a, b, c = S["a"], S["b"], S["c"]
    assert monomial_gcd(6 * a * a * b, 4 * a * c) == 2 * a
    assert monomial_gcd(a + 1, a) == SymExpr.const(1)
    assert product([a, 2, b]) == 2 * a * b
    assert simplify_dim(SymExpr.const(5)) == 5 and isinstance(simplify_dim(a), SymExpr)


@pytest.mark.parametrize(
    "lhs, rhs",
    [
        ("(a + 5)//4", "(a + 1)//4 + 1"),
        ("a//2//3", "a//6"),
        ("(a//2 + 1)//3", "(a + 2)//6"),
        ("(2*a + 2)//4", "(a + 1)//2"),
        ("(2*a + 1)//4", "a//2"),
        ("(5*a + 1)//4", "a + (a + 1)//4"),
        ("(4*a)//2", "2*a"),
        ("a//1", "a"),
        ("(a - 3)//2 + 1", "(a - 1)//2"),
        ("-a//2", "-(a//2)"),
        ("(-a)//2", "-a + a//2"),
        ("a % 3", "a - 3*(a//3)"),
        ("a*b//b", "a"),
        ("(a*b + a)//a", "b + 1"),
    ],
)
def test_known_identities_are_canonical(lhs, rhs):
    assert parse_expr(lhs) == parse_expr(rhs)


def test_canonical_form_is_incomplete_for_sums_of_floors():
    # a//2 + (a+1)//2 == a for every integer, but the canonical form keeps
    # floor atoms apart: such forms only ever compare as "not proven equal".
    a = S["a"]
    e = a // 2 + (a + 1) // 2
    assert all(e.evaluate({"a": v}) == v for v in range(-9, 9))
    assert e != a


def test_printing_keeps_floor_division_precedence():
    a, b = S["a"], S["b"]
    assert str(3 * ((a + 1) // 2)) == "3*((a + 1)//2)"
    assert str(b * (a // 2)) == "b*(a//2)"
    assert str(-(a // 2)) == "-a//2" and parse_expr("-a//2") == -(a // 2)
    assert str(a * b + 3) == "a*b + 3"
    assert str(SymExpr.const(0)) == "0"
    assert str(2 - a) == "-a + 2"


def test_inspection():
    a, b = S["a"], S["b"]
    e = 2 * a * b + (a + 1) // 2 - 3
    assert e.symbols() == {"a", "b"}
    assert e.const_value == -3 and not e.is_const
    assert SymExpr.const(7).is_const and SymExpr.const(7).const_value == 7
    assert a.as_symbol() == "a" and (2 * a).as_symbol() is None
    assert (3 * a * b).as_monomial() == (3, (a.terms[0][0][0], b.terms[0][0][0]))
    assert isinstance(((a + 1) // 2).terms[0][0][0], FloorDiv)
    assert as_expr(4) == SymExpr.const(4)
    with pytest.raises(TypeError):
        as_expr(True)
    assert 7 // SymExpr.const(2) == SymExpr.const(3) and 7 % SymExpr.const(4) == SymExpr.const(3)


@pytest.mark.parametrize("text", ["a +", "(a", "a b", "2a", "a $ b", ""])
def test_parse_errors(text):
    with pytest.raises(ValueError):
        parse_expr(text)


def test_large_coefficients_stay_exact():
    a = S["a"]
    big = 2**70
    e = big * a + 1
    assert e.evaluate({"a": 3}) == 3 * big + 1
    assert parse_expr(str(e)) == e
    assert (e // big) == a
    assert math.gcd(big, 6) == 2
