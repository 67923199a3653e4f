"""Golden tests of simplify: exact algebraic identities only."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch
from golden import check_golden

from disc.ir.parser import parse_graph
from disc.passes.simplify import RULES, simplify


def test_identities_with_splat_constants():
    check_golden(
        simplify,
        """
        func @main(%x: f32[a], %p: i1[a]) {
          sym a in [1, inf]  (input 'x' dim 0)
          %0 = dim(%x) {axis=0} : index(a)
          %1 = constant() {dtype="f32", ref=none, value=1.0} : f32[]
          %2 = broadcast_in_dim(%1, %0) {dims=[]} : f32[a]
          %3 = mul(%x, %2) : f32[a]
          %4 = mul(%2, %3) : f32[a]
          %5 = constant() {dtype="f32", ref=none, value=0.0} : f32[]
          %6 = broadcast_in_dim(%5, %0) {dims=[]} : f32[a]
          %7 = add(%4, %6) : f32[a]
          %8 = sub(%7, %6) : f32[a]
          %9 = constant() {dtype="f32", ref=none, value=-0.0} : f32[]
          %10 = broadcast_in_dim(%9, %0) {dims=[]} : f32[a]
          %11 = add(%8, %10) : f32[a]
          %12 = sub(%11, %10) : f32[a]
          %13 = div(%12, %2) : f32[a]
          %14 = neg(%13) : f32[a]
          %15 = neg(%14) : f32[a]
          %16 = select(%p, %15, %15) : f32[a]
          %17 = sub(%16, %14) : f32[a]
          %18 = pow(%17, %2) : f32[a]
          return %18, %12
        }
        """,
        # x*1 and 1*x are x. x + 0.0 stays (-0.0 + 0.0 is +0.0) but x - 0.0 and
        # x + -0.0 go; x - -0.0 stays. x/1, neg(neg(x)), select(p, x, x) and
        # x**1 are x; x - neg(y) is x + y.
        """
        func @main(%x: f32[a], %p: i1[a]) {
          sym a in [1, inf]  (input 'x' dim 0)
          %0 = dim(%x) {axis=0} : index(a)
          %1 = constant() {dtype="f32", ref=none, value=1.0} : f32[]
          %2 = broadcast_in_dim(%1, %0) {dims=[]} : f32[a]
          %5 = constant() {dtype="f32", ref=none, value=0.0} : f32[]
          %6 = broadcast_in_dim(%5, %0) {dims=[]} : f32[a]
          %7 = add(%x, %6) : f32[a]
          %9 = constant() {dtype="f32", ref=none, value=-0.0} : f32[]
          %10 = broadcast_in_dim(%9, %0) {dims=[]} : f32[a]
          %12 = sub(%7, %10) : f32[a]
          %14 = neg(%12) : f32[a]
          %17 = add(%12, %12) : f32[a]
          return %17, %12
        }
        """,
    )


def test_integer_identities():
    check_golden(
        simplify,
        """
        func @main(%i: i32[a]) {
          sym a in [1, inf]  (input 'i' dim 0)
          %0 = dim(%i) {axis=0} : index(a)
          %1 = constant() {dtype="i32", ref=none, value=0} : i32[]
          %2 = broadcast_in_dim(%1, %0) {dims=[]} : i32[a]
          %3 = constant() {dtype="i32", ref=none, value=1} : i32[]
          %4 = broadcast_in_dim(%3, %0) {dims=[]} : i32[a]
          %5 = add(%2, %i) : i32[a]
          %6 = sub(%5, %2) : i32[a]
          %7 = floor_div(%6, %4) : i32[a]
          %8 = floor(%7) : i32[a]
          %9 = bitwise_not(%8) : i32[a]
          %10 = bitwise_not(%9) : i32[a]
          %11 = maximum(%10, %10) : i32[a]
          %12 = bitwise_and(%11, %11) : i32[a]
          %13 = abs(%12) : i32[a]
          %14 = abs(%13) : i32[a]
          %15 = neg(%14) : i32[a]
          %16 = abs(%15) : i32[a]
          return %16, %9
        }
        """,
        # abs(neg(y)) is abs(y), and abs(abs(i)) is abs(i): %16 is %13.
        """
        func @main(%i: i32[a]) {
          sym a in [1, inf]  (input 'i' dim 0)
          %0 = dim(%i) {axis=0} : index(a)
          %1 = constant() {dtype="i32", ref=none, value=0} : i32[]
          %2 = broadcast_in_dim(%1, %0) {dims=[]} : i32[a]
          %3 = constant() {dtype="i32", ref=none, value=1} : i32[]
          %4 = broadcast_in_dim(%3, %0) {dims=[]} : i32[a]
          %9 = bitwise_not(%i) : i32[a]
          %13 = abs(%i) : i32[a]
          %15 = neg(%13) : i32[a]
          return %13, %9
        }
        """,
    )


def test_folds_scalar_constants():
    out = check_golden(
        simplify,
        """
        func @main(%x: f32[a]) {
          sym a in [1, inf]  (input 'x' dim 0)
          %0 = dim(%x) {axis=0} : index(a)
          %1 = constant() {dtype="f32", ref=none, value=2.0} : f32[]
          %2 = constant() {dtype="f32", ref=none, value=3.0} : f32[]
          %3 = mul(%1, %2) : f32[]
          %4 = neg(%3) : f32[]
          %5 = exp(%1) : f32[]
          %6 = lt(%1, %2) : i1[]
          %7 = broadcast_in_dim(%6, %0) {dims=[]} : i1[a]
          %8 = neg(%x) : f32[a]
          %9 = select(%7, %x, %8) : f32[a]
          %10 = convert(%5) {dtype="f16"} : f16[]
          %11 = constant() {dtype="f32", ref=none, value=nan} : f32[]
          %12 = add(%11, %1) : f32[]
          return %9, %4, %10, %12
        }
        """,
        # Results are the ops' reference semantics in the op's dtype: exp(2) is
        # rounded to f32, then to f16. The i1 scalar is a payload constant.
        """
        func @main(%x: f32[a]) {
          sym a in [1, inf]  (input 'x' dim 0)
          %0 = dim(%x) {axis=0} : index(a)
          %1 = constant() {dtype="f32", ref=none, value=2.0} : f32[]
          %2 = constant() {dtype="f32", ref=none, value=3.0} : f32[]
          %3 = constant() {dtype="f32", ref=none, value=6.0} : f32[]
          %4 = constant() {dtype="f32", ref=none, value=-6.0} : f32[]
          %5 = constant() {dtype="f32", ref=none, value=7.389056205749512} : f32[]
          %6 = constant() {dtype="i1", ref="6", value=none} : i1[]
          %7 = broadcast_in_dim(%6, %0) {dims=[]} : i1[a]
          %8 = neg(%x) : f32[a]
          %10 = constant() {dtype="f16", ref=none, value=7.390625} : f16[]
          %11 = constant() {dtype="f32", ref=none, value=nan} : f32[]
          %12 = constant() {dtype="f32", ref=none, value=nan} : f32[]
          return %x, %4, %10, %12
        }
        """,
        constants=None,
    )
    assert out.constants["6"].item() is True


def test_a_weight_narrowed_to_16_bits_is_narrowed_once_when_compiling():
    # autocast: a float32 weight reaches its GEMM through convert(bf16); the folded constant is
    # the reference's rounding (to nearest even), bit for bit, and an activation's convert stays.
    w = torch.randn(4, 3) * 1000 + torch.tensor([[1.00390625, -2.0078125, 3.5]])  # halfway cases among them
    out = check_golden(
        simplify,
        """
        func @main(%x: f32[a, 4]) {
          sym a in [1, inf]  (input 'x' dim 0)
          %0 = constant() {dtype="f32", ref="w", value=none} : f32[4, 3]
          %1 = convert(%0) {dtype="bf16"} : bf16[4, 3]
          %2 = convert(%0) {dtype="f16"} : f16[4, 3]
          %3 = convert(%x) {dtype="bf16"} : bf16[a, 4]
          %4 = dot_general(%3, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : bf16[a, 3]
          return %4, %2
        }
        """,
        """
        func @main(%x: f32[a, 4]) {
          sym a in [1, inf]  (input 'x' dim 0)
          %0 = constant() {dtype="f32", ref="w", value=none} : f32[4, 3]
          %1 = constant() {dtype="bf16", ref="1", value=none} : bf16[4, 3]
          %2 = constant() {dtype="f16", ref="2", value=none} : f16[4, 3]
          %3 = convert(%x) {dtype="bf16"} : bf16[a, 4]
          %4 = dot_general(%3, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : bf16[a, 3]
          return %4, %2
        }
        """,
        constants={"w": w},
    )
    assert torch.equal(out.constants["1"], w.to(torch.bfloat16)) and torch.equal(out.constants["2"], w.to(torch.float16))


def test_replacements_must_keep_the_exact_type():
    # 1 * y where the 1 is broadcast to [a*b] and y is [c*d]: equal only
    # through a product equality, so written differently. Dropping the mul
    # would change the node's type: it stays.
    src = """
    func @main(%x: f32[a, b], %y: f32[c, d]) {
      sym a in [1, inf]  (input 'x' dim 0)
      sym b in [1, inf]  (input 'x' dim 1)
      sym c in [1, inf]  (input 'y' dim 0)
      sym d in [1, inf]  (input 'y' dim 1)
      prod a*b == c*d
      %0 = dim(%x) {axis=0} : index(a)
      %1 = dim(%x) {axis=1} : index(b)
      %2 = dim(%y) {axis=0} : index(c)
      %3 = dim(%y) {axis=1} : index(d)
      %4 = imul(%0, %1) : index(a*b)
      %5 = imul(%2, %3) : index(c*d)
      %6 = reshape(%y, %5) : f32[c*d]
      %7 = constant() {dtype="f32", ref=none, value=1.0} : f32[]
      %8 = broadcast_in_dim(%7, %4) {dims=[]} : f32[a*b]
      %9 = mul(%8, %6) : f32[a*b]
      return %9
    }
    """
    check_golden(simplify, src, src)


def test_no_rule_changes_numerics_on_special_values():
    # Every rule's claim, checked on the values that break inexact ones.
    values = torch.tensor([0.0, -0.0, 1.5, -2.0, math.inf, -math.inf, math.nan, 1e-40], dtype=torch.float32)
    neg_zero = torch.full_like(values, -0.0)
    pos_zero = torch.zeros_like(values)
    one = torch.ones_like(values)

    def same(a, b):
        # bit-for-bit for numbers (signed zeros included); a NaN must stay a NaN
        # (IEEE 754 does not specify a NaN result's sign, so that is not compared)
        nan = torch.isnan(a)
        return (
            torch.equal(nan, torch.isnan(b))
            and torch.equal(a[~nan], b[~nan])
            and torch.equal(torch.signbit(a[~nan]), torch.signbit(b[~nan]))
        )

    assert same(values * one, values) and same(one * values, values)
    assert same(values + neg_zero, values) and same(neg_zero + values, values)
    assert not same(values + pos_zero, values)  # which is why x + 0.0 is not a rule
    assert same(values - pos_zero, values) and not same(values - neg_zero, values)
    assert same(values / one, values) and same(torch.pow(values, one), values)
    assert same(-(-values), values) and same(values - (-values), values + values)
    assert same(values + (-one), values - one)


def test_rule_table_is_documented():
    import inspect
    import sys

    source = inspect.getsource(sys.modules["disc.passes.simplify"])
    table = source[source.index("RULES: list") :]
    for op, fn in RULES:
        line = next(ln for ln in table.splitlines() if f'("{op}", {fn.__name__})' in ln)
        assert "#" in line, f"rule {op}/{fn.__name__} needs a one-line comment"


@pytest.mark.parametrize("value, simplified", [(-0.0, True), (0.0, False)])
def test_add_zero_depends_on_its_sign(value, simplified):
    src = f"""
    func @main(%x: f64[4]) {{
      %0 = constant() {{dtype="f64", ref=none, value={value}}} : f64[]
      %1 = index_const() {{value=4}} : index(4)
      %2 = broadcast_in_dim(%0, %1) {{dims=[]}} : f64[4]
      %3 = add(%x, %2) : f64[4]
      return %3
    }}
    """
    out = simplify(parse_graph(textwrap.dedent(src).strip()))
    assert (out.outputs[0].op == "input") is simplified


def test_folding_leaves_errors_to_run_time():
    src = """
    func @main(%x: i32[2]) {
      %0 = constant() {dtype="i32", ref=none, value=7} : i32[]
      %1 = constant() {dtype="i32", ref=none, value=0} : i32[]
      %2 = div(%0, %1) : i32[]
      %3 = floor_div(%0, %1) : i32[]
      return %2, %3
    }
    """
    check_golden(simplify, src, src)


_SPECIAL = {
    "f32": [0.0, -0.0, 1.5, -2.25, 3.0e38, -3.0e38, 1e-45, float("inf"), -float("inf"), float("nan"), 2.5, -0.5],
    "f16": [0.0, -0.0, 1.5, -2.25, 65504.0, 6e-8, float("inf"), float("nan"), 2.5, -0.5],
    "i32": [0, 1, -1, 7, -7, 2**31 - 1, -(2**31)],
    "i64": [0, 3, -3, 2**63 - 1, -(2**63)],
    "i1": [False, True],
}


@pytest.mark.parametrize("dtype", sorted(_SPECIAL))
def test_numpy_scalar_folding_is_bit_for_bit_the_reference(dtype):
    """Without torch, scalar constants fold with numpy, only for ops whose numpy result is the
    reference's to the bit (every pair of special values, NaN and signed zeros included)."""
    import itertools

    import numpy as np

    from disc.ir.registry import get_spec
    from disc.ir.types import numpy_dtype, torch_dtype
    from disc.passes.simplify import _NUMPY_EXACT, _fold_numpy

    class _N:  # what _fold_numpy reads of a node
        def __init__(self, op: str) -> None:
            self.op = op

    folded = 0
    for op in [*_NUMPY_EXACT, "div"]:
        arity = len(get_spec(op).operands)
        for vals in itertools.product(_SPECIAL[dtype], repeat=arity):
            arrays = [np.array(v, dtype=numpy_dtype(dtype)) for v in vals]
            got = _fold_numpy(_N(op), arrays)
            if got is None:  # left for the program (integer division: torch's own reference traps on INT_MIN // -1)
                continue
            folded += 1
            want = get_spec(op).reference(*(torch.tensor(v, dtype=torch_dtype(dtype)) for v in vals)).numpy()
            assert got.dtype == want.dtype and got.shape == want.shape, (op, vals, got.dtype, want.dtype)
            assert got.tobytes() == want.tobytes() or (np.isnan(want) and np.isnan(got)), (op, vals, got, want)
    assert folded > 0
