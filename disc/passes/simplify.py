"""Algebraic simplification: a table of exact rewrite rules.

Each rule is ``(op name, fn(node, graph) -> replacement | None)``. ``node`` is
the node as rebuilt (its operands already simplified, its type re-inferred),
``graph`` the graph being built (for constant payloads). A replacement is an
existing value, a ``New`` node to create, or a tensor that becomes a constant.

Rules are exact identities: the result is bit-for-bit what the original
computes, for every input, infinities and signed zeros included; a NaN stays a
NaN (IEEE 754 leaves the sign and payload of a NaN result unspecified, so those
are not preserved: ``x - neg(y)`` and ``x + y`` may differ in a NaN's sign). Hence
``x + 0.0 -> x`` is *not* a rule for floats (``-0.0 + 0.0`` is ``+0.0``) but
``x + (-0.0) -> x`` is, and ``x * 0`` is never folded. The driver also refuses
any replacement whose type is not identical to the node's (no silent
broadcasting or promotion).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from disc.ir.graph import Graph, Node
from disc.ir.payloads import is_numpy, is_scalar_payload, scalar, splat_value
from disc.ir.registry import ELEMENTWISE, get_spec
from disc.ir.types import FLOAT_DTYPES, IndexType, TensorType
from disc.passes.rewrite import New, Replacement, Rewriter, graph_pass

Rule = Callable[[Node, Graph], Replacement | None]

# Ops that only move or replicate elements: a splat stays a splat through them.
_SPLAT_PRESERVING = ("broadcast_in_dim", "reshape", "transpose")
_MAX_STEPS = 8  # rewrites applied to one node (a New replacement is simplified again)


# -- matching helpers ------------------------------------------------------------------
def _payload(n: Node, g: Graph) -> Any:
    """The tensor of a ``constant`` node, or None."""
    if n.op != "constant":
        return None
    ref = n.attrs.get("ref")
    if ref is not None:
        return g.constants.get(ref)
    if n.attrs.get("value") is None:
        return None
    return scalar(n.attrs["value"], n.attrs["dtype"])


def splat(n: Node, g: Graph) -> Any:
    """The single value every element of ``n`` has (a Python scalar), or None.

    Sees through broadcasts, reshapes and transposes of constants. Elements
    must be identical, sign of zero included; NaN never counts as a splat.
    """
    while n.op in _SPLAT_PRESERVING:
        n = n.inputs[0]
    t = _payload(n, g)
    return None if t is None else splat_value(t)


def _is_float(n: Node) -> bool:
    return isinstance(n.type, TensorType) and n.dtype in FLOAT_DTYPES


def _is_value(n: Node, g: Graph, v: int) -> bool:
    s = splat(n, g)
    return s is not None and not (isinstance(s, float) and math.isnan(s)) and s == v


def _is_neg_zero(n: Node, g: Graph) -> bool:
    s = splat(n, g)
    return isinstance(s, float) and s == 0 and math.copysign(1.0, s) < 0


def _is_int_zero(n: Node, g: Graph) -> bool:
    return not _is_float(n) and _is_value(n, g, 0)


def _is_pos_zero(n: Node, g: Graph) -> bool:
    s = splat(n, g)
    return s is not None and s == 0 and not _is_neg_zero(n, g)


def _scalar_constant(n: Node, g: Graph) -> Any:
    if n.op != "constant" or not isinstance(n.type, TensorType) or n.type.rank != 0:
        return None
    return _payload(n, g)


# -- rules -------------------------------------------------------------------------------
def _mul_one(n: Node, g: Graph) -> Replacement | None:
    x, y = n.inputs
    if _is_value(y, g, 1):
        return x
    if _is_value(x, g, 1):
        return y
    return None


def _add_zero(n: Node, g: Graph) -> Replacement | None:
    x, y = n.inputs
    for keep, zero in ((x, y), (y, x)):
        if _is_int_zero(zero, g) or _is_neg_zero(zero, g):
            return keep
    return None


def _sub_zero(n: Node, g: Graph) -> Replacement | None:
    x, y = n.inputs
    return x if _is_int_zero(y, g) or (_is_float(y) and _is_pos_zero(y, g)) else None


def _div_one(n: Node, g: Graph) -> Replacement | None:
    x, y = n.inputs
    return x if _is_value(y, g, 1) else None


def _floor_div_one(n: Node, g: Graph) -> Replacement | None:
    x, y = n.inputs
    return x if not _is_float(x) and _is_value(y, g, 1) else None


def _pow_one(n: Node, g: Graph) -> Replacement | None:
    x, y = n.inputs
    return x if _is_value(y, g, 1) else None


def _involution(n: Node, g: Graph) -> Replacement | None:
    x = n.inputs[0]
    return x.inputs[0] if x.op == n.op else None


def _involution_bool(n: Node, g: Graph) -> Replacement | None:
    x = n.inputs[0]
    return x.inputs[0] if x.op == n.op and n.dtype == "i1" else None


def _idempotent(n: Node, g: Graph) -> Replacement | None:
    x = n.inputs[0]
    return x if x.op == n.op else None


def _abs_neg(n: Node, g: Graph) -> Replacement | None:
    x = n.inputs[0]
    return New("abs", (x.inputs[0],)) if x.op == "neg" else None


def _rounding_of_int(n: Node, g: Graph) -> Replacement | None:
    x = n.inputs[0]
    return x if not _is_float(x) else None


def _same_operands(n: Node, g: Graph) -> Replacement | None:
    x, y = n.inputs
    return x if x is y else None


def _same_operands_bool(n: Node, g: Graph) -> Replacement | None:
    x, y = n.inputs
    return x if x is y and x.dtype == "i1" else None


def _select_same(n: Node, g: Graph) -> Replacement | None:
    _, a, b = n.inputs
    return a if a is b else None


def _select_const(n: Node, g: Graph) -> Replacement | None:
    p, a, b = n.inputs
    s = splat(p, g)
    if s is None:
        return None
    return a if bool(s) else b


def _sub_neg(n: Node, g: Graph) -> Replacement | None:
    x, y = n.inputs
    return New("add", (x, y.inputs[0])) if y.op == "neg" else None


def _add_neg(n: Node, g: Graph) -> Replacement | None:
    x, y = n.inputs
    return New("sub", (x, y.inputs[0])) if y.op == "neg" else None


# Scalar folding where the constants are numpy arrays (a frontend without torch): the ops whose
# numpy result is bit for bit the reference's, IEEE-exact float arithmetic (one rounding, numpy
# and torch alike) and integer arithmetic that wraps alike. Transcendentals (exp, tanh...) differ
# in the last place between math libraries, and max/min order signed zeros differently (numpy's
# maximum(0.0, -0.0) is -0.0, torch's 0.0), so those are left for the program to compute.
_NUMPY_EXACT: dict[str, Callable[..., Any]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "neg": np.negative, "abs": np.abs,
    "sqrt": np.sqrt, "floor": np.floor, "ceil": np.ceil,
    "round": np.round, "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
    "logical_xor": np.logical_xor, "logical_not": np.logical_not, "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor, "bitwise_not": np.invert,
    "isnan": np.isnan, "isinf": np.isinf,
}  # fmt: skip


def _fold_numpy(n: Node, values: list[Any]) -> Any:
    fn = _NUMPY_EXACT.get(n.op)
    if n.op == "div" and all(np.issubdtype(v.dtype, np.floating) for v in values):
        fn = np.true_divide  # integer division (truncating, by zero an error) is left to the program
    if fn is None or any(v.dtype.name == "bfloat16" for v in values):
        return None
    if values[0].dtype == np.bool_ and not n.op.startswith(("logical_", "bitwise_", "eq", "ne", "lt", "le", "gt", "ge")):
        return None  # arithmetic on i1 (torch refuses abs of a bool, numpy computes it)
    try:
        with np.errstate(all="ignore"):  # inf, NaN and wraparound are the values, as in the program
            out = np.asarray(fn(*values))
    except TypeError:  # an op numpy does not define on this dtype (bool subtraction)
        return None
    return out if out.dtype == values[0].dtype or out.dtype == np.bool_ else None


def fold_scalar_constants(n: Node, g: Graph) -> Replacement | None:
    """Evaluate an elementwise op whose operands are all scalar constants, with its reference."""
    if get_spec(n.op).category != ELEMENTWISE or not n.inputs:
        return None
    values = [_scalar_constant(i, g) for i in n.inputs]
    if any(v is None for v in values):
        return None
    if all(isinstance(v, np.ndarray) for v in values):
        return _fold_numpy(n, values)
    try:
        out = get_spec(n.op).reference(*values, **n.attrs)
    except (RuntimeError, TypeError, ValueError, ZeroDivisionError):
        return None  # e.g. integer division by zero: left for run time to report
    except ImportError:
        return None  # the references run on PyTorch, not installed here: left for the program to compute
    return out if is_scalar_payload(out) else None


def narrow_constant(n: Node, g: Graph) -> Replacement | None:
    """A stored float constant (a weight) narrowed to a 16-bit float, once, when compiling: under
    ``torch.autocast`` a float32 model's weights reach every GEMM through a ``convert``, which
    the program would otherwise run over all of them at every call. The op's reference rounds
    as the program does (to nearest even), so the constant is the bits the program computed."""
    src = n.inputs[0]
    if src.op != "constant" or src.attrs.get("ref") is None or n.attrs.get("dtype") not in ("bf16", "f16"):
        return None
    if not isinstance(src.type, TensorType) or src.type.dtype != "f32":
        return None  # (from f64, a kernel may round twice, through f32)
    value = g.constants.get(src.attrs["ref"])
    if value is None:
        return None
    if is_numpy(value):  # (numpy's own float16 rounds to nearest even; its bfloat16 is not numpy's)
        return value.astype(np.float16) if n.attrs["dtype"] == "f16" else None
    try:
        return get_spec("convert").reference(value, dtype=n.attrs["dtype"])
    except ImportError:
        return None


# The table, read top to bottom; "*" applies to every elementwise op.
RULES: list[tuple[str, Rule]] = [
    ("mul", _mul_one),  # x * 1 -> x, 1 * x -> x
    ("add", _add_zero),  # x + 0 -> x for ints; floats only for -0.0 (-0.0 + 0.0 is +0.0)
    ("sub", _sub_zero),  # x - 0 -> x (ints; floats with +0.0)
    ("div", _div_one),  # x / 1 -> x
    ("floor_div", _floor_div_one),  # x // 1 -> x (ints only: floor(2.5 / 1) != 2.5)
    ("pow", _pow_one),  # x ** 1 -> x
    ("neg", _involution),  # neg(neg(x)) -> x
    ("bitwise_not", _involution),  # ~~x -> x
    ("logical_not", _involution_bool),  # not(not(x)) -> x (i1 only)
    ("abs", _idempotent),  # abs(abs(x)) -> abs(x)
    ("abs", _abs_neg),  # abs(neg(x)) -> abs(x)
    ("relu", _idempotent),  # relu(relu(x)) -> relu(x)
    ("floor", _idempotent),  # floor(floor(x)) -> floor(x)
    ("ceil", _idempotent),  # ceil(ceil(x)) -> ceil(x)
    ("round", _idempotent),  # round(round(x)) -> round(x)
    ("floor", _rounding_of_int),  # floor(x) -> x for integer x
    ("ceil", _rounding_of_int),  # ceil(x) -> x for integer x
    ("round", _rounding_of_int),  # round(x) -> x for integer x
    ("maximum", _same_operands),  # max(x, x) -> x
    ("minimum", _same_operands),  # min(x, x) -> x
    ("bitwise_and", _same_operands),  # x & x -> x
    ("bitwise_or", _same_operands),  # x | x -> x
    ("logical_and", _same_operands_bool),  # x and x -> x (i1 only)
    ("logical_or", _same_operands_bool),  # x or x -> x (i1 only)
    ("select", _select_same),  # select(p, x, x) -> x
    ("select", _select_const),  # select(true, x, y) -> x, select(false, x, y) -> y
    ("sub", _sub_neg),  # x - neg(y) -> x + y
    ("add", _add_neg),  # x + neg(y) -> x - y
    ("convert", narrow_constant),  # convert(weight, bf16/f16) -> a 16-bit weight, once (autocast)
    ("*", fold_scalar_constants),  # op(c1, c2) -> c for scalar constants (the op's reference semantics)
]


def _rules_for(op: str) -> list[Rule]:
    out = [fn for name, fn in RULES if name == op]
    if get_spec(op).category == ELEMENTWISE:
        out += [fn for name, fn in RULES if name == "*"]
    return out


def _simplify_node(rw: Rewriter, cand: Node, steps: int = 0) -> Node:
    if isinstance(cand.type, IndexType) or steps >= _MAX_STEPS:
        return rw.commit(cand)
    for fn in _rules_for(cand.op):
        rep = fn(cand, rw.dst)
        if rep is None:
            continue
        if isinstance(rep, New):
            nxt = rw.candidate(None, rep.op, rep.inputs, rep.attrs, name=cand.name)
            if nxt.type == cand.type:
                return _simplify_node(rw, nxt, steps + 1)
            continue
        node = rw.materialize(rep, expected=cand.type, name=cand.name)
        if node is not None:
            return node
    return rw.commit(cand)


@graph_pass("simplify")
def simplify(graph: Graph) -> Graph:
    """Apply the exact algebraic identities of RULES, in one sweep over the graph."""
    rw = Rewriter(graph)
    for n in graph.nodes:
        if n.op == "input":
            rw.keep_input(n)
            continue
        rw.map(n, _simplify_node(rw, rw.candidate(n)))
    return rw.finish()
