"""Tests of ShapeConstraints: scenarios from op semantics, and soundness by brute force.

The soundness properties build a random constraint set (symbol ranges and
divisors, equalities between small expressions, runtime assumptions), then
enumerate every assignment of the symbols in a small box that satisfies all
recorded facts. Whatever a ``prove_*`` query claims must hold for each of
them, ``bounds`` must contain every value, and ``normalize`` must not change
any value. (Checking a finite box only samples the claim "for all values",
which is what makes it a sound test of a sound prover.)
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disc.shape.constraints import INF, RuntimeCheck, ShapeConstraints, is_static
from disc.shape.expr import SymExpr, parse_expr

settings.register_profile("disc_constraints", max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("disc_constraints")

NAMES = ("a", "b", "c", "d")
BOX = range(5)


# -- random expressions -------------------------------------------------------------------------
def trees(max_leaves: int = 4):
    leaf = st.one_of(st.sampled_from([("sym", n) for n in NAMES]), st.integers(0, 4).map(lambda k: ("int", k)))

    def extend(inner):
        return st.one_of(
            st.tuples(st.sampled_from(["+", "-", "*"]), inner, inner),
            st.tuples(st.just("div"), inner, st.integers(1, 4)),
        )

    return st.recursive(leaf, extend, max_leaves=max_leaves)


def build(t) -> SymExpr:
    if t[0] == "sym":
        return SymExpr.symbol(t[1])
    if t[0] == "int":
        return SymExpr.const(t[1])
    if t[0] == "div":
        return build(t[1]) // t[2]
    a, b = build(t[1]), build(t[2])
    return a + b if t[0] == "+" else a - b if t[0] == "-" else a * b


def source(t) -> str:
    if t[0] == "sym":
        return t[1]
    if t[0] == "int":
        return str(t[1])
    if t[0] == "div":
        return f"({source(t[1])}) // {t[2]}"
    return f"({source(t[1])}) {t[0]} ({source(t[2])})"


def compile_tree(t):
    """Ground truth: the tree as a Python function of the assignment (independent of SymExpr)."""
    return eval(f"lambda a, b, c, d: {source(t)}")


symbol_facts = st.tuples(st.integers(0, 2), st.one_of(st.none(), st.integers(2, 4)), st.sampled_from([1, 1, 2]))
checks = st.tuples(st.sampled_from(NAMES), st.sampled_from([">=", "!=", "%"]), st.integers(1, 3))


@st.composite
def scenarios(draw):
    facts = {n: draw(symbol_facts) for n in NAMES}
    equalities = draw(st.lists(st.tuples(trees(), trees()), min_size=1, max_size=4))
    assumptions = draw(st.lists(checks, max_size=2))
    return facts, equalities, assumptions


def setup(scenario):
    """The constraint set, and every assignment in the box consistent with it."""
    facts, equalities, assumptions = scenario
    c = ShapeConstraints()
    for n in NAMES:
        lo, hi, div = facts[n]
        c.declare(n, lo=lo, hi=hi, divisor=div)
    envs = [
        dict(zip(NAMES, vals))
        for vals in itertools.product(BOX, repeat=len(NAMES))
        if all(facts[n][0] <= v and (facts[n][1] is None or v <= facts[n][1]) and v % facts[n][2] == 0 for n, v in zip(NAMES, vals))
    ]
    for lhs, rhs in equalities:
        fl, fr = compile_tree(lhs), compile_tree(rhs)
        if c.add_equal(build(lhs), build(rhs)):
            envs = [e for e in envs if fl(**e) == fr(**e)]
        else:
            # "provably different": no assignment satisfying the facts so far makes them equal
            assert all(fl(**e) != fr(**e) for e in envs), (source(lhs), source(rhs))
    for name, op, k in assumptions:
        check = c.assume(SymExpr.symbol(name), op, k, "test")
        envs = [e for e in envs if check.holds(e)]
    return c, envs


# -- soundness ---------------------------------------------------------------------------------------
@given(scenarios(), st.lists(trees(), min_size=2, max_size=4))
def test_proofs_are_sound(scenario, queries):
    c, envs = setup(scenario)
    fns = [compile_tree(q) for q in queries]
    exprs = [build(q) for q in queries]
    values = [[f(**e) for e in envs] for f in fns]
    for i, (x, vx) in enumerate(zip(exprs, values)):
        # normalize never changes a value
        nx = c.normalize(x)
        assert all(nx.evaluate(e) == v for e, v in zip(envs, vx)), (str(x), str(nx))
        lo, hi = c.bounds(x)
        assert all(lo <= v <= hi for v in vx), (str(x), lo, hi)
        if c.prove_nonzero(x):
            assert 0 not in vx
        if c.prove_is_one(x):
            assert all(v == 1 for v in vx)
        if c.prove_not_one(x):
            assert 1 not in vx
        for k in (2, 3, 4):
            if c.prove_divisible(x, k):
                assert all(v % k == 0 for v in vx), (str(x), k)
        for y, vy in zip(exprs[i + 1 :], values[i + 1 :]):
            if c.prove_equal(x, y):
                assert vx == vy, (str(x), str(y))
            if c.prove_not_equal(x, y):
                assert all(p != q for p, q in zip(vx, vy)), (str(x), str(y))
            if c.prove_ge(x, y):
                assert all(p >= q for p, q in zip(vx, vy)), (str(x), str(y))
    if len(exprs) >= 4:
        a, b = exprs[:2], exprs[2:4]
        if c.prove_same_numel(a, b):
            assert all(fns[0](**e) * fns[1](**e) == fns[2](**e) * fns[3](**e) for e in envs)
        if c.prove_same_shape(a, b):
            assert values[0] == values[2] and values[1] == values[3]


@given(scenarios(), st.lists(trees(), min_size=1, max_size=3))
def test_copy_is_independent_and_equivalent(scenario, queries):
    c, _ = setup(scenario)
    d = c.copy()
    for q in queries:
        assert d.normalize(build(q)) == c.normalize(build(q))
        assert d.bounds(build(q)) == c.bounds(build(q))
    before = c.describe()
    d.add_equal(SymExpr.symbol("a"), SymExpr.symbol("b"))
    d.new_symbol()
    assert c.describe() == before


# -- union-find -------------------------------------------------------------------------------------
def fresh(**ranges) -> tuple[ShapeConstraints, dict[str, SymExpr]]:
    c = ShapeConstraints()
    syms = {}
    for name, spec in ranges.items():
        lo, hi, div = (tuple(spec) + (None, 1)[len(spec) - 1 :])[:3] if isinstance(spec, tuple) else (spec, None, 1)
        syms[name] = c.declare(name, lo=lo, hi=hi, divisor=div)
    return c, syms


def test_union_find_merges_facts_and_keeps_older_root():
    c, s = fresh(a=(1, 100, 2), b=(3, 50, 3), e=1)
    assert c.add_equal(s["b"], s["a"])
    assert c.find("b") == "a" and c.find("a") == "a"
    f = c.facts["a"]
    assert (f.lo, f.hi, f.divisor) == (3, 50, 6)
    assert c.bounds(s["b"]) == (6, 48)  # rounded to multiples of 6
    assert c.prove_divisible(s["b"] * s["e"], 3)
    assert c.prove_equal(s["a"] + 1, s["b"] + 1)
    assert c.equal_classes() == [["a", "b"]]
    assert not c.prove_equal(s["a"], s["e"])


def test_transitive_equalities_and_definitions():
    c, s = fresh(a=1, b=1, x=1, y=1, z=1)
    a, b, x, y, z = (s[k] for k in "abxyz")
    assert c.add_equal(x, y) and c.add_equal(y, z)
    assert c.prove_equal(x, z)
    assert c.add_equal(z, a * b)  # definition: x == a*b
    assert c.prove_equal(x * 2, 2 * a * b)
    assert c.normalize(y) == a * b
    assert c.add_equal(a, 8) and c.normalize(x) == 8 * b


def test_provably_different_equalities_are_refused():
    c, s = fresh(a=1, b=(1, 3))
    assert not c.add_equal(s["a"] + 1, s["a"])
    assert not c.add_equal(s["b"], 5)
    assert not c.add_equal(2 * s["a"], 2 * s["b"] + 1)  # parity
    assert c.describe() == ["a in [1, inf]", "b in [1, 3]"]


# -- products: reshape -------------------------------------------------------------------------------
def test_reshape_round_trip_by_definition():
    # reshape [a, b] -> [-1] gives a new symbol s == a*b; reshaping back proves the count.
    c, s = fresh(a=1, b=1)
    n = c.new_symbol(lo=0, source="reshape")
    assert c.add_equal(n, s["a"] * s["b"])
    assert c.prove_same_numel([n], [s["a"], s["b"]])
    assert c.prove_same_numel([s["b"], s["a"], 4], [n * 2, 2])


def test_reshape_product_equality_with_cancellation():
    # reshape [a, b] -> [c, d] records a*b == c*d; it cannot be oriented.
    c, s = fresh(a=1, b=1, c=1, d=1, k=1)
    a, b, cc, d, k = (s[x] for x in "abcdk")
    assert c.add_equal(a * b, cc * d)
    assert c.product_equalities == [(a * b, cc * d)]
    assert c.prove_same_numel([cc, d], [a, b])
    assert c.prove_same_numel([a, b, k, 64], [k, cc, 64, d])  # common factors cancel
    assert c.prove_equal(3 * a * b + k, 3 * cc * d + k)
    assert not c.prove_equal(a, cc)
    assert not c.prove_same_numel([a, b], [cc])


def test_reshape_groups_split_at_every_proven_equal_prefix():
    c, s = fresh(b=1, s=1, a=1, z=1)
    b, sq, a, z = s["b"], s["s"], s["a"], s["z"]
    # rows (b*s) and columns (256 = 4*64) move separately
    assert c.reshape_groups([b * sq, 256], [b, sq, 4, 64]) == [(range(0, 1), range(0, 2)), (range(1, 2), range(2, 4))]
    assert c.reshape_groups([b, sq, 4, 64], [b * sq, 256]) == [(range(0, 2), range(0, 1)), (range(2, 4), range(1, 2))]
    # dims proven 1 belong to no group; a 1 between two dims joins their group
    assert c.reshape_groups([1, b, 1, sq], [b, sq, 1]) == [(range(1, 2), range(0, 1)), (range(3, 4), range(1, 2))]
    assert c.reshape_groups([b, 1, sq], [b * sq]) == [(range(0, 3), range(0, 1))]
    # a swap of unrelated symbols is one group; unequal counts cannot be matched
    assert c.reshape_groups([b, sq], [sq, b]) == [(range(0, 2), range(0, 2))]
    assert c.reshape_groups([a], [z]) is None
    assert c.reshape_groups([a, 2], [a]) is None
    # a product equality from the program splits a reshape it did not come from
    c.add_equal(a * z, b * sq)
    assert c.reshape_groups([a * z, 8], [b, sq, 2, 4]) == [(range(0, 1), range(0, 2)), (range(1, 2), range(2, 4))]


def test_product_equalities_chain():
    c, s = fresh(a=1, b=1, c=1, d=1, e=1, f=1)
    a, b, cc, d, e, f = (s[x] for x in "abcdef")
    c.add_equal(a * b, cc * d)
    c.add_equal(cc * d, e * f)
    assert c.prove_equal(a * b, e * f)
    assert c.prove_same_numel([e, 2, f], [2 * a, b])


def test_cancellation_needs_a_nonzero_factor():
    # a*b == a*d does not give b == d when a may be 0.
    c, s = fresh(a=0, b=0, d=0)
    c.add_equal(s["a"] * s["b"], s["a"] * s["d"])
    assert not c.prove_equal(s["b"], s["d"])
    assert c.prove_equal(s["a"] * s["b"] * 5, 5 * s["a"] * s["d"])
    # ... but does when a >= 1, and then the equality is a plain union.
    c, s = fresh(a=1, b=0, d=0)
    c.add_equal(s["a"] * s["b"], s["a"] * s["d"])
    assert c.prove_equal(s["b"], s["d"]) and c.find("d") == "b"
    assert c.product_equalities == []


def test_product_equality_becomes_a_union_later():
    c, s = fresh(a=1, b=1, c=1, d=1)
    c.add_equal(s["a"] * s["b"], s["c"] * s["d"])
    c.add_equal(s["a"], s["c"])  # now a*b == a*d with a >= 1: b == d
    assert c.prove_equal(s["b"], s["d"])
    assert c.product_equalities == []


# -- sums: concat ----------------------------------------------------------------------------------------
def test_concat_sizes():
    c, s = fresh(a=1, b=1, n=0)
    a, b, n = s["a"], s["b"], s["n"]
    assert c.add_equal(n, a + b)  # concat result
    assert c.prove_equal(n - a, b)
    assert c.prove_ge(n, a) and c.prove_ge(n, b + 1)
    assert c.bounds(n) == (2, INF)
    assert not c.prove_ge(a, n)


def test_linear_relation_is_solved():
    c, s = fresh(a=1, b=1)
    assert c.add_equal(s["a"] + s["b"], 8)
    assert c.prove_equal(s["a"], 8 - s["b"])
    assert c.bounds(s["a"]) == (1, 7)  # the facts of a still count, and so does its definition


def test_sum_equalities_compose():
    c, s = fresh(a=1, b=1, c=1, d=1, e=1)
    a, b, cc, d, e = (s[x] for x in "abcde")
    c.add_equal(a + b, cc + d)
    assert c.prove_equal(a + b + e, e + d + cc)
    assert c.prove_equal(2 * (a + b), 2 * d + 2 * cc)


# -- affine / floordiv: conv, pool, slice --------------------------------------------------------------------
def test_conv_and_pool_sizes():
    c, s = fresh(h=1, w=(7, 512))
    h, w = s["h"], s["w"]
    conv = (h + 2 * 1 - 3) // 2 + 1  # kernel 3, stride 2, pad 1
    assert conv == (h + 1) // 2
    assert c.bounds(conv) == (1, INF)
    pool = (w - 2) // 2 + 1
    assert c.bounds(pool) == (3, 256)
    assert c.prove_ge(w, pool) and c.prove_nonzero(pool)
    out = c.new_symbol(source="conv out")
    c.add_equal(out, conv)
    assert c.prove_equal(out * 2, 2 * ((h + 1) // 2))
    assert c.prove_ge(h, out)


def test_slice_sizes():
    c, s = fresh(n=(10, 100))
    n = s["n"]
    size = (n - 2 + 2) // 3  # slice [2:n:3] -> ceil((n - 2) / 3)
    assert c.bounds(size) == (3, 33)
    assert c.prove_not_one(size) and not c.prove_is_one(size)
    assert c.prove_equal(size, (n - 2).ceildiv(3))
    assert c.bounds(n - 3 * size) == (0, 2)  # the remainder, floor kept correlated with n
    assert c.prove_ge(n, 3 * size) and not c.prove_ge(3 * size, n)


def test_bounds_of_products_and_powers():
    c, s = fresh(a=(2, 5), b=(-3, 4), n=(0, 1))
    a, b, n = s["a"], s["b"], s["n"]
    assert c.bounds(a * b) == (-15, 20)
    assert c.bounds(b * b) == (0, 16)
    assert c.bounds(b * b * b) == (-27, 64)
    assert c.bounds(-a + 7) == (2, 5)
    assert c.bounds(n * s["a"] - a) == (-5, 3)
    assert c.bounds(SymExpr.const(3)) == (3, 3)
    huge = 2**62 + 1
    assert c.bounds(a * huge) == (2 * huge, 5 * huge)  # exact, no float rounding


def test_divisibility():
    c, s = fresh(a=(1, None, 4), b=(1, None, 6), e=1)
    a, b, e = s["a"], s["b"], s["e"]
    assert c.prove_divisible(a, 2) and c.prove_divisible(a * e, 4)
    assert c.prove_divisible(a + b, 2) and not c.prove_divisible(a + b, 4)
    assert c.prove_divisible(3 * a + 6 * e, 3) and not c.prove_divisible(e, 2)
    assert c.prove_divisible(e, 1) and c.prove_divisible(e, -1)
    assert c.prove_not_equal(a, 2 * e + 1) and c.prove_not_equal(b + 3, a)
    n = c.new_symbol(lo=0, divisor=8, source="t")
    c.add_equal(n, e * e)
    assert c.prove_divisible(n, 8)  # a defined symbol keeps its divisor
    assert not c.prove_divisible(e * e, 8)


def test_broadcast_noop():
    c, s = fresh(a=1, b=1)
    a, b = s["a"], s["b"]
    assert c.prove_broadcast_noop([a, 4], [a, 4], [0, 1])
    assert not c.prove_broadcast_noop([a, 1], [a, 4], [0, 1])
    assert not c.prove_broadcast_noop([a], [b, a], [1])
    assert not c.prove_broadcast_noop([a, b], [a, b], [1, 0])


# -- assume / RuntimeCheck -----------------------------------------------------------------------------------
def test_runtime_check_holds():
    a, b = SymExpr.symbol("a"), SymExpr.symbol("b")
    assert RuntimeCheck(a, "==", b, "r").holds({"a": 2, "b": 2})
    assert not RuntimeCheck(a, "!=", b, "r").holds({"a": 2, "b": 2})
    assert RuntimeCheck(a, ">=", b + 1, "r").holds({"a": 3, "b": 2})
    assert RuntimeCheck(a, "%", b, "r").holds({"a": 6, "b": 3})
    assert not RuntimeCheck(a, "%", b, "r").holds({"a": 6, "b": 0})
    assert str(RuntimeCheck(a, "%", SymExpr.const(4), "why")) == "a divisible by 4  [why]"
    with pytest.raises(ValueError):
        RuntimeCheck(a, "<", b, "r").holds({"a": 1, "b": 2})


def test_assume_records_checks_used_by_proofs():
    c, s = fresh(a=1, b=1)
    a, b = s["a"], s["b"]
    chk = c.assume(a, "==", b, "add operands")
    assert isinstance(chk, RuntimeCheck) and c.checks == [chk]
    assert c.prove_equal(a, b)
    assert c.assume(a, "==", b, "add operands") is not None and len(c.checks) == 1  # deduplicated
    assert c.describe()[-1] == "checked at run time: a == b  [add operands]"
    assert c.assume(a, "==", b, "another op") is chk and len(c.checks) == 1  # one check per condition, first reason
    c.assume(a, ">=", 4, "speculation")
    assert c.bounds(b) == (4, INF) and c.prove_not_one(a)
    c.assume(b, "%", 8, "vectorize")
    assert c.prove_divisible(a, 8) and c.bounds(a) == (8, INF)
    with pytest.raises(ValueError):
        c.assume(a, "<", b, "bad")


def test_assume_not_equal_tightens_range():
    c, s = fresh(a=(1, 8))
    c.assume(s["a"], "!=", 1, "not broadcast")
    assert c.prove_not_one(s["a"]) and c.bounds(s["a"]) == (2, 8)
    c.assume(8, "!=", s["a"], "x")
    assert c.bounds(s["a"]) == (2, 7)
    c.assume(3, ">=", s["a"], "y")
    assert c.bounds(s["a"]) == (2, 3)


def test_assume_equal():
    c, s = fresh(a=1, b=1, k=(2, 4))
    assert c.assume_equal(s["a"], s["a"], "same") is None
    chk = c.assume_equal(s["a"], s["b"], "matmul k")
    assert chk is not None and chk.op == "==" and c.prove_equal(s["a"], s["b"])
    with pytest.raises(ValueError):
        c.assume_equal(s["k"], 9, "impossible")
    assert len(c.checks) == 1


# -- misc ------------------------------------------------------------------------------------------------------
def test_new_symbol_and_declare():
    c = ShapeConstraints()
    s0 = c.new_symbol()
    s1 = c.new_symbol(lo=1, source="x")
    assert (s0.as_symbol(), s1.as_symbol()) == ("s0", "s1")
    assert c.declare("s1") == s1 and c.facts["s1"].lo == 1
    c.declare("s2")
    assert c.new_symbol().as_symbol() == "s3"
    d = c.copy()
    assert d.new_symbol().as_symbol() not in c.facts


def test_describe_and_static():
    c, s = fresh(a=1, b=(1, 9, 2))
    c.add_equal(s["a"] * 2, c.new_symbol(source="x"))
    lines = c.describe()
    assert lines[:2] == ["a in [1, inf]", "b in [1, 9], multiple of 2"]
    assert "s0 == 2*a" in lines
    assert is_static(3) and is_static(SymExpr.const(3)) and not is_static(s["a"])


def test_parse_of_printed_constraints_round_trips_expressions():
    c, s = fresh(a=1, b=1, c=1, d=1)
    c.add_equal(s["a"] * s["b"], s["c"] * (s["d"] // 2))
    for lhs, rhs in c.product_equalities:
        assert parse_expr(str(lhs)) == lhs and parse_expr(str(rhs)) == rhs


def test_an_unbounded_below_multiple_keeps_minus_infinity():
    """A symbol may be bounded below by -inf (an unprovable min of values, not sizes); rounding its
    ends to its divisor must keep -inf, not make NaN out of inf // divisor."""
    c = ShapeConstraints()
    a = c.new_symbol(name="a", lo=-INF, hi=10, divisor=4)
    assert c.bounds(a) == (-INF, 8)
    assert c.bounds(a * 2 + 1) == (-INF, 17)


def test_example_values_disprove_without_a_search_and_never_prove():
    # The traced example's values (a hint, not a fact): two sizes that differ there cannot be
    # equal, so the product prover is not asked; sizes equal there still need a proof.
    c = ShapeConstraints()
    a, b, cc, d = (c.new_symbol(name=n, lo=1, example=v) for n, v in (("a", 2), ("b", 6), ("c", 3), ("d", 4)))
    c.add_equal(a * b, cc * d)
    assert c.example_value(a * b - cc * d + 5) == 5
    assert c.example_value((a * b + 1) // 4) == 3
    calls = []
    search = c._products_equal
    c._products_equal = lambda x, y, effort: calls.append((x, y)) or search(x, y, effort)
    assert not c.prove_equal(a, cc) and calls == []  # 2 != 3 in the example
    assert c.prove_equal(3 * a * b, 3 * d * cc) and len(calls) == 1
    # equal in the example is no proof: b*c == 18 == 3*b there, yet b*c == 3*b is not implied
    assert not c.prove_equal(b * cc, 3 * b) and len(calls) == 2
    # a symbol without an example gives no value, and the prover decides
    u = c.new_symbol(name="u", lo=1)
    assert c.example_value(u + a) is None
    assert not c.prove_equal(u, a) and len(calls) == 3
