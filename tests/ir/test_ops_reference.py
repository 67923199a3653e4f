"""Reference semantics of every registered op, against PyTorch eager.

Each op has a table entry: one or more ``Case``s, each a one-op graph built on
symbolic inputs. For every case the test

* checks the inferred result type (dtype, symbolic shape) against the
  expected one, written with the input symbols;
* runs the graph with the ops' reference functions at several concrete shapes
  (1-sized, odd and, where torch allows, 0-sized dims) on random data and
  compares with the equivalent torch eager call, written independently of the
  reference where that is easy;
* checks the symbolic type evaluated at those sizes is the actual shape, and
  that every run-time check the shape rules recorded holds there.

``test_every_op_is_covered`` makes a new op without a table entry fail.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from disc.ir.graph import Graph, Node
from disc.ir.parser import parse_graph
from disc.ir.printer import print_graph
from disc.ir.registry import OPS, ShapeRuleError, get_spec
from disc.ir.types import DTYPES, FLOAT_DTYPES, IndexType, TensorType
from disc.shape.expr import as_expr

get_spec("add")  # fill the registry


@dataclass
class Case:
    inputs: list[tuple[str, str, tuple]]  # (name, dtype, dims); a str dim is a symbol
    build: Callable[..., Node]  # (graph, *input nodes) -> the node under test
    eager: Callable[..., Any]  # (*input tensors) -> what torch computes
    expect: Callable[[SimpleNamespace], Any] | None  # symbols -> expected result type (None: not checked)
    envs: list[dict[str, int]] = field(default_factory=lambda: [{}])
    make: dict[str, Callable[..., torch.Tensor]] = field(default_factory=dict)  # name -> (shape, env, gen) -> tensor
    lo: dict[str, int] = field(default_factory=dict)  # symbol lower bounds
    tol: float = 1e-5


CASES: dict[str, list[Case]] = {}



def case(op: str, *args, **kw) -> None:
    CASES.setdefault(op, []).append(Case(*args, **kw))


def T(dtype: str, *dims) -> TensorType:
    return TensorType(dtype, tuple(dims))


def I(v) -> IndexType:
    return IndexType(v)


# -- data ------------------------------------------------------------------------------
def rand(dtype: str, shape, gen: torch.Generator) -> torch.Tensor:
    if dtype in FLOAT_DTYPES:
        return torch.randn(shape, generator=gen).to(DTYPES[dtype])
    if dtype == "i1":
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype == "u8":
        return torch.randint(0, 20, shape, generator=gen).to(torch.uint8)
    return torch.randint(-8, 9, shape, generator=gen).to(DTYPES[dtype])


def positive(shape, env, gen):
    return torch.rand(shape, generator=gen) + 0.1


def nonzero_int(dtype: str):
    def make(shape, env, gen):
        v = torch.randint(1, 7, shape, generator=gen)
        sign = torch.randint(0, 2, shape, generator=gen) * 2 - 1
        return (v * sign).to(DTYPES[dtype])

    return make


def ints_in(lo: int, hi: int, dtype: str = "i32"):
    return lambda shape, env, gen: torch.randint(lo, hi, shape, generator=gen).to(DTYPES[dtype])


def index_below(sym: str, dtype: str = "i64"):
    """Valid indices into a dim of size ``env[sym]`` (or a static int)."""

    def make(shape, env, gen):
        n = env[sym] if isinstance(sym, str) else sym
        return torch.randint(0, max(n, 1), shape, generator=gen).to(DTYPES[dtype])

    return make


def with_nans(shape, env, gen):
    x = torch.randn(shape, generator=gen)
    return torch.where(torch.rand(shape, generator=gen) < 0.3, torch.full_like(x, math.nan), x)


def with_infs(shape, env, gen):
    x = with_nans(shape, env, gen)
    return torch.where(torch.rand(shape, generator=gen) < 0.3, torch.full_like(x, math.inf) * x.sign(), x)


# -- the harness ---------------------------------------------------------------------------
def evaluate(g: Graph, target: Node, feeds: dict[str, torch.Tensor]):
    """Run a graph with the registry's reference functions."""
    vals: dict[Node, Any] = {}
    for n in g.nodes:
        if n.op == "input":
            vals[n] = feeds[n.name]
            continue
        attrs = dict(n.attrs)
        if n.op == "constant" and attrs.get("ref") is not None:
            attrs["ref"] = g.constants[attrs["ref"]]
        if n.op == "host_call":
            attrs = {"call": FALLBACKS[attrs["call"]]}
        vals[n] = get_spec(n.op).reference(*(vals[i] for i in n.inputs), **attrs)
    return vals[target]


def assert_same(actual, expected, tol: float) -> None:
    if isinstance(expected, int):
        assert type(actual) is int and actual == expected, (actual, expected)
        return
    assert isinstance(actual, torch.Tensor), type(actual)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol, equal_nan=True)


def run_case(op: str, c: Case, seed: int) -> int:
    runs = 0
    for env in c.envs:
        g = Graph()
        syms: dict[str, Any] = {}
        nodes = []
        for name, dtype, dims in c.inputs:
            for d in dims:
                if isinstance(d, str) and d not in syms:
                    syms[d] = g.constraints.declare(d, lo=c.lo.get(d, 0), source=f"test input {name}")
            nodes.append(g.add_input(name, TensorType(dtype, tuple(syms[d] if isinstance(d, str) else d for d in dims))))
        node = c.build(g, *nodes)
        assert node.op == op, f"case for {op} built {node.op}"
        g.outputs = [node]
        cons = g.constraints

        # The inferred symbolic type.
        if c.expect is not None:
            want = c.expect(SimpleNamespace(**syms))
            assert type(node.type) is type(want), (node.type, want)
            if isinstance(want, IndexType):
                assert cons.prove_equal(node.type.value, want.value), f"{op}: inferred {node.type}, expected {want}"
            else:
                assert node.type.dtype == want.dtype, f"{op}: inferred {node.type}, expected {want}"
                assert cons.prove_same_shape(node.type.shape, want.shape), f"{op}: inferred {node.type}, expected {want}"

        # Concrete values against torch.
        gen = torch.Generator().manual_seed(seed + runs)
        feeds = {}
        for name, dtype, dims in c.inputs:
            shape = tuple(env[d] if isinstance(d, str) else d for d in dims)
            feeds[name] = c.make[name](shape, env, gen) if name in c.make else rand(dtype, shape, gen)
        actual = evaluate(g, node, feeds)
        expected = c.eager(*(feeds[name] for name, _, _ in c.inputs))
        assert_same(actual, expected, c.tol)

        # The symbolic type, evaluated at the concrete sizes, is the actual result.
        if isinstance(node.type, IndexType):
            v = as_expr(node.type.value)
            if v.symbols() <= env.keys():
                assert v.evaluate(env) == actual
        else:
            assert actual.dtype == DTYPES[node.type.dtype], f"{op}: type says {node.type.dtype}, reference gave {actual.dtype}"
            assert actual.dim() == len(node.type.shape)
            for i, d in enumerate(node.type.shape):
                e = cons.normalize(d)
                if e.symbols() <= env.keys():
                    assert e.evaluate(env) == actual.shape[i], (
                        f"{op}: dim {i} is {d} = {e.evaluate(env)} at {env}, actual {actual.shape[i]}"
                    )
        for chk in cons.checks:
            if (chk.lhs.symbols() | chk.rhs.symbols()) <= env.keys():
                assert chk.holds(env), f"{op}: recorded check {chk} fails at the valid sizes {env}"
        runs += 1
    return runs


# -- shape helpers for builders -------------------------------------------------------
def dim(g: Graph, x: Node, axis: int) -> Node:
    return g.add("dim", [x], {"axis": axis})


def const(g: Graph, v: int) -> Node:
    return g.add("index_const", [], {"value": v})


ENVS2 = [{"a": 1, "b": 1}, {"a": 3, "b": 5}, {"a": 0, "b": 4}, {"a": 2, "b": 0}]
AB = ("a", "b")


# -- elementwise ------------------------------------------------------------------------------
def unary(op: str, eager, dtypes, make=None, tol=1e-5, out_dtype=None) -> None:
    for dt in dtypes:
        case(
            op,
            [("x", dt, AB)],
            lambda g, x, op=op: g.add(op, [x]),
            eager,
            lambda S, dt=out_dtype or dt: T(dt, S.a, S.b),
            ENVS2,
            make={"x": make} if make else {},
            tol=tol,
        )


unary("neg", lambda x: -x, ["f32", "i32"])
unary("abs", lambda x: torch.where(x < 0, -x, x), ["f32", "i64"])
unary("sign", lambda x: (x > 0).to(x.dtype) - (x < 0).to(x.dtype), ["f32", "i32"])
unary("exp", lambda x: x.double().exp().float(), ["f32"])
unary("exp", torch.exp, ["f64"])
unary("expm1", lambda x: x.double().expm1().float(), ["f32"])
unary("log", lambda x: x.double().log().float(), ["f32"], positive)
unary("log1p", lambda x: x.double().log1p().float(), ["f32"], positive)
unary("log2", lambda x: x.double().log2().float(), ["f32"], positive)
unary("log10", lambda x: x.double().log10().float(), ["f32"], positive)
unary("sqrt", lambda x: x.double().sqrt().float(), ["f32"], positive)
unary("rsqrt", lambda x: (1 / x.double().sqrt()).float(), ["f32"], positive)
unary("reciprocal", lambda x: (1 / x.double()).float(), ["f32"])
unary("tanh", lambda x: x.double().tanh().float(), ["f32"])
unary("sigmoid", lambda x: (1 / (1 + (-x.double()).exp())).float(), ["f32"])
unary("sin", lambda x: x.double().sin().float(), ["f32"])
unary("cos", lambda x: x.double().cos().float(), ["f32"])
unary("erf", lambda x: x.double().erf().float(), ["f32"])
unary("tan", lambda x: x.double().tan().float(), ["f32"])
unary("atan", lambda x: x.double().atan().float(), ["f32"])
unary("asin", lambda x: x.double().asin().float(), ["f32"], lambda s, e, g: torch.rand(s, generator=g) * 2 - 1)
unary("acos", lambda x: x.double().acos().float(), ["f32"], lambda s, e, g: torch.rand(s, generator=g) * 2 - 1)
unary("sinh", lambda x: x.double().sinh().float(), ["f32"])
unary("cosh", lambda x: x.double().cosh().float(), ["f32"])
unary("asinh", lambda x: x.double().asinh().float(), ["f32"])
unary("acosh", lambda x: x.double().acosh().float(), ["f32"], lambda s, e, g: torch.rand(s, generator=g) * 5 + 1)
unary("atanh", lambda x: x.double().atanh().float(), ["f32"], lambda s, e, g: torch.rand(s, generator=g) * 1.8 - 0.9)
unary("isinf", lambda x: torch.tensor([math.isinf(v) for v in x.flatten().tolist()], dtype=torch.bool).reshape(x.shape), ["f32"], with_infs, out_dtype="i1")
unary("floor", torch.floor, ["f32", "f64"])
unary("ceil", torch.ceil, ["f32"])
unary("round", torch.round, ["f32"], lambda s, e, g: torch.randint(-8, 9, s, generator=g) / 2)  # halves: ties to even
unary("relu", lambda x: x.clamp_min(0), ["f32", "i32"])
unary("logical_not", lambda x: ~x, ["i1"])
unary("bitwise_not", lambda x: -x - 1, ["i32"])
unary("bitwise_not", lambda x: ~x, ["i1"])
unary("isnan", lambda x: torch.tensor([math.isnan(v) for v in x.flatten().tolist()], dtype=torch.bool).reshape(x.shape), ["f32"], with_nans, out_dtype="i1")
unary("gelu", lambda x: (0.5 * x.double() * (1 + torch.erf(x.double() / math.sqrt(2)))).float(), ["f32"])
unary(
    "gelu_tanh",
    lambda x: (0.5 * x.double() * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x.double() + 0.044715 * x.double() ** 3)))).float(),
    ["f32"],
)
unary("silu", lambda x: (x.double() / (1 + (-x.double()).exp())).float(), ["f32"])


def binary(op: str, eager, dtypes, result=None, make_y=None, make_x=None, tol=1e-5) -> None:
    for dt in dtypes:
        make = {}
        if make_x:
            make["x"] = make_x
        if make_y:
            make["y"] = make_y(dt) if make_y is nonzero_int else make_y
        case(
            op,
            [("x", dt, AB), ("y", dt, AB)],
            lambda g, x, y, op=op: g.add(op, [x, y]),
            eager,
            lambda S, dt=dt: T(result or dt, S.a, S.b),
            ENVS2,
            make=make,
            tol=tol,
        )


def _trunc_div(x, y):
    return torch.trunc(x.double() / y.double()).to(x.dtype)


def _floor_div(x, y):
    return torch.floor(x.double() / y.double()).to(x.dtype)


binary("add", lambda x, y: (x.double() + y.double()).to(x.dtype), ["f32", "i32", "i64"])
binary("sub", lambda x, y: (x.double() - y.double()).to(x.dtype), ["f32", "i32"])
binary("mul", lambda x, y: (x.double() * y.double()).to(x.dtype), ["f32", "i32", "u8"])
binary("div", lambda x, y: (x.double() / y.double()).float(), ["f32"])
binary("div", _trunc_div, ["i32", "i64"], make_y=nonzero_int)
binary("floor_div", _floor_div, ["f32"], tol=1e-5)
binary("floor_div", _floor_div, ["i32"], make_y=nonzero_int)
binary("remainder", lambda x, y: (x.double() - torch.floor(x.double() / y.double()) * y.double()).to(x.dtype), ["f32"], tol=1e-4)
binary("remainder", lambda x, y: (x.double() - torch.floor(x.double() / y.double()) * y.double()).to(x.dtype), ["i32"], make_y=nonzero_int)
binary("fmod", lambda x, y: (x.double() - torch.trunc(x.double() / y.double()) * y.double()).to(x.dtype), ["f32"], tol=1e-4)
binary("fmod", lambda x, y: (x.double() - torch.trunc(x.double() / y.double()) * y.double()).to(x.dtype), ["i32"], make_y=nonzero_int)
binary("pow", lambda x, y: (y.double() * x.double().log()).exp().float(), ["f32"], make_x=positive, tol=1e-4)
binary("pow", lambda x, y: (x.double() ** y.double()).round().to(torch.int32), ["i32"], make_y=ints_in(0, 4))
binary("maximum", lambda x, y: torch.where(x >= y, x, y), ["f32", "i32"])
binary("minimum", lambda x, y: torch.where(x <= y, x, y), ["f32", "i32"])
binary("atan2", lambda x, y: torch.atan2(x.double(), y.double()).float(), ["f32"])
binary("logical_and", lambda x, y: x & y, ["i1"])
binary("logical_or", lambda x, y: x | y, ["i1"])
binary("logical_xor", lambda x, y: x ^ y, ["i1"])
binary("bitwise_and", lambda x, y: x & y, ["i32", "i1"])
binary("bitwise_or", lambda x, y: x | y, ["i32", "i1"])
binary("bitwise_xor", lambda x, y: x ^ y, ["i32", "i1"])
for _op, _fn in {
    "eq": lambda x, y: x == y,
    "ne": lambda x, y: x != y,
    "lt": lambda x, y: x < y,
    "le": lambda x, y: x <= y,
    "gt": lambda x, y: x > y,
    "ge": lambda x, y: x >= y,
}.items():
    binary(_op, _fn, ["f32", "i32"], result="i1")

case(
    "select",
    [("p", "i1", AB), ("x", "f32", AB), ("y", "f32", AB)],
    lambda g, p, x, y: g.add("select", [p, x, y]),
    lambda p, x, y: x * p + y * ~p,
    lambda S: T("f32", S.a, S.b),
    ENVS2,
)
case(
    "select",
    [("p", "i1", AB), ("x", "i64", AB), ("y", "i64", AB)],
    lambda g, p, x, y: g.add("select", [p, x, y]),
    lambda p, x, y: x * p + y * ~p,
    lambda S: T("i64", S.a, S.b),
    ENVS2[:2],
)
for _src, _dst, _fn in [
    ("f32", "i32", lambda x: torch.tensor([int(v) for v in x.flatten().tolist()], dtype=torch.int32).reshape(x.shape)),  # truncates
    ("i32", "f32", lambda x: x.double().float()),
    ("f32", "i1", lambda x: x != 0),
    ("i1", "f32", lambda x: x.to(torch.uint8).float()),
    ("f32", "f16", lambda x: x.half()),
]:
    case(
        "convert",
        [("x", _src, AB)],
        lambda g, x, dt=_dst: g.add("convert", [x], {"dtype": dt}),
        _fn,
        lambda S, dt=_dst: T(dt, S.a, S.b),
        ENVS2,
        make={"x": lambda s, e, g: torch.randn(s, generator=g) * 4} if _dst == "i32" else {},
    )



def _shift_expected(left: bool):
    """Python integers: x << y wrapped to 32 bits, x >> y arithmetic; y outside [0, 32) gives the sign fill."""

    def run(x, y):
        out = []
        for v, s in zip(x.flatten().tolist(), y.flatten().tolist()):
            if not 0 <= s < 32:
                out.append(-1 if not left and v < 0 else 0)
            elif left:
                w = (v << s) % (1 << 32)
                out.append(w - (1 << 32) if w >= 1 << 31 else w)
            else:
                out.append(v >> s)
        return torch.tensor(out, dtype=torch.int32).reshape(x.shape)

    return run


binary("shift_left", _shift_expected(True), ["i32"], make_y=ints_in(-3, 36))
binary("shift_right", _shift_expected(False), ["i32"], make_y=ints_in(-3, 36))
case(
    "bitcast",
    [("x", "i32", AB)],
    lambda g, x: g.add("bitcast", [x], {"dtype": "f32"}),
    lambda x: torch.tensor(np.frombuffer(x.numpy().tobytes(), np.float32).copy()).reshape(x.shape),
    lambda S: T("f32", S.a, S.b),
    ENVS2,
    make={"x": lambda s, e, g: torch.randn(s, generator=g).view(torch.int32)},  # the bits of ordinary floats
)

# -- constants and movement ------------------------------------------------------------------
case("constant", [], lambda g: g.add_constant(torch.tensor(2.5)), lambda: torch.tensor(2.5), lambda S: T("f32"))
case("constant", [], lambda g: g.add_constant(torch.tensor(-3)), lambda: torch.tensor(-3, dtype=torch.int64), lambda S: T("i64"))
for _shape in [(1,), (3, 5), (0, 2)]:
    _payload = torch.arange(math.prod(_shape), dtype=torch.float32).reshape(_shape) * 0.5
    case("constant", [], lambda g, p=_payload: g.add_constant(p, name="w"), lambda p=_payload: p.clone(), lambda S, s=_shape: T("f32", *s))

case(
    "broadcast_in_dim",
    [("x", "f32", ("a", 1)), ("y", "f32", ("c",))],
    lambda g, x, y: g.add("broadcast_in_dim", [x, dim(g, x, 0), const(g, 4), dim(g, y, 0)], {"dims": (0, 2)}),
    lambda x, y: torch.broadcast_to(x.unsqueeze(1), (x.shape[0], 4, y.shape[0])),
    lambda S: T("f32", S.a, 4, S.c),
    [{"a": 1, "c": 1}, {"a": 3, "c": 5}, {"a": 0, "c": 2}, {"a": 2, "c": 0}],
)
case(
    "broadcast_in_dim",
    [("x", "i32", ("b",))],
    lambda g, x: g.add("broadcast_in_dim", [x, const(g, 3), dim(g, x, 0)], {"dims": (1,)}),
    lambda x: torch.stack([x, x, x]),
    lambda S: T("i32", 3, S.b),
    [{"b": 1}, {"b": 7}, {"b": 0}],
)
case(
    "broadcast_in_dim",
    [("x", "f32", ()), ("y", "f32", ("a", "b"))],
    lambda g, x, y: g.add("broadcast_in_dim", [x, dim(g, y, 0), dim(g, y, 1)], {"dims": ()}),
    lambda x, y: torch.full(y.shape, x.item()),
    lambda S: T("f32", S.a, S.b),
    ENVS2,
)

case(
    "reshape",
    [("x", "f32", ("a", "b", 4))],
    lambda g, x: g.add("reshape", [x, g.add("imul", [dim(g, x, 0), dim(g, x, 1)]), const(g, 4)]),
    lambda x: x.flatten(0, 1),
    lambda S: T("f32", S.a * S.b, 4),
    ENVS2,
)
case(
    "reshape",
    [("x", "i64", ("a", 6))],
    lambda g, x: g.add("reshape", [x, dim(g, x, 0), const(g, 2), const(g, 3)]),
    lambda x: x.unflatten(1, (2, 3)),
    lambda S: T("i64", S.a, 2, 3),
    [{"a": 1}, {"a": 5}, {"a": 0}],
)
case(
    "transpose",
    [("x", "f32", ("a", "b", "c"))],
    lambda g, x: g.add("transpose", [x], {"perm": (2, 0, 1)}),
    lambda x: x.movedim(2, 0),
    lambda S: T("f32", S.c, S.a, S.b),
    [{"a": 1, "b": 1, "c": 1}, {"a": 2, "b": 3, "c": 5}, {"a": 0, "b": 3, "c": 2}],
)
case(
    "transpose",
    [("x", "i1", AB)],
    lambda g, x: g.add("transpose", [x], {"perm": (1, 0)}),
    lambda x: x.t(),
    lambda S: T("i1", S.b, S.a),
    ENVS2,
)
case(
    "iota",
    [("x", "f32", ("a",))],
    lambda g, x: g.add("iota", [dim(g, x, 0)], {"dtype": "i64"}),
    lambda x: torch.tensor(list(range(x.shape[0])), dtype=torch.int64),
    lambda S: T("i64", S.a),
    [{"a": 1}, {"a": 7}, {"a": 0}],
)
case(
    "iota",
    [],
    lambda g: g.add("iota", [const(g, 5)], {"dtype": "f32"}),
    lambda: torch.tensor([0.0, 1, 2, 3, 4]),
    lambda S: T("f32", 5),
)



def splitmix_uniform(seed: int, site: int, shape: tuple[int, ...]) -> torch.Tensor:
    """SplitMix64 over (seed, site, position) in Python's unbounded ints, masked to 64 bits."""
    mask = (1 << 64) - 1
    values = []
    for i in range(math.prod(shape)):
        z = (seed + (site + 1) * 0xD1B54A32D192ED03 + i * 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        values.append((z >> 40) / 2**24)
    return torch.tensor(values, dtype=torch.float32).reshape(shape)


case(
    "random_uniform",
    [("s", "i64", (1,)), ("x", "f32", ("a", "b"))],
    lambda g, s, x: g.add("random_uniform", [s, dim(g, x, 0), dim(g, x, 1)], {"site": 3}),
    lambda s, x: splitmix_uniform(int(s[0]), 3, tuple(x.shape)),
    lambda S: T("f32", S.a, S.b),
    [{"a": 1, "b": 1}, {"a": 3, "b": 5}, {"a": 0, "b": 4}, {"a": 2, "b": 9}],
    make={"s": lambda shape, env, gen: torch.tensor([-(2**63) + 5 if env["b"] == 9 else 2**62 + env["a"]])},
)

# -- reductions ------------------------------------------------------------------------------------
ENVS3 = [{"a": 1, "b": 1, "c": 1}, {"a": 3, "b": 5, "c": 2}, {"a": 0, "b": 3, "c": 4}]
ABC = ("a", "b", "c")


def reduce_case(kind, dtype, dims, keepdim, eager, expect, envs=ENVS3, tol=1e-5):
    case(
        "reduce",
        [("x", dtype, ABC)],
        lambda g, x: g.add("reduce", [x], {"dims": dims, "kind": kind, "keepdim": keepdim}),
        eager,
        expect,
        envs,
        tol=tol,
    )


reduce_case("sum", "f32", (0, 2), False, lambda x: x.double().sum((0, 2)).float(), lambda S: T("f32", S.b), tol=1e-4)
reduce_case("sum", "i32", (1,), True, lambda x: x.long().sum(1, keepdim=True).int(), lambda S: T("i32", S.a, 1, S.c))
reduce_case("max", "f32", (1,), True, lambda x: x.max(1, keepdim=True).values, lambda S: T("f32", S.a, 1, S.c))
reduce_case("min", "i32", (2, 0), False, lambda x: x.min(2).values.min(0).values, lambda S: T("i32", S.b), ENVS3[:2])
reduce_case("prod", "f32", (0, 1), False, lambda x: x.double().flatten(0, 1).prod(0).float(), lambda S: T("f32", S.c), tol=1e-4)
reduce_case("any", "i1", (1,), False, lambda x: x.sum(1) > 0, lambda S: T("i1", S.a, S.c))
reduce_case("all", "i1", (-1,), True, lambda x: x.sum(2, keepdim=True) == x.shape[2], lambda S: T("i1", S.a, S.b, 1))
reduce_case("sum", "f32", (), False, lambda x: x.clone(), lambda S: T("f32", S.a, S.b, S.c))

case(
    "dot_general",
    [("x", "f32", ("m", "k")), ("y", "f32", ("k", "n"))],
    lambda g, x, y: g.add("dot_general", [x, y], {"lhs_contract": (1,), "rhs_contract": (0,)}),
    lambda x, y: (x.double() @ y.double()).float(),
    lambda S: T("f32", S.m, S.n),
    [{"m": 1, "k": 1, "n": 1}, {"m": 3, "k": 5, "n": 7}, {"m": 0, "k": 2, "n": 3}, {"m": 2, "k": 0, "n": 3}],
    tol=1e-4,
)
case(
    "dot_general",
    [("x", "f32", ("b", "m", "k")), ("y", "f32", ("b", "n", "k"))],
    lambda g, x, y: g.add("dot_general", [x, y], {"lhs_batch": (0,), "rhs_batch": (0,), "lhs_contract": (2,), "rhs_contract": (2,)}),
    lambda x, y: torch.bmm(x.double(), y.double().transpose(1, 2)).float(),
    lambda S: T("f32", S.b, S.m, S.n),
    [{"b": 1, "m": 1, "k": 1, "n": 1}, {"b": 2, "m": 3, "k": 5, "n": 4}, {"b": 0, "m": 2, "k": 3, "n": 1}],
    tol=1e-4,
)
case(
    "dot_general",
    [("x", "f32", ("k", "m")), ("y", "f32", ("n", "k"))],
    lambda g, x, y: g.add("dot_general", [x, y], {"lhs_contract": (0,), "rhs_contract": (1,)}),
    lambda x, y: (x.double().t() @ y.double().t()).float(),
    lambda S: T("f32", S.m, S.n),
    [{"m": 2, "k": 3, "n": 5}],
    tol=1e-4,
)



def _attention_float64(q, k, v, bias=None, scale=1.0):
    s = q.double() @ k.double().transpose(-1, -2) * scale
    s = s if bias is None else s + bias.double()
    return (torch.softmax(s, -1) @ v.double()).float()


case(
    "attention",
    [("q", "f32", ("b", 2, "l", 4)), ("k", "f32", ("b", 2, "s", 4)), ("v", "f32", ("b", 2, "s", 3)), ("bias", "f32", ("b", 2, "l", "s"))],
    lambda g, q, k, v, bias: g.add("attention", [q, k, v, bias], {"scale": 0.5}),
    lambda q, k, v, bias: _attention_float64(q, k, v, bias, 0.5),
    lambda S: T("f32", S.b, 2, S.l, 3),
    [{"b": 1, "l": 1, "s": 1}, {"b": 2, "l": 3, "s": 5}, {"b": 0, "l": 2, "s": 3}],
    tol=1e-5,
)
case(
    "attention",
    [("q", "f32", ("b", 1, "l", 4)), ("k", "f32", ("b", 1, "s", 4)), ("v", "f32", ("b", 1, "s", 4))],
    lambda g, q, k, v: g.add("attention", [q, k, v]),
    lambda q, k, v: _attention_float64(q, k, v),
    lambda S: T("f32", S.b, 1, S.l, 4),
    [{"b": 1, "l": 7, "s": 2}, {"b": 3, "l": 1, "s": 9}],
    tol=1e-5,
)

# -- shape computation ------------------------------------------------------------------------------
case("dim", [("x", "f32", AB)], lambda g, x: dim(g, x, 1), lambda x: x.shape[1], lambda S: I(S.b), ENVS2)
case("dim", [("x", "i1", ("a", 3))], lambda g, x: dim(g, x, -1), lambda x: x.size(-1), lambda S: I(3), [{"a": 2}])
for _v in (0, 1, 7):
    case("index_const", [], lambda g, v=_v: const(g, v), lambda v=_v: v, lambda S, v=_v: I(v))
case(
    "iadd",
    [("x", "f32", AB)],
    lambda g, x: g.add("iadd", [dim(g, x, 0), dim(g, x, 1)]),
    lambda x: x.shape[0] + x.shape[1],
    lambda S: I(S.a + S.b),
    ENVS2,
)
case(
    "iadd",
    [("x", "f32", AB)],
    lambda g, x: g.add("iadd", [dim(g, x, 0), const(g, -2)]),
    lambda x: x.shape[0] - 2,
    lambda S: I(S.a - 2),
    ENVS2[:1],
)
case(
    "isub",
    [("x", "f32", AB)],
    lambda g, x: g.add("isub", [dim(g, x, 0), dim(g, x, 1)]),
    lambda x: x.shape[0] - x.shape[1],
    lambda S: I(S.a - S.b),
    ENVS2,
)
case(
    "imul",
    [("x", "f32", AB)],
    lambda g, x: g.add("imul", [dim(g, x, 0), dim(g, x, 1)]),
    lambda x: x.shape[0] * x.shape[1],
    lambda S: I(S.a * S.b),
    ENVS2,
)
case(
    "ifloordiv",
    [("x", "f32", AB)],
    lambda g, x: g.add("ifloordiv", [dim(g, x, 1), const(g, 3)]),
    lambda x: x.shape[1] // 3,
    lambda S: I(S.b // 3),
    [{"a": 1, "b": 1}, {"a": 1, "b": 7}, {"a": 0, "b": 0}, {"a": 0, "b": 9}],
)
case(
    "ifloordiv",
    [("x", "f32", AB)],
    lambda g, x: g.add("ifloordiv", [g.add("imul", [dim(g, x, 0), dim(g, x, 1)]), dim(g, x, 1)]),
    lambda x: x.shape[0],
    lambda S: I(S.a),
    [{"a": 3, "b": 2}],
)
case(
    "ifloordiv",
    [("x", "f32", AB)],
    lambda g, x: g.add("ifloordiv", [dim(g, x, 0), dim(g, x, 1)]),
    lambda x: x.shape[0] // x.shape[1],
    None,  # a fresh symbol
    [{"a": 7, "b": 2}, {"a": 1, "b": 1}],
)
for _op, _pick in (("imax", max), ("imin", min)):
    case(
        _op,
        [("x", "f32", AB)],
        lambda g, x, op=_op: g.add(op, [g.add("iadd", [dim(g, x, 0), const(g, 1)]), dim(g, x, 0)]),
        lambda x, p=_pick: p(x.shape[0] + 1, x.shape[0]),
        lambda S, op=_op: I(S.a + 1 if op == "imax" else S.a),
        ENVS2[:2],
    )
    case(_op, [("x", "f32", AB)], lambda g, x, op=_op: g.add(op, [dim(g, x, 0), dim(g, x, 1)]), lambda x, p=_pick: p(*x.shape), None, ENVS2)

# -- indexing ------------------------------------------------------------------------------------
case(
    "slice",
    [("x", "f32", AB)],
    lambda g, x: g.add("slice", [x, const(g, 1), dim(g, x, 1)], {"axis": 1}),
    lambda x: x[:, 1:],
    lambda S: T("f32", S.a, S.b - 1),
    [{"a": 1, "b": 1}, {"a": 3, "b": 6}, {"a": 0, "b": 2}],
)
case(
    "slice",
    [("x", "i1", AB)],
    lambda g, x: g.add("slice", [x, const(g, 0), dim(g, x, 1)], {"axis": -1, "step": 2}),
    lambda x: x[:, ::2],
    lambda S: T("i1", S.a, (S.b + 1) // 2),
    ENVS2 + [{"a": 2, "b": 6}],
)
case(
    "slice",
    [("x", "i32", ("a", 5)), ("y", "f32", ("c",))],
    lambda g, x, y: g.add("slice", [x, dim(g, y, 0), dim(g, x, 0)], {"axis": 0, "step": 3}),
    lambda x, y: x[y.shape[0] :: 3],
    lambda S: T("i32", (S.a - S.c).ceildiv(3), 5),
    [{"a": 7, "c": 2}, {"a": 1, "c": 1}, {"a": 4, "c": 0}, {"a": 9, "c": 3}],
)
case(
    "slice",
    [("x", "f32", (4, "b"))],
    lambda g, x: g.add("slice", [x, const(g, 1), const(g, 3)], {"axis": 0}),
    lambda x: x[1:3],
    lambda S: T("f32", 2, S.b),
    [{"b": 1}, {"b": 0}],
)


def cat_manual(xs, axis):
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    out = torch.empty(shape, dtype=xs[0].dtype)
    at = 0
    for x in xs:
        out.narrow(axis, at, x.shape[axis]).copy_(x)
        at += x.shape[axis]
    return out


case(
    "concat",
    [("x", "f32", ("a", "c")), ("y", "f32", ("b", "c")), ("z", "f32", (1, "c"))],
    lambda g, x, y, z: g.add("concat", [x, y, z], {"axis": 0}),
    lambda x, y, z: cat_manual([x, y, z], 0),
    lambda S: T("f32", S.a + S.b + 1, S.c),
    [{"a": 1, "b": 1, "c": 1}, {"a": 3, "b": 0, "c": 5}, {"a": 0, "b": 2, "c": 0}],
)
case(
    "concat",
    [("x", "i64", AB), ("y", "i64", ("a", 3))],
    lambda g, x, y: g.add("concat", [x, y], {"axis": -1}),
    lambda x, y: cat_manual([x, y], 1),
    lambda S: T("i64", S.a, S.b + 3),
    ENVS2,
)
case("concat", [("x", "i1", AB)], lambda g, x: g.add("concat", [x], {"axis": 1}), lambda x: x.clone(), lambda S: T("i1", S.a, S.b), ENVS2)


def pad_manual(x, low, high, value):
    out_shape = [n + lo + hi for n, lo, hi in zip(x.shape, low, high)]
    out = torch.full(out_shape, value, dtype=x.dtype)
    src, dst = [], []
    for n, lo, hi in zip(x.shape, low, high):
        s0, s1 = max(0, -lo), n - max(0, -hi)
        src.append(slice(s0, s1))
        dst.append(slice(s0 + lo, s1 + lo))
    out[tuple(dst)] = x[tuple(src)]
    return out


case(
    "pad",
    [("x", "f32", AB)],
    lambda g, x: g.add("pad", [x], {"low": (1, -1), "high": (0, 2), "value": 1.5}),
    lambda x: pad_manual(x, (1, -1), (0, 2), 1.5),
    lambda S: T("f32", S.a + 1, S.b + 1),
    [{"a": 1, "b": 1}, {"a": 3, "b": 4}, {"a": 0, "b": 2}],
)
case(
    "pad",
    [("x", "i32", ("a", 2, "b"))],
    lambda g, x: g.add("pad", [x], {"low": (0, 2, 0), "high": (1, 0, -2)}),
    lambda x: pad_manual(x, (0, 2, 0), (1, 0, -2), 0),
    lambda S: T("i32", S.a + 1, 4, S.b - 2),
    [{"a": 1, "b": 2}, {"a": 0, "b": 5}, {"a": 3, "b": 3}],
)
case("pad", [("x", "f32", ())], lambda g, x: g.add("pad", [x], {"low": (), "high": ()}), lambda x: x.clone(), lambda S: T("f32"))

case(
    "gather",
    [("x", "f32", AB), ("i", "i64", ("a", "c"))],
    lambda g, x, i: g.add("gather", [x, i], {"axis": 1}),
    lambda x, i: torch.take_along_dim(x, i, 1),
    lambda S: T("f32", S.a, S.c),
    [{"a": 1, "b": 1, "c": 1}, {"a": 3, "b": 5, "c": 7}, {"a": 0, "b": 2, "c": 3}, {"a": 2, "b": 3, "c": 0}],
    make={"i": index_below("b")},
)
case(
    "gather",
    [("x", "i32", AB), ("i", "i64", ("c", "b"))],
    lambda g, x, i: g.add("gather", [x, i], {"axis": 0}),
    lambda x, i: x[i, torch.arange(x.shape[1])],
    lambda S: T("i32", S.c, S.b),
    [{"a": 1, "b": 1, "c": 1}, {"a": 4, "b": 3, "c": 6}, {"a": 2, "b": 0, "c": 3}],
    make={"i": index_below("a")},
)
case(
    "gather",
    [("x", "f32", (4, 5)), ("i", "i64", (2, 3))],
    lambda g, x, i: g.add("gather", [x, i], {"axis": -1}),
    lambda x, i: x[torch.arange(2)[:, None], i],
    lambda S: T("f32", 2, 3),
    make={"i": index_below(5)},
)
case(
    "index_select",
    [("x", "f32", AB), ("i", "i64", ("c",))],
    lambda g, x, i: g.add("index_select", [x, i], {"axis": 0}),
    lambda x, i: x[i],
    lambda S: T("f32", S.c, S.b),
    [{"a": 1, "b": 1, "c": 1}, {"a": 5, "b": 3, "c": 7}, {"a": 2, "b": 0, "c": 4}, {"a": 3, "b": 2, "c": 0}],
    make={"i": index_below("a")},
)
case(
    "index_select",
    [("x", "i64", AB), ("i", "i32", ("c",))],
    lambda g, x, i: g.add("index_select", [x, i], {"axis": -1}),
    lambda x, i: x[:, i.long()],
    lambda S: T("i64", S.a, S.c),
    [{"a": 1, "b": 1, "c": 1}, {"a": 3, "b": 5, "c": 2}, {"a": 0, "b": 3, "c": 2}],
    make={"i": index_below("b", "i32")},
)


def scatter_add_manual(x, idx, src, axis):
    out = x.clone()
    for pos in torch.cartesian_prod(*[torch.arange(n) for n in idx.shape]).reshape(-1, idx.dim()).tolist() if idx.numel() else []:
        dst = list(pos)
        dst[axis] = int(idx[tuple(pos)])
        out[tuple(dst)] += src[tuple(pos)]
    return out


case(
    "scatter_add",
    [("x", "f32", AB), ("i", "i64", ("c", "b")), ("s", "f32", ("c", "b"))],
    lambda g, x, i, s: g.add("scatter_add", [x, i, s], {"axis": 0}),
    lambda x, i, s: x.clone().index_put_((i, torch.arange(x.shape[1]).expand_as(i)), s, accumulate=True),
    lambda S: T("f32", S.a, S.b),
    [{"a": 1, "b": 1, "c": 1}, {"a": 3, "b": 4, "c": 6}, {"a": 2, "b": 0, "c": 3}, {"a": 2, "b": 3, "c": 0}],
    make={"i": index_below("a")},
)
case(
    "scatter_add",
    [("x", "i32", (3, 4)), ("i", "i64", (2, 3)), ("s", "i32", (2, 5))],
    lambda g, x, i, s: g.add("scatter_add", [x, i, s], {"axis": 1}),
    lambda x, i, s: scatter_add_manual(x, i, s, 1),
    lambda S: T("i32", 3, 4),
    make={"i": index_below(4)},
)
case(
    "cumsum",
    [("x", "f32", AB)],
    lambda g, x: g.add("cumsum", [x], {"axis": 1}),
    lambda x: (x.double() @ torch.ones(x.shape[1], x.shape[1], dtype=torch.float64).triu()).float(),
    lambda S: T("f32", S.a, S.b),
    ENVS2,
    tol=1e-5,
)
case(
    "cumsum",
    [("x", "i32", AB)],
    lambda g, x: g.add("cumsum", [x], {"axis": -2}),
    lambda x: (torch.ones(x.shape[0], x.shape[0], dtype=torch.float64).tril() @ x.double()).to(torch.int32),
    lambda S: T("i32", S.a, S.b),
    ENVS2,
)



def mask_with(count: str):
    """A bool mask with exactly env[count] true elements, at random positions."""

    def make(shape, env, gen):
        flat = torch.zeros(shape, dtype=torch.bool).reshape(-1)
        flat[torch.randperm(flat.numel(), generator=gen)[: env[count]]] = True
        return flat.reshape(shape)

    return make


# The count is a symbol the rule declares (data-dependent): the envs fix it through the masks made.
case(
    "nonzero",
    [("m", "i1", ("a",))],
    lambda g, m: g.add("nonzero", [m], {"count": "cnt"}),
    lambda m: torch.nonzero(m).reshape(-1),
    None,
    [{"a": 0, "cnt": 0}, {"a": 1, "cnt": 1}, {"a": 1, "cnt": 0}, {"a": 9, "cnt": 4}, {"a": 5, "cnt": 5}],
    make={"m": mask_with("cnt")},
)
case(
    "nonzero",
    [("m", "i1", (7,))],
    lambda g, m: g.add("nonzero", [m], {"count": "cnt"}),
    lambda m: torch.nonzero(m).reshape(-1),
    None,
    [{"cnt": 3}, {"cnt": 7}],
    make={"m": mask_with("cnt")},
)


def test_a_nonzero_count_is_a_symbol_of_its_own_bounded_by_a_static_mask():
    g = Graph()
    a = g.constraints.declare("a", source="test")
    dynamic = g.add("nonzero", [g.add_input("m", T("i1", a))], {"count": "k"})
    static = g.add("nonzero", [g.add_input("s", T("i1", 7))], {"count": "j"})
    assert str(dynamic.type) == "i64[k]" and g.constraints.bounds(dynamic.shape[0]) == (0, float("inf"))
    assert g.constraints.bounds(static.shape[0]) == (0, 7)
    g.outputs = [dynamic, static]
    text = print_graph(g)
    assert print_graph(parse_graph(text)) == text


def test_nonzero_takes_a_flat_mask():
    g = Graph()
    with pytest.raises(ShapeRuleError, match="1-D i1"):
        g.add("nonzero", [g.add_input("m", T("i1", 2, 3))], {"count": "k"})
    with pytest.raises(ShapeRuleError, match="1-D i1"):
        g.add("nonzero", [g.add_input("f", T("f32", 3))], {"count": "k"})

# -- nn ----------------------------------------------------------------------------------------------
def first_arg(x, axis, pick_max):
    best = x.amax(axis, keepdim=True) if pick_max else x.amin(axis, keepdim=True)
    pos = torch.arange(x.shape[axis]).reshape([-1 if d == axis else 1 for d in range(x.dim())])
    return torch.where(x == best, pos, x.shape[axis]).amin(axis)


case(
    "argreduce",
    [("x", "f32", AB)],
    lambda g, x: g.add("argreduce", [x], {"axis": 1}),
    lambda x: first_arg(x, 1, True),
    lambda S: T("i64", S.a),
    [{"a": 1, "b": 1}, {"a": 3, "b": 5}, {"a": 0, "b": 2}],
)
case(
    "argreduce",
    [("x", "i32", AB)],
    lambda g, x: g.add("argreduce", [x], {"axis": 0, "kind": "argmin", "keepdim": True}),
    lambda x: first_arg(x, 0, False).unsqueeze(0),
    lambda S: T("i64", 1, S.b),
    [{"a": 1, "b": 1}, {"a": 7, "b": 4}, {"a": 2, "b": 0}],
    make={"x": ints_in(0, 3)},  # many ties: the first index wins
)
case(
    "argreduce",
    [("x", "f32", ("a", "b", "c"))],
    lambda g, x: g.add("argreduce", [x], {"axis": -1, "kind": "argmin"}),
    lambda x: first_arg(x, 2, False),
    lambda S: T("i64", S.a, S.b),
    [{"a": 2, "b": 3, "c": 4}],
)


def conv(op_attrs):
    return lambda g, x, w: g.add("convolution", [x, w], op_attrs)


case(
    "convolution",
    [("x", "f32", ("n", 4, "h", "w")), ("k", "f32", (6, 2, 3, 3))],
    conv({"stride": (2, 1), "padding": (1, 0), "dilation": (1, 2), "groups": 2}),
    lambda x, k: F.conv2d(x.double(), k.double(), None, (2, 1), (1, 0), (1, 2), 2).float(),
    lambda S: T("f32", S.n, 6, (S.h - 1) // 2 + 1, S.w - 4),
    [{"n": 1, "h": 1, "w": 5}, {"n": 2, "h": 7, "w": 9}, {"n": 0, "h": 4, "w": 6}],
    tol=1e-4,
)
case(
    "convolution",
    [("x", "f32", ("n", 3, "l")), ("k", "f32", (5, 3, "k"))],
    conv({"stride": (3,), "padding": (2,), "dilation": (2,)}),
    lambda x, k: F.conv1d(x.double(), k.double(), None, 3, 2, 2).float(),
    lambda S: T("f32", S.n, 5, (S.l + 4 - 2 * S.k + 2 - 1) // 3 + 1),
    [{"n": 1, "l": 1, "k": 1}, {"n": 2, "l": 11, "k": 3}, {"n": 3, "l": 4, "k": 4}],
    tol=1e-4,
)
case(
    "convolution",
    [("x", "f32", ("n", 2, "d", "h", "w")), ("k", "f32", (4, 2, 1, 2, 3))],
    conv({"stride": (1, 2, 1), "padding": (0, 1, 1), "dilation": (1, 1, 1)}),
    lambda x, k: F.conv3d(x.double(), k.double(), None, (1, 2, 1), (0, 1, 1)).float(),
    lambda S: T("f32", S.n, 4, S.d, S.h // 2 + 1, S.w),
    [{"n": 1, "d": 1, "h": 1, "w": 1}, {"n": 2, "d": 3, "h": 5, "w": 4}],
    tol=1e-4,
)
case(
    "convolution",
    [("x", "f32", ("n", 4, "h", "w")), ("k", "f32", (4, 3, 3, 2))],
    conv({"stride": (2, 1), "padding": (1, 0), "dilation": (1, 1), "groups": 2, "transposed": True, "output_padding": (1, 0)}),
    lambda x, k: F.conv_transpose2d(x.double(), k.double(), None, (2, 1), (1, 0), (1, 0), 2, 1).float(),
    lambda S: T("f32", S.n, 6, 2 * S.h, S.w + 1),
    [{"n": 1, "h": 1, "w": 1}, {"n": 2, "h": 5, "w": 3}, {"n": 0, "h": 2, "w": 2}],
    tol=1e-4,
)
case(
    "convolution",
    [("x", "f64", ("n", 2, "l")), ("k", "f64", (2, 1, 3))],
    conv({"stride": (2,), "padding": (1,), "dilation": (2,), "transposed": True}),
    lambda x, k: F.conv_transpose1d(x, k, None, 2, 1, 0, 1, 2),
    lambda S: T("f64", S.n, 1, 2 * S.l + 1),
    [{"n": 1, "l": 1}, {"n": 2, "l": 6}],
)

case(
    "convolution",
    [("x", "f32", ("n", "h", "w", 4)), ("k", "f32", (6, 2, 3, 3))],
    conv({"stride": (2, 1), "padding": (1, 0), "dilation": (1, 2), "groups": 2, "channels_last": True}),
    lambda x, k: F.conv2d(x.double().permute(0, 3, 1, 2), k.double(), None, (2, 1), (1, 0), (1, 2), 2).permute(0, 2, 3, 1).float(),
    lambda S: T("f32", S.n, (S.h - 1) // 2 + 1, S.w - 4, 6),
    [{"n": 1, "h": 1, "w": 5}, {"n": 2, "h": 7, "w": 9}, {"n": 0, "h": 4, "w": 6}],
    tol=1e-4,
)

GRAD_GEOMETRY = {"stride": (2, 2), "padding": (1, 1), "dilation": (1, 1), "groups": 2}


def _index(g: Graph, value: int) -> Node:
    return g.add("index_const", [], {"value": value})


# dL/dx of a stride-2 convolution: x is twice gy's size (the output-size floor allows two sizes).
case(
    "convolution_backward_input",
    [("gy", "f32", ("n", 6, "oh", "ow")), ("k", "f32", (6, 2, 3, 3))],
    lambda g, gy, k: g.add(
        "convolution_backward_input",
        [gy, k, dim(g, gy, 0), _index(g, 4), g.add("imul", [dim(g, gy, 2), _index(g, 2)]), g.add("imul", [dim(g, gy, 3), _index(g, 2)])],
        GRAD_GEOMETRY,
    ),
    lambda gy, k: torch.nn.grad.conv2d_input((gy.shape[0], 4, 2 * gy.shape[2], 2 * gy.shape[3]), k.double(), gy.double(), 2, 1, 1, 2).float(),
    lambda S: T("f32", S.n, 4, 2 * S.oh, 2 * S.ow),
    [{"n": 1, "oh": 1, "ow": 1}, {"n": 2, "oh": 3, "ow": 4}, {"n": 0, "oh": 2, "ow": 2}],
    tol=1e-4,
)
case(
    "convolution_backward_input",
    [("gy", "f32", ("n", "h", "w", 6)), ("k", "f32", (6, 3, 1, 3))],
    lambda g, gy, k: g.add(
        "convolution_backward_input",
        [gy, k, dim(g, gy, 0), dim(g, gy, 1), g.add("iadd", [dim(g, gy, 2), _index(g, 4)]), _index(g, 3)],
        {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 2), "groups": 1, "channels_last": True},
    ),
    lambda gy, k: torch.nn.grad.conv2d_input((gy.shape[0], 3, gy.shape[1], gy.shape[2] + 4), k.double(), gy.double().permute(0, 3, 1, 2), 1, 0, (1, 2))
    .permute(0, 2, 3, 1)
    .float(),
    lambda S: T("f32", S.n, S.h, S.w + 4, 3),
    [{"n": 1, "h": 1, "w": 1}, {"n": 2, "h": 4, "w": 3}],
    tol=1e-4,
)
case(
    "convolution_backward_weight",
    [("x", "f32", ("n", 4, "h", "w")), ("gy", "f32", ("n", 6, "oh", "ow"))],
    lambda g, x, gy: g.add("convolution_backward_weight", [x, gy], {**GRAD_GEOMETRY, "kernel": (3, 3)}),
    lambda x, gy: torch.nn.grad.conv2d_weight(x.double(), (6, 2, 3, 3), gy.double(), 2, 1, 1, 2).float(),
    lambda S: T("f32", 6, 2, 3, 3),
    [{"n": 1, "h": 1, "w": 2, "oh": 1, "ow": 1}, {"n": 2, "h": 7, "w": 6, "oh": 4, "ow": 3}, {"n": 0, "h": 3, "w": 3, "oh": 2, "ow": 2}],
    tol=1e-4,
)
case(
    "convolution_backward_weight",
    [("x", "f32", ("n", "h", "w", 4)), ("gy", "f32", ("n", "h", "w", 5))],
    lambda g, x, gy: g.add(
        "convolution_backward_weight", [x, gy], {"kernel": (1, 3), "stride": (1, 1), "padding": (0, 1), "dilation": (1, 1), "groups": 1, "channels_last": True}
    ),
    lambda x, gy: torch.nn.grad.conv2d_weight(x.double().permute(0, 3, 1, 2), (5, 4, 1, 3), gy.double().permute(0, 3, 1, 2), 1, (0, 1)).float(),
    lambda S: T("f32", 5, 4, 1, 3),
    [{"n": 1, "h": 1, "w": 1}, {"n": 2, "h": 3, "w": 5}],
    tol=1e-4,
)

NCHW = ("n", "c", "h", "w")
P11 = ((0, 0), (0, 0), (1, 1), (1, 1))


def rw(kind, window, strides, padding=(), dilation=(), ceil_mode=False, index_dims=()):
    attrs = {"kind": kind, "window": window, "strides": strides, "padding": padding, "dilation": dilation, "ceil_mode": ceil_mode}
    return lambda g, x: g.add("reduce_window", [x], {**attrs, "index_dims": index_dims})


case(
    "reduce_window",
    [("x", "f32", NCHW)],
    rw("max", (1, 1, 3, 3), (1, 1, 2, 2), P11),
    lambda x: F.max_pool2d(x, 3, 2, 1),
    lambda S: T("f32", S.n, S.c, (S.h - 1) // 2 + 1, (S.w - 1) // 2 + 1),
    [{"n": 1, "c": 1, "h": 1, "w": 1}, {"n": 2, "c": 3, "h": 7, "w": 8}, {"n": 0, "c": 2, "h": 5, "w": 4}],
)
case(
    "reduce_window",
    [("x", "f32", NCHW)],
    rw("max", (1, 1, 2, 2), (1, 1, 3, 3), ceil_mode=True),
    lambda x: F.max_pool2d(x, 2, 3, ceil_mode=True),
    lambda S: T("f32", S.n, S.c, (S.h - 1) // 3 + 1, (S.w - 1) // 3 + 1),
    [{"n": 1, "c": 1, "h": 1, "w": 2}, {"n": 2, "c": 3, "h": 7, "w": 8}, {"n": 1, "c": 2, "h": 5, "w": 9}],
)
case(
    "reduce_window",
    [("x", "f32", NCHW)],
    rw("max", (1, 1, 3, 3), (1, 1, 2, 2), dilation=(1, 1, 2, 1), ceil_mode=True),
    lambda x: F.max_pool2d(x, 3, 2, 0, (2, 1), ceil_mode=True),
    lambda S: T("f32", S.n, S.c, (S.h - 4) // 2 + 1, (S.w - 2) // 2 + 1),
    [{"n": 1, "c": 1, "h": 5, "w": 3}, {"n": 2, "c": 3, "h": 8, "w": 8}, {"n": 1, "c": 1, "h": 11, "w": 6}],
)
case(
    "reduce_window",
    [("x", "f32", NCHW)],
    rw("max", (1, 1, 3, 3), (1, 1, 3, 3), P11, ceil_mode=True),
    lambda x: F.max_pool2d(x, 3, 3, 1, ceil_mode=True),
    lambda S: T("f32", S.n, S.c, S.h // 3 + 1, S.w // 3 + 1),
    [{"n": 1, "c": 1, "h": 1, "w": 2}, {"n": 1, "c": 2, "h": 5, "w": 6}, {"n": 1, "c": 1, "h": 7, "w": 8}],
)
case(
    "reduce_window",
    [("x", "f32", NCHW)],
    rw("sum", (1, 1, 2, 2), (1, 1, 2, 2)),
    lambda x: F.avg_pool2d(x, 2) * 4,
    lambda S: T("f32", S.n, S.c, S.h // 2, S.w // 2),
    [{"n": 1, "c": 1, "h": 2, "w": 2}, {"n": 2, "c": 3, "h": 7, "w": 8}, {"n": 0, "c": 1, "h": 5, "w": 3}],
    tol=1e-4,
)
case(
    "reduce_window",
    [("x", "f32", NCHW)],
    rw("sum", (1, 1, 3, 3), (1, 1, 1, 1), P11),
    lambda x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=True) * 9,
    lambda S: T("f32", S.n, S.c, S.h, S.w),
    [{"n": 1, "c": 1, "h": 1, "w": 1}, {"n": 2, "c": 2, "h": 5, "w": 4}],
    tol=1e-4,
)
case(
    "reduce_window",
    [("x", "f32", ("a", "b", "c"))],
    rw("max", (3, 1, 1), (2, 1, 1), ((1, 1), (0, 0), (0, 0))),
    lambda x: F.max_pool1d(x.permute(1, 2, 0), 3, 2, 1).permute(2, 0, 1),
    lambda S: T("f32", (S.a - 1) // 2 + 1, S.b, S.c),
    [{"a": 1, "b": 1, "c": 1}, {"a": 6, "b": 2, "c": 3}, {"a": 5, "b": 0, "c": 2}],
)
case(
    "reduce_window",
    [("x", "i32", NCHW)],
    rw("max", (1, 1, 2, 3), (1, 1, 1, 2), ((0, 0), (0, 0), (1, 0), (1, 1))),
    lambda x: F.max_pool2d(F.pad(x.double(), (1, 1, 1, 0), value=-math.inf), (2, 3), (1, 2)).to(torch.int32),
    lambda S: T("i32", S.n, S.c, S.h, (S.w - 1) // 2 + 1),
    [{"n": 1, "c": 1, "h": 1, "w": 1}, {"n": 2, "c": 2, "h": 4, "w": 5}],
)

case(
    "reduce_window",
    [("x", "f32", NCHW)],
    rw("argmax", (1, 1, 3, 3), (1, 1, 2, 2), P11, index_dims=(2, 3)),
    lambda x: F.max_pool2d_with_indices(x, 3, 2, 1)[1],
    lambda S: T("i64", S.n, S.c, (S.h - 1) // 2 + 1, (S.w - 1) // 2 + 1),
    [{"n": 1, "c": 1, "h": 1, "w": 1}, {"n": 2, "c": 3, "h": 7, "w": 8}, {"n": 0, "c": 2, "h": 5, "w": 4}],
)
case(
    "reduce_window",
    [("x", "f32", ("n", "h", "w", "c"))],
    rw("argmax", (1, 2, 3, 1), (1, 3, 1, 1), dilation=(1, 2, 1, 1), ceil_mode=True, index_dims=(1, 2)),
    lambda x: F.max_pool2d_with_indices(x.permute(0, 3, 1, 2), (2, 3), (3, 1), 0, (2, 1), ceil_mode=True)[1].permute(0, 2, 3, 1),
    lambda S: T("i64", S.n, (S.h + 2) // 3, S.w - 2, S.c),
    [{"n": 1, "h": 3, "w": 3, "c": 1}, {"n": 2, "h": 8, "w": 5, "c": 3}, {"n": 1, "h": 4, "w": 4, "c": 2}],
)
case(
    "reduce_window",
    [("x", "i32", NCHW)],
    rw("argmax", (1, 1, 1, 3), (1, 1, 1, 2), ((0, 0), (0, 0), (0, 0), (1, 1)), index_dims=(2, 3)),
    lambda x: F.max_pool2d_with_indices(x.double(), (1, 3), (1, 2), (0, 1))[1],
    lambda S: T("i64", S.n, S.c, S.h, (S.w - 1) // 2 + 1),
    [{"n": 1, "c": 1, "h": 1, "w": 1}, {"n": 2, "c": 2, "h": 4, "w": 5}],
)


# -- host ops ------------------------------------------------------------------------------------------
class _Fallback:
    """Stands in for the importer's side-table entry: ``call(operands)`` runs torch."""

    def __init__(self, fn):
        self.fn = fn

    def call(self, operands):
        return self.fn(*operands)


FALLBACKS = {"softplus": _Fallback(F.softplus), "outer": _Fallback(torch.outer)}

case(
    "host_call",
    [("x", "f32", AB)],
    lambda g, x: g.add("host_call", [x], {"call": "softplus", "target": "aten.softplus", "dtype": "f32", "shape": ("a", "b")}),
    lambda x: torch.log1p(x.double().exp()).float(),
    lambda S: T("f32", S.a, S.b),
    ENVS2,
)
case(
    "host_call",
    [("x", "f64", ("a",)), ("y", "f64", ("b",))],
    lambda g, x, y: g.add("host_call", [x, y], {"call": "outer", "dtype": "f64", "shape": ("a", "b")}),
    lambda x, y: x[:, None] * y[None, :],
    lambda S: T("f64", S.a, S.b),
    [{"a": 2, "b": 3}],
)
for _dt in ("i64", "f32"):
    case(
        "index_to_tensor",
        [("x", "f32", AB)],
        lambda g, x, dt=_dt: g.add("index_to_tensor", [g.add("imul", [dim(g, x, 0), dim(g, x, 1)])], {"dtype": dt}),
        lambda x, dt=_dt: torch.tensor(x.numel(), dtype=DTYPES[dt]),
        lambda S, dt=_dt: T(dt),
        ENVS2,
    )


# -- the tests -------------------------------------------------------------------------------------
def test_every_op_is_covered():
    missing = sorted(set(OPS) - set(CASES))
    assert not missing, f"ops without a reference test case: {missing}"
    unknown = sorted(set(CASES) - set(OPS))
    assert not unknown, f"test cases for unregistered ops: {unknown}"


@pytest.mark.parametrize("op", sorted(CASES))
def test_every_op_runs_at_three_or_more_shapes(op):
    runs = sum(len(c.envs) for c in CASES[op])
    assert runs >= 3, f"{op} is run at only {runs} shape(s)"


@pytest.mark.parametrize("op", sorted(CASES))
def test_reference_matches_torch(op):
    seed = zlib.crc32(op.encode())
    for i, c in enumerate(CASES[op]):
        run_case(op, c, seed + 1000 * i)


# Logical ops on non-bool operands: torch returns bool.
@pytest.mark.parametrize("op", ["logical_not", "logical_and", "logical_or", "logical_xor"])
def test_logical_ops_on_float_return_bool(op):
    g = Graph()
    xs = [g.add_input(f"x{i}", T("f32", 3)) for i in range(1 if op == "logical_not" else 2)]
    assert g.add(op, xs).type.dtype == "i1"


# -- the table is sharp: a wrong reference or a wrong shape rule makes it fail ------------------------
def _perturb(v):
    if isinstance(v, int):
        return v + 1
    if v.dtype == torch.bool:
        return ~v
    if v.is_floating_point():
        return v + 0.01 * (1 + v.abs())
    return v + 1


def _off_by_one(result):
    if isinstance(result, tuple):
        return result[:-1] + (as_expr(result[-1]) + 1,) if result else (1,)
    return as_expr(result) + 1


SOUND_OPS = sorted(CASES)


def _table_fails(op: str) -> bool:
    try:
        for i, c in enumerate(CASES[op]):
            run_case(op, c, zlib.crc32(op.encode()) + 1000 * i)
    except Exception:  # noqa: BLE001 - a wrong value, a wrong type, or a rule that now rejects the case
        return True
    return False


@pytest.mark.parametrize("op", SOUND_OPS)
def test_table_detects_wrong_reference(op, monkeypatch):
    spec = get_spec(op)
    bad = dataclasses.replace(spec, reference=lambda *a, **k: _perturb(spec.reference(*a, **k)))
    monkeypatch.setitem(OPS, op, bad)
    assert _table_fails(op), f"the {op} cases pass with a broken op"


@pytest.mark.parametrize("op", SOUND_OPS)
def test_table_detects_wrong_shape_rule(op, monkeypatch):
    spec = get_spec(op)
    bad = dataclasses.replace(spec, shape_rule=lambda ctx, types, attrs: _off_by_one(spec.shape_rule(ctx, types, attrs)))
    monkeypatch.setitem(OPS, op, bad)
    assert _table_fails(op), f"the {op} cases pass with a broken op"
