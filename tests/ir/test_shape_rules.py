"""Symbolic shape rules: output-size expressions, recorded checks and errors.

The brute-force tests build one graph with symbolic sizes per attribute
combination, then evaluate the inferred expression (and the run-time checks
the rule recorded) at many concrete sizes and compare with what PyTorch does:
the checks must hold exactly when torch accepts the sizes, and then the
expression must be torch's output size.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from disc.ir.graph import Graph
from disc.ir.ops.nn import window_output_dim
from disc.ir.parser import parse_graph
from disc.ir.printer import print_graph
from disc.ir.registry import ShapeRuleError, get_spec
from disc.ir.types import TensorType
from disc.ir.verifier import verify
from disc.shape.expr import SymExpr, as_expr

get_spec("add")


def T(dtype, *dims):
    return TensorType(dtype, tuple(dims))


def sym_graph(*names, lo=0):
    g = Graph()
    return g, [g.constraints.declare(n, lo=lo) for n in names]


def checks_hold(g: Graph, env) -> bool:
    return all(c.holds(env) for c in g.constraints.checks)


def ev(g: Graph, d, env) -> int:
    return g.constraints.normalize(d).evaluate(env)


def torch_shape(fn, *args):
    try:
        return tuple(fn(*args).shape)
    except RuntimeError:
        return None


# -- convolution ---------------------------------------------------------------------------
@pytest.mark.parametrize("stride,padding,dilation", list(itertools.product([1, 2, 3], [0, 1, 2], [1, 2, 3])))
def test_conv_output_size_matches_torch(stride, padding, dilation):
    g, (n, k) = sym_graph("n", "k")
    x = g.add_input("x", T("f32", 1, 1, n))
    w = g.add_input("w", T("f32", 1, 1, k))
    y = g.add("convolution", [x, w], {"stride": (stride,), "padding": (padding,), "dilation": (dilation,)})
    assert y.shape[:2] == (1, 1)
    assert not (g.constraints.normalize(y.shape[2]).symbols() - {"n", "k"}), "no fresh symbols"
    for nv, kv in itertools.product(range(11), range(1, 5)):
        env = {"n": nv, "k": kv}
        got = torch_shape(F.conv1d, torch.zeros(1, 1, nv), torch.zeros(1, 1, kv), None, stride, padding, dilation)
        assert checks_hold(g, env) == (got is not None), (env, got, [str(c) for c in g.constraints.checks])
        if got is not None:
            assert ev(g, y.shape[2], env) == got[2], (env, y.shape[2], got)


@pytest.mark.parametrize("stride,padding,dilation", list(itertools.product([1, 2, 3], [0, 1, 2], [1, 2])))
def test_transposed_conv_output_size_matches_torch(stride, padding, dilation):
    for out_pad in range(max(stride, dilation)):
        g, (n, k) = sym_graph("n", "k")
        x = g.add_input("x", T("f32", 1, 2, n))
        w = g.add_input("w", T("f32", 2, 3, k))
        attrs = {"stride": (stride,), "padding": (padding,), "dilation": (dilation,), "transposed": True, "output_padding": (out_pad,)}
        y = g.add("convolution", [x, w], attrs)
        assert y.shape[:2] == (1, 3)
        for nv, kv in itertools.product(range(8), range(1, 5)):
            env = {"n": nv, "k": kv}
            got = torch_shape(F.conv_transpose1d, torch.zeros(1, 2, nv), torch.zeros(2, 3, kv), None, stride, padding, out_pad, 1, dilation)
            assert checks_hold(g, env) == (got is not None), (attrs, env, got)
            if got is not None:
                assert ev(g, y.shape[2], env) == got[2], (attrs, env, y.shape[2], got)


def test_conv2d_dims_are_independent_and_grouped():
    g, (n, h, w) = sym_graph("n", "h", "w", lo=1)
    x = g.add_input("x", T("f32", n, 6, h, w))
    k = g.add_input("k", T("f32", 9, 2, 3, 5))
    y = g.add("convolution", [x, k], {"stride": (2, 3), "padding": (1, 2), "dilation": (1, 2), "groups": 3})
    assert y.shape[:2] == (n, 9)
    for hv, wv in itertools.product(range(1, 9), range(5, 14)):
        got = F.conv2d(torch.zeros(1, 6, hv, wv), torch.zeros(9, 2, 3, 5), None, (2, 3), (1, 2), (1, 2), 3).shape
        env = {"n": 1, "h": hv, "w": wv}
        assert (ev(g, y.shape[2], env), ev(g, y.shape[3], env)) == tuple(got[2:])
        assert checks_hold(g, env)


def test_conv_symbolic_channels_record_a_check():
    g, (n, c, h) = sym_graph("n", "c", "h", lo=1)
    x = g.add_input("x", T("f32", n, c, h, h))
    k = g.add_input("k", T("f32", 8, 4, 3, 3))
    y = g.add("convolution", [x, k], {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": 2})
    assert y.shape == (n, 8, h, h)
    reasons = [c.reason for c in g.constraints.checks]
    assert any("x dim 1 (input channels)" in r for r in reasons), reasons
    assert g.constraints.prove_equal(c, 8)  # the assumed equality is used by later proofs


# -- reduce_window --------------------------------------------------------------------------
def torch_pool_len(n, k, s, p, d, ceil):
    """PyTorch's pooling_output_shape, written out."""
    num = n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)
    out = num // s + 1
    if ceil and (out - 1) * s >= n + p:
        out -= 1
    return out


POOL_PARAMS = [(k, s, p, d) for k in range(1, 5) for s in range(1, 5) for p in range(k // 2 + 1) for d in (1, 2)]


@pytest.mark.parametrize("ceil", [False, True])
def test_max_pool_output_size_and_values_match_torch(ceil):
    gen = torch.Generator().manual_seed(0)
    for k, s, p, d in POOL_PARAMS:
        g, (n,) = sym_graph("n")
        x = g.add_input("x", T("f32", 2, n))
        attrs = {"kind": "max", "window": (1, k), "strides": (1, s), "padding": ((0, 0), (p, p)), "dilation": (1, d), "ceil_mode": ceil}
        y = g.add("reduce_window", [x], attrs)
        nsyms = len(g.constraints.facts)
        assert y.shape[0] == 2 and nsyms == 1, "ceil mode must not need fresh symbols"
        for nv in range(1, 16):
            env = {"n": nv}
            data = torch.randn(2, nv, generator=gen)
            try:
                want = F.max_pool1d(data.unsqueeze(0), k, s, p, d, ceil_mode=ceil).squeeze(0)
            except RuntimeError:
                want = None
            size = ev(g, y.shape[1], env)
            if want is None:
                # torch rejects empty pooled outputs; disc either rejects the size too or yields 0 windows.
                assert not checks_hold(g, env) or size == 0, (k, s, p, d, nv, size)
                continue
            assert checks_hold(g, env), (attrs, env)
            assert size == want.shape[1] == torch_pool_len(nv, k, s, p, d, ceil), (attrs, nv, size, want.shape)
            got = get_spec("reduce_window").reference(data, **g.nodes[-1].attrs)
            torch.testing.assert_close(got, want)


def test_sum_window_is_avg_pool_times_window():
    gen = torch.Generator().manual_seed(1)
    for k, s, p, _ in POOL_PARAMS:
        for nv in range(k, 12):
            data = torch.randn(3, nv, generator=gen)
            attrs = {"kind": "sum", "window": (1, k), "strides": (1, s), "padding": ((0, 0), (p, p)), "dilation": (), "ceil_mode": False}
            got = get_spec("reduce_window").reference(data, **attrs)
            want = F.avg_pool1d(data.unsqueeze(0), k, s, p, count_include_pad=True).squeeze(0) * k
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_window_output_dim_closed_form_ceil_rule():
    # Asymmetric padding and large strides, beyond torch's pad <= k/2 range.
    for w, s, lo, hi, d in itertools.product(range(1, 5), range(1, 6), range(4), range(6), (1, 2, 3)):
        e = window_output_dim(SymExpr.symbol("n"), w, s, lo, hi, d, True)
        eff = d * (w - 1) + 1
        for n in range(max(0, eff - lo - hi), 25):
            want = -((n + lo + hi - eff) // -s) + 1
            if (want - 1) * s >= n + lo:
                want -= 1
            assert e.evaluate({"n": n}) == want, (w, s, lo, hi, d, n, str(e))


def test_pool_over_leading_dim_and_unpooled_dims_keep_symbols():
    g, (a, b, c) = sym_graph("a", "b", "c")
    x = g.add_input("x", T("f32", a, b, c))
    y = g.add("reduce_window", [x], {"window": (3, 1, 1), "strides": (2, 1, 1), "padding": ((1, 1), (0, 0), (0, 0))})
    assert y.shape[1:] == (b, c)
    assert g.constraints.prove_equal(y.shape[0], (a - 1) // 2 + 1)


# -- slice / pad / concat ----------------------------------------------------------------------------
@pytest.mark.parametrize("step", [1, 2, 3])
def test_slice_length_matches_python(step):
    g, (n, a, b) = sym_graph("n", "a", "b")
    x = g.add_input("x", T("f32", n))
    start = g.add("dim", [g.add_input("s", T("f32", a))], {"axis": 0})
    stop = g.add("dim", [g.add_input("t", T("f32", b))], {"axis": 0})
    y = g.add("slice", [x, start, stop], {"axis": 0, "step": step})
    assert g.constraints.prove_equal(y.shape[0], (b - a).ceildiv(step))
    for nv, av, bv in itertools.product(range(7), range(8), range(8)):
        env = {"n": nv, "a": av, "b": bv}
        valid = 0 <= av <= bv <= nv
        assert checks_hold(g, env) == valid, env
        if valid:
            data = torch.arange(nv)
            got = get_spec("slice").reference(data, av, bv, axis=0, step=step)
            assert ev(g, y.shape[0], env) == len(range(av, bv, step)) == got.shape[0]
            assert got.tolist() == list(range(nv))[av:bv:step]


@pytest.mark.parametrize("lo,hi", list(itertools.product(range(-3, 4), range(-3, 4))))
def test_pad_size_matches_torch(lo, hi):
    g, (n,) = sym_graph("n")
    x = g.add_input("x", T("f32", 2, n))
    y = g.add("pad", [x], {"low": (0, lo), "high": (1, hi), "value": -1.0})
    assert y.shape[0] == 3
    for nv in range(7):
        env = {"n": nv}
        data = torch.randn(2, nv)
        try:
            want = F.pad(data, (lo, hi, 0, 1), value=-1.0)
        except RuntimeError:
            want = None
        assert checks_hold(g, env) == (want is not None), (lo, hi, nv)
        if want is not None:
            assert ev(g, y.shape[1], env) == want.shape[1]
            torch.testing.assert_close(get_spec("pad").reference(data, **g.nodes[-1].attrs), want)


def test_concat_sums_the_axis_and_checks_other_dims():
    g, (a, b, c, d) = sym_graph("a", "b", "c", "d")
    x = g.add_input("x", T("f32", a, c, 3))
    y = g.add_input("y", T("f32", b, d, 3))
    z = g.add_input("z", T("f32", 2, c, 3))
    out = g.add("concat", [x, y, z], {"axis": 0})
    assert g.constraints.prove_equal(out.shape[0], a + b + 2)
    assert out.shape[2] == 3
    reasons = [ch.reason for ch in g.constraints.checks]
    assert reasons == ["concat: operand 1 dim 1 must equal operand 0 dim 1"], reasons
    assert g.constraints.prove_equal(d, c)


def test_gather_and_scatter_add_record_index_bounds():
    g, (a, b, c) = sym_graph("a", "b", "c")
    x = g.add_input("x", T("f32", a, b))
    i = g.add_input("i", T("i64", c, b))
    s = g.add_input("s", T("f32", c, b))
    assert g.add("gather", [x, i], {"axis": 0}).shape == (c, b)  # only non-axis dims are bounded: b <= b
    assert g.constraints.checks == []
    assert g.add("scatter_add", [x, i, s], {"axis": 1}).shape == (a, b)
    assert [str(ch.lhs) + ">=" + str(ch.rhs) for ch in g.constraints.checks] == ["a>=c"]


# -- broadcast and elementwise ----------------------------------------------------------------------
def test_broadcast_of_provably_not_one_unequal_dim_raises():
    g = Graph()
    a = g.constraints.declare("a", lo=2, hi=5)
    x = g.add_input("x", T("f32", a))
    six = g.add("index_const", [], {"value": 6})
    with pytest.raises(ShapeRuleError, match=r"operand dim 0 \(a\) is neither 1 nor the target dim 0 \(6\)"):
        g.add("broadcast_in_dim", [x, six], {"dims": (0,)})
    y = g.add_input("y", T("f32", 3))
    with pytest.raises(ShapeRuleError, match="operand dim 0"):
        g.add("broadcast_in_dim", [y, g.add("index_const", [], {"value": 4})], {"dims": (0,)})


def test_broadcast_of_maybe_one_dim_is_accepted_without_check():
    g, (a, b) = sym_graph("a", "b")
    x = g.add_input("x", T("f32", a))
    y = g.add_input("y", T("f32", b))
    out = g.add("broadcast_in_dim", [x, g.add("dim", [y], {"axis": 0})], {"dims": (0,)})
    assert out.shape == (b,)
    assert g.constraints.checks == []


def test_elementwise_of_possibly_unequal_symbols_records_a_check():
    g, (a, b) = sym_graph("a", "b")
    x = g.add_input("x", T("f32", a, 4))
    y = g.add_input("y", T("f32", b, 4))
    out = g.add("add", [x, y])
    assert len(g.constraints.checks) == 1
    chk = g.constraints.checks[0]
    assert chk.op == "==" and {str(chk.lhs), str(chk.rhs)} == {"a", "b"}
    assert "operand 1 dim 0" in chk.reason
    assert g.constraints.prove_equal(out.shape[0], b) and g.constraints.prove_equal(out.shape[0], a)
    assert not chk.holds({"a": 2, "b": 3}) and chk.holds({"a": 3, "b": 3})


def test_elementwise_of_provably_different_dims_raises():
    g = Graph()
    a = g.constraints.declare("a")
    x = g.add_input("x", T("f32", a, 4))
    y = g.add_input("y", T("f32", a + 1, 4))
    with pytest.raises(ShapeRuleError, match=r"operand 1 dim 0 must equal operand 0 dim 0"):
        g.add("mul", [x, y])


# -- errors name the operand, the dim and the rule ------------------------------------------------
def _g():
    return Graph()


def _idx(g, v):
    return g.add("index_const", [], {"value": v})


def _inp(g, name, dtype, *dims):
    return g.add_input(name, T(dtype, *dims))


ERRORS = {
    "slice_step": (
        lambda g: g.add("slice", [_inp(g, "x", "f32", 4), _idx(g, 0), _idx(g, 2)], {"axis": 0, "step": 0}),
        r"slice: step must be >= 1",
    ),
    "slice_order": (
        lambda g: g.add("slice", [_inp(g, "x", "f32", 4), _idx(g, 3), _idx(g, 2)], {"axis": 0}),
        r"stop must be >= start: 2 < 3",
    ),
    "slice_stop": (
        lambda g: g.add("slice", [_inp(g, "x", "f32", 2, 4), _idx(g, 0), _idx(g, 5)], {"axis": 1}),
        r"stop must be <= x dim 1: 4 < 5",
    ),
    "slice_neg": (lambda g: g.add("slice", [_inp(g, "x", "f32", 4), _idx(g, -1), _idx(g, 2)], {"axis": 0}), r"start must be >= 0"),
    "slice_axis": (
        lambda g: g.add("slice", [_inp(g, "x", "f32", 4), _idx(g, 0), _idx(g, 2)], {"axis": 1}),
        r"axis 1 out of range for rank 1",
    ),
    "slice_operand": (
        lambda g: g.add("slice", [_inp(g, "x", "f32", 4), _inp(g, "y", "i64"), _idx(g, 2)], {"axis": 0}),
        r"start operand must be an index",
    ),
    "slice_missing_axis": (lambda g: g.add("slice", [_inp(g, "x", "f32", 4), _idx(g, 0), _idx(g, 2)]), r"missing attribute 'axis'"),
    "concat_dim": (
        lambda g: g.add("concat", [_inp(g, "x", "f32", 2, 3), _inp(g, "y", "f32", 5, 4)], {"axis": 0}),
        r"operand 1 dim 1 must equal operand 0 dim 1: 4 != 3",
    ),
    "concat_rank": (
        lambda g: g.add("concat", [_inp(g, "x", "f32", 2, 3), _inp(g, "y", "f32", 3)], {"axis": 0}),
        r"operand 1 has rank 1, operand 0 has rank 2",
    ),
    "concat_dtype": (lambda g: g.add("concat", [_inp(g, "x", "f32", 3), _inp(g, "y", "i32", 3)], {"axis": 0}), r"operand 1 has dtype i32"),
    "concat_empty": (lambda g: g.add("concat", [], {"axis": 0}), r"at least one operand"),
    "pad_len": (
        lambda g: g.add("pad", [_inp(g, "x", "f32", 2, 3)], {"low": (1,), "high": (1, 1)}),
        r"low \(1,\) must have one entry per dim of x \(rank 2\)",
    ),
    "pad_crop": (lambda g: g.add("pad", [_inp(g, "x", "f32", 2, 3)], {"low": (0, -2), "high": (0, -2)}), r"x dim 1 must be >= 4"),
    "gather_rank": (
        lambda g: g.add("gather", [_inp(g, "x", "f32", 2, 3), _inp(g, "i", "i64", 3)], {"axis": 1}),
        r"operand index has rank 1, operand x has rank 2",
    ),
    "gather_dtype": (
        lambda g: g.add("gather", [_inp(g, "x", "f32", 2, 3), _inp(g, "i", "f32", 2, 3)], {"axis": 1}),
        r"operand index must have dtype i64",
    ),
    "gather_dim": (
        lambda g: g.add("gather", [_inp(g, "x", "f32", 2, 3), _inp(g, "i", "i64", 5, 3)], {"axis": 1}),
        r"index dim 0 must be <= x dim 0: 2 < 5",
    ),
    "index_select_rank": (
        lambda g: g.add("index_select", [_inp(g, "x", "f32", 2, 3), _inp(g, "i", "i64", 2, 2)], {"axis": 0}),
        r"index must be 1-D, got rank 2",
    ),
    "scatter_src_dim": (
        lambda g: g.add("scatter_add", [_inp(g, "x", "f32", 4, 4), _inp(g, "i", "i64", 3, 4), _inp(g, "s", "f32", 2, 4)], {"axis": 0}),
        r"index dim 0 must be <= src dim 0: 2 < 3",
    ),
    "scatter_dtype": (
        lambda g: g.add("scatter_add", [_inp(g, "x", "f32", 4), _inp(g, "i", "i64", 3), _inp(g, "s", "f64", 3)], {"axis": 0}),
        r"operand src has dtype f64, operand x has f32",
    ),
    "cumsum_bool": (lambda g: g.add("cumsum", [_inp(g, "x", "i1", 4)], {"axis": 0}), r"cumsum: operand x must not be i1"),
    "argreduce_kind": (lambda g: g.add("argreduce", [_inp(g, "x", "f32", 4)], {"axis": 0, "kind": "argfoo"}), r"unknown kind 'argfoo'"),
    "argreduce_axis": (lambda g: g.add("argreduce", [_inp(g, "x", "f32", 4)], {"axis": 2}), r"axis 2 out of range for rank 1"),
    "conv_channels": (
        lambda g: g.add(
            "convolution",
            [_inp(g, "x", "f32", 1, 3, 8, 8), _inp(g, "w", "f32", 4, 2, 3, 3)],
            {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1)},
        ),
        r"x dim 1 \(input channels\) must equal w dim 1 \* groups \(1\): 3 != 2",
    ),
    "conv_channels_last": (
        lambda g: g.add(
            "convolution",
            [_inp(g, "x", "f32", 1, 8, 8, 3), _inp(g, "w", "f32", 4, 2, 3, 3)],
            {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "channels_last": True},
        ),
        r"x dim 3 \(input channels\) must equal w dim 1 \* groups \(1\): 3 != 2",
    ),
    "conv_grad_input_channels": (
        lambda g: g.add(
            "convolution_backward_input",
            [_inp(g, "gy", "f32", 1, 5, 6, 6), _inp(g, "w", "f32", 4, 2, 3, 3), *[g.add("index_const", [], {"value": v}) for v in (1, 2, 8, 8)]],
            {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1)},
        ),
        r"gy dim 1 \(channels\) must equal w dim 0: 5 != 4",
    ),
    "conv_grad_input_size": (
        lambda g: g.add(
            "convolution_backward_input",
            [_inp(g, "gy", "f32", 1, 4, 6, 6), _inp(g, "w", "f32", 4, 2, 3, 3), *[g.add("index_const", [], {"value": v}) for v in (1, 2, 8, 9)]],
            {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1)},
        ),
        r"gy spatial dim 1 must be the convolution's output size: 6 != 7",
    ),
    "conv_grad_weight_batch": (
        lambda g: g.add(
            "convolution_backward_weight",
            [_inp(g, "x", "f32", 2, 2, 8, 8), _inp(g, "gy", "f32", 3, 4, 6, 6)],
            {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "kernel": (3, 3)},
        ),
        r"gy batch must equal x batch: 3 != 2",
    ),
    "conv_groups": (
        lambda g: g.add(
            "convolution",
            [_inp(g, "x", "f32", 1, 4, 8, 8), _inp(g, "w", "f32", 3, 2, 3, 3)],
            {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "groups": 2},
        ),
        r"w dim 0 \(output channels\) must be divisible by groups: 3 is not divisible by 2",
    ),
    "conv_stride_len": (
        lambda g: g.add(
            "convolution",
            [_inp(g, "x", "f32", 1, 2, 8, 8), _inp(g, "w", "f32", 4, 2, 3, 3)],
            {"stride": (1,), "padding": (0, 0), "dilation": (1, 1)},
        ),
        r"stride \(1,\) must have 2 entries",
    ),
    "conv_stride_zero": (
        lambda g: g.add(
            "convolution",
            [_inp(g, "x", "f32", 1, 2, 8, 8), _inp(g, "w", "f32", 4, 2, 3, 3)],
            {"stride": (1, 0), "padding": (0, 0), "dilation": (1, 1)},
        ),
        r"stride\[1\] must be >= 1, got 0",
    ),
    "conv_w_rank": (
        lambda g: g.add(
            "convolution",
            [_inp(g, "x", "f32", 1, 2, 8, 8), _inp(g, "w", "f32", 4, 2, 3)],
            {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1)},
        ),
        r"operand w has rank 3, operand x has rank 4",
    ),
    "conv_kernel_too_big": (
        lambda g: g.add(
            "convolution", [_inp(g, "x", "f32", 1, 1, 2), _inp(g, "w", "f32", 1, 1, 5)], {"stride": (1,), "padding": (1,), "dilation": (1,)}
        ),
        r"padded x dim 2 must be >= the dilated kernel \(w dim 2\): 4 < 5",
    ),
    "conv_output_padding": (
        lambda g: g.add(
            "convolution",
            [_inp(g, "x", "f32", 1, 1, 4), _inp(g, "w", "f32", 1, 1, 3)],
            {"stride": (2,), "padding": (0,), "dilation": (1,), "transposed": True, "output_padding": (2,)},
        ),
        r"output_padding\[0\]=2 must be smaller than stride\[0\]=2 or dilation\[0\]=1",
    ),
    "conv_output_padding_not_transposed": (
        lambda g: g.add(
            "convolution",
            [_inp(g, "x", "f32", 1, 1, 4), _inp(g, "w", "f32", 1, 1, 3)],
            {"stride": (2,), "padding": (0,), "dilation": (1,), "output_padding": (1,)},
        ),
        r"output_padding needs transposed",
    ),
    "conv_int": (
        lambda g: g.add(
            "convolution", [_inp(g, "x", "i32", 1, 1, 4), _inp(g, "w", "i32", 1, 1, 3)], {"stride": (1,), "padding": (0,), "dilation": (1,)}
        ),
        r"must be floating point, got i32",
    ),
    "window_kind": (
        lambda g: g.add("reduce_window", [_inp(g, "x", "f32", 4)], {"kind": "mean", "window": (2,), "strides": (2,)}),
        r"unknown kind 'mean'",
    ),
    "window_len": (
        lambda g: g.add("reduce_window", [_inp(g, "x", "f32", 1, 1, 4, 4)], {"window": (2, 2), "strides": (1, 1, 2, 2)}),
        r"window \(2, 2\) must have 4 entries",
    ),
    "window_padding": (
        lambda g: g.add("reduce_window", [_inp(g, "x", "f32", 4, 4)], {"window": (2, 2), "strides": (1, 1), "padding": ((0, 0), (1, -1))}),
        r"padding\[1\]\[1\] must be >= 0, got -1",
    ),
    "window_too_small": (
        lambda g: g.add("reduce_window", [_inp(g, "x", "f32", 1, 1, 1, 1)], {"window": (1, 1, 4, 4), "strides": (1, 1, 1, 1)}),
        r"x dim 2 is too small for window 4",
    ),
    "window_sum_bool": (
        lambda g: g.add("reduce_window", [_inp(g, "x", "i1", 4)], {"kind": "sum", "window": (2,), "strides": (2,)}),
        r"kind sum needs a numeric operand",
    ),
    "argmax_no_index_dims": (
        lambda g: g.add("reduce_window", [_inp(g, "x", "f32", 4)], {"kind": "argmax", "window": (2,), "strides": (2,)}),
        r"kind argmax needs index_dims",
    ),
    "argmax_index_dims_order": (
        lambda g: g.add(
            "reduce_window", [_inp(g, "x", "f32", 4, 4)], {"kind": "argmax", "window": (2, 2), "strides": (2, 2), "index_dims": (1, 0)}
        ),
        r"index_dims \(1, 0\) must be increasing",
    ),
    "argmax_pooled_dim_missing": (
        lambda g: g.add(
            "reduce_window", [_inp(g, "x", "f32", 4, 4)], {"kind": "argmax", "window": (2, 2), "strides": (1, 1), "index_dims": (1,)}
        ),
        r"must include every pooled dim; missing \[0\]",
    ),
    "argmax_index_dim_range": (
        lambda g: g.add("reduce_window", [_inp(g, "x", "f32", 4)], {"kind": "argmax", "window": (2,), "strides": (2,), "index_dims": (1,)}),
        r"index_dims\[0\] 1 is not a dim of x \(rank 1\)",
    ),
    "index_dims_on_max": (
        lambda g: g.add("reduce_window", [_inp(g, "x", "f32", 4)], {"window": (2,), "strides": (2,), "index_dims": (0,)}),
        r"index_dims \(0,\) is only for kind argmax",
    ),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_bad_operands_and_attributes_raise_named_errors(name):
    build, pattern = ERRORS[name]
    with pytest.raises(ShapeRuleError, match=pattern):
        build(_g())


# -- the new ops survive print -> parse -> verify ------------------------------------------------------
def test_new_ops_print_parse_and_verify():
    g, (n, h, w, s) = sym_graph("n", "h", "w", "s", lo=1)
    x = g.add_input("x", T("f32", n, 4, h, w))
    k = g.add_input("k", T("f32", 8, 2, 3, 3))
    ids = g.add_input("ids", T("i64", s))
    conv = g.add("convolution", [x, k], {"stride": (2, 2), "padding": (1, 1), "dilation": (1, 1), "groups": 2})
    pool = g.add(
        "reduce_window",
        [conv],
        {"window": (1, 1, 3, 3), "strides": (1, 1, 2, 2), "padding": ((0, 0), (0, 0), (1, 1), (1, 1)), "ceil_mode": True},
    )
    conv_t = g.add(
        "convolution",
        [x, g.add_input("kt", T("f32", 4, 1, 2, 2))],
        {"stride": (2, 2), "padding": (0, 0), "dilation": (1, 1), "groups": 4, "transposed": True, "output_padding": (1, 0)},
    )
    d = [g.add("dim", [pool], {"axis": i}) for i in range(4)]
    flat = g.add("reshape", [pool, d[0], g.add("imul", [g.add("imul", [d[1], d[2]]), d[3]])])
    sl = g.add("slice", [flat, g.add("index_const", [], {"value": 1}), g.add("dim", [flat], {"axis": 1})], {"axis": 1, "step": 2})
    cat = g.add("concat", [sl, sl], {"axis": -1})
    padded = g.add("pad", [cat], {"low": (0, 1), "high": (0, -1), "value": -2.5})
    cs = g.add("cumsum", [padded], {"axis": 1})
    am = g.add("argreduce", [cs], {"axis": 1, "kind": "argmin", "keepdim": True})
    gat = g.add("gather", [cs, am], {"axis": 1})
    emb = g.add("index_select", [k, ids], {"axis": 0})
    sc = g.add("scatter_add", [cs, am, gat], {"axis": 1})
    g.outputs = [conv_t, emb, sc]
    verify(g)
    text = print_graph(g)
    again = parse_graph(text)
    verify(again)
    assert print_graph(again) == text
    assert "ceil_mode=true" in text and "padding=[[0, 0], [0, 0], [1, 1], [1, 1]]" in text
    assert emb.shape == (s, 2, 3, 3) and conv_t.shape[:2] == (n, 4)


def test_verify_graph_with_unprovable_imax():
    g, (a, b) = sym_graph("a", "b")
    x = g.add_input("x", T("f32", a, b))
    m = g.add("imax", [g.add("dim", [x], {"axis": 0}), g.add("dim", [x], {"axis": 1})])
    g.outputs = [g.add("iota", [m])]
    verify(g)


def test_unprovable_min_and_max_take_their_operands_bounds():
    """min(a, b - 1) is -1 at b = 0: its symbol must allow that, or max(0, it) would be dropped."""
    g, (a, b) = sym_graph("a", "b")
    x = g.add_input("x", T("f32", a, b))
    rows, cols = g.add("dim", [x], {"axis": 0}), g.add("dim", [x], {"axis": 1})
    shorter = g.add("imin", [rows, g.add("iadd", [cols, g.add("index_const", [], {"value": -1})])])
    c = g.constraints
    assert c.bounds(shorter.type.value) == (-1, float("inf"))
    length = g.add("imax", [g.add("index_const", [], {"value": 0}), shorter])
    assert length.type.value != shorter.type.value and c.bounds(length.type.value)[0] == 0
    below = g.add("imin", [g.add("isub", [rows, cols]), g.add("index_const", [], {"value": 3})])  # min(a - b, 3)
    assert c.bounds(below.type.value)[0] == float("-inf")
    g.outputs = [g.add("iota", [length]), g.add("index_to_tensor", [below], {"dtype": "i64"})]
    text = print_graph(g)
    assert "in [-inf, 3]" in text and "in [-1, inf]" in text
    assert print_graph(parse_graph(text)) == text  # -inf prints and parses
    verify(g)


def test_unprovable_floordiv_takes_its_dividends_sign():
    """(a - b) // c is negative when b > a: max(0, it) must not be simplified to it."""
    g, (a, b, c) = sym_graph("a", "b", "c")
    x = g.add_input("x", T("f32", a, b, c))
    rows, cols, depth = (g.add("dim", [x], {"axis": k}) for k in range(3))
    diff = g.add("ifloordiv", [g.add("isub", [rows, cols]), depth])
    cons = g.constraints
    assert cons.bounds(diff.type.value)[0] == float("-inf")
    clipped = g.add("imax", [g.add("index_const", [], {"value": 0}), diff])
    assert clipped.type.value != diff.type.value and cons.bounds(clipped.type.value)[0] == 0
    ratio = g.add("ifloordiv", [rows, depth])  # a size over a size stays a size
    assert cons.bounds(ratio.type.value)[0] == 0
    assert g.add("imax", [g.add("index_const", [], {"value": 0}), ratio]).type.value == ratio.type.value
    g.outputs = [g.add("iota", [clipped]), g.add("index_to_tensor", [diff], {"dtype": "i64"})]
    verify(g)


def test_index_types_of_size_operands_are_exact():
    g, (a,) = sym_graph("a")
    x = g.add_input("x", T("f32", a, 6))
    start = g.add("iadd", [g.add("dim", [x], {"axis": 0}), g.add("index_const", [], {"value": -1})])
    y = g.add("slice", [x, start, g.add("dim", [x], {"axis": 0})], {"axis": 0})
    assert y.shape == (1, 6)  # (a) - (a - 1)
    assert [str(c.lhs) for c in g.constraints.checks] == ["a - 1"]  # start >= 0 is the only unproven fact
    assert as_expr(g.constraints.checks[0].rhs) == as_expr(0)


# -- the memo of inferred types -------------------------------------------------------------
def test_a_repeated_inference_is_remembered_while_the_constraints_stay_the_same():
    g, (a, b) = sym_graph("a", "b")
    x = g.add_input("x", T("f32", a, b))
    first, second = g.add("neg", [x]), g.add("neg", [x])
    assert second.type is first.type  # the second came from the memo
    assert g.add("exp", [x]).type is not first.type  # another op is another key


def test_a_remembered_type_is_not_used_after_a_fact_changes():
    g, (a, b) = sym_graph("a", "b")
    x = g.add_input("x", T("f32", a, b))
    assert g.add("neg", [x]).type == T("f32", a, b)
    g.constraints.add_equal(b, a)
    assert g.add("neg", [x]).type == T("f32", a, a)  # re-inferred in the new normal form
    g.constraints.set_range("a", 4, 16)
    g.constraints.set_divisor("a", 2)
    revision = g.constraints.revision
    g.add("neg", [x])
    g.add("neg", [x])
    assert g.constraints.revision == revision  # inferring neg changed nothing


def test_a_rule_that_adds_facts_is_not_remembered():
    """An unprovable max names a symbol for itself: the first inference adds it to the facts and is
    not remembered, the second finds it there, changes nothing, and is."""
    g, (a, b) = sym_graph("a", "b")
    x = g.add_input("x", T("f32", a, b))
    rows, cols = g.add("dim", [x], {"axis": 0}), g.add("dim", [x], {"axis": 1})
    before = len(g.constraints.facts)
    m1, m2, m3 = (g.add("imax", [rows, cols]) for _ in range(3))
    assert len(g.constraints.facts) == before + 1 and m1.type.value.as_symbol()
    assert m1.type == m2.type == m3.type
    assert m2.type is not m1.type and m3.type is m2.type


def test_memo_keys_tell_equal_values_of_different_types_apart():
    from disc.ir.registry import _memo_key

    keys = {_memo_key("full", [], {"value": v}) for v in (1, 1.0, True)}
    assert len(keys) == 3
    assert _memo_key("full", [], {"value": (1, 2)}) != _memo_key("full", [], {"value": (1.0, 2)})
    assert _memo_key("full", [], {"value": torch.ones(1)}) is None  # not a plain value: never remembered
    assert _memo_key("constant", [], {"ref": "w"}) is None  # a constant's type is its payload's shape


def test_a_quotient_minted_before_a_later_fact_made_it_exact_is_settled():
    """Swin's padded side over its window count: inexact when the ifloordiv is added, exact once
    a later view ties the sizes (a == 4*b). The verifier re-infers 4 where consumers saw the
    minted symbol; settling records symbol == 4, and leaves undecided quotients alone."""
    from disc.ir.ops.shape_ops import settle_minted_symbols
    from disc.ir.verifier import VerificationError

    g, (a, b, c) = sym_graph("a", "b", "c")
    x = g.add_input("x", T("f32", a, b, c))
    rows, cols, depth = (g.add("dim", [x], {"axis": k}) for k in range(3))
    exact_later = g.add("ifloordiv", [rows, cols])
    never = g.add("ifloordiv", [rows, depth])
    assert exact_later.type.value.as_symbol() and never.type.value.as_symbol()
    g.constraints.add_equal(a, b * 4)
    g.outputs = [g.add("iota", [exact_later]), g.add("iota", [never])]
    with pytest.raises(VerificationError, match="but the op computes index\\(4\\)"):
        verify(g)
    assert settle_minted_symbols(g) == 1
    verify(g)
    assert g.constraints.prove_equal(exact_later.type.value, 4)
    assert settle_minted_symbols(g) == 0  # idempotent; the undecided one keeps its symbol
