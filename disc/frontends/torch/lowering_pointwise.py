"""Lowering table, part 5: activations and pointwise math PyTorch has as single ops.

``torch.export`` keeps ops such as ``hardswish``, ``elu`` or ``lerp`` whole. Without a
lowering, a program holding one either went through torch's decomposition re-trace
(doubling its capture time) or, for the core ATen ones the re-trace leaves as they are
(``leaky_relu``, ``hardtanh``, ``elu``), ran that op in PyTorch between compiled segments.
Each is written here with disc's elementwise ops, in the form PyTorch's CPU kernels use,
so it fuses with its neighbours like any other elementwise op.
"""

from __future__ import annotations

from typing import Any

from disc.frontends.torch.importer import Importer
from disc.frontends.torch.lowering import _clamp, _where, aten, lower, meta_dtype
from disc.ir.builder import elementwise
from disc.ir.graph import Node
from disc.ir.types import FLOAT_DTYPES


def _op(ctx: Importer, fx_node, op: str, *operands: Any) -> Node:
    """An elementwise op computed in the FX node's result dtype."""
    return elementwise(ctx, op, list(operands), meta_dtype(fx_node))


@lower(aten.hardtanh.default)
def _hardtanh(ctx: Importer, fx_node, x: Node, lo: float = -1.0, hi: float = 1.0) -> Node:
    return _clamp(ctx, fx_node, x, lo, hi)


@lower(aten.relu6.default)
def _relu6(ctx: Importer, fx_node, x: Node) -> Node:
    return _clamp(ctx, fx_node, x, 0.0, 6.0)


def _relu6_of_x_plus_3(ctx: Importer, fx_node, x: Node) -> Node:
    return _clamp(ctx, fx_node, _op(ctx, fx_node, "add", x, 3.0), 0.0, 6.0)


@lower(aten.hardsigmoid.default)
def _hardsigmoid(ctx: Importer, fx_node, x: Node) -> Node:
    return _op(ctx, fx_node, "div", _relu6_of_x_plus_3(ctx, fx_node, x), 6.0)


@lower(aten.hardswish.default)
def _hardswish(ctx: Importer, fx_node, x: Node) -> Node:
    return _op(ctx, fx_node, "div", _op(ctx, fx_node, "mul", x, _relu6_of_x_plus_3(ctx, fx_node, x)), 6.0)


@lower(aten.leaky_relu.default)
def _leaky_relu(ctx: Importer, fx_node, x: Node, slope: float = 0.01) -> Node:
    return _where(ctx, fx_node, _op(ctx, fx_node, "gt", x, 0.0), x, _op(ctx, fx_node, "mul", x, float(slope)))


def _elu_form(ctx: Importer, fx_node, x: Node, alpha: float, scale: float, input_scale: float) -> Node:
    """x * scale where x > 0, else alpha * scale * (exp(x * input_scale) - 1): ELU, SELU and CELU."""
    negative = _op(ctx, fx_node, "mul", ctx.graph.add("expm1", (_op(ctx, fx_node, "mul", x, float(input_scale)),)), float(alpha) * float(scale))
    positive = x if scale == 1 else _op(ctx, fx_node, "mul", x, float(scale))
    return _where(ctx, fx_node, _op(ctx, fx_node, "gt", x, 0.0), positive, negative)


@lower(aten.elu.default)
def _elu(ctx: Importer, fx_node, x: Node, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Node:
    return _elu_form(ctx, fx_node, x, alpha, scale, input_scale)


@lower(aten.selu.default)
def _selu(ctx: Importer, fx_node, x: Node) -> Node:
    return _elu_form(ctx, fx_node, x, 1.6732632423543772848170429916717, 1.0507009873554804934193349852946, 1.0)


@lower(aten.celu.default)
def _celu(ctx: Importer, fx_node, x: Node, alpha: float = 1.0) -> Node:
    return _elu_form(ctx, fx_node, x, alpha, 1.0, 1.0 / float(alpha))


def _log1p_exp(ctx: Importer, fx_node, x: Node) -> Node:
    return ctx.graph.add("log1p", (ctx.graph.add("exp", (x,)),))


@lower(aten.softplus.default)
def _softplus(ctx: Importer, fx_node, x: Node, beta: float = 1.0, threshold: float = 20.0) -> Node:
    scaled = x if beta == 1 else _op(ctx, fx_node, "mul", x, float(beta))
    soft = _log1p_exp(ctx, fx_node, scaled)
    if beta != 1:
        soft = _op(ctx, fx_node, "div", soft, float(beta))
    return _where(ctx, fx_node, _op(ctx, fx_node, "gt", scaled, float(threshold)), x, soft)


@lower(aten.mish.default)
def _mish(ctx: Importer, fx_node, x: Node) -> Node:
    return _op(ctx, fx_node, "mul", x, ctx.graph.add("tanh", (_log1p_exp(ctx, fx_node, x),)))


@lower(aten.log_sigmoid_forward.default)
def _log_sigmoid_forward(ctx: Importer, fx_node, x: Node) -> list[Any]:
    return [_log_sigmoid(ctx, fx_node, x), None]  # the buffer is only for the backward


@lower(aten.log_sigmoid.default)
def _log_sigmoid(ctx: Importer, fx_node, x: Node) -> Node:
    """min(x, 0) - log1p(exp(-|x|)): no overflow at either end."""
    tail = _log1p_exp(ctx, fx_node, ctx.graph.add("neg", (ctx.graph.add("abs", (x,)),)))
    return _op(ctx, fx_node, "sub", _op(ctx, fx_node, "minimum", x, 0.0), tail)


@lower(aten.square.default)
def _square(ctx: Importer, fx_node, x: Node) -> Node:
    return _op(ctx, fx_node, "mul", x, x)


@lower(aten.exp2.default)
def _exp2(ctx: Importer, fx_node, x: Node) -> Node:
    return _op(ctx, fx_node, "pow", 2.0, x)


@lower(aten.trunc.default)
def _trunc(ctx: Importer, fx_node, x: Node) -> Node:
    if x.dtype not in FLOAT_DTYPES:
        return x
    return _where(ctx, fx_node, _op(ctx, fx_node, "lt", x, 0.0), ctx.graph.add("ceil", (x,)), ctx.graph.add("floor", (x,)))


@lower(aten.frac.default)
def _frac(ctx: Importer, fx_node, x: Node) -> Node:
    return _op(ctx, fx_node, "sub", x, _trunc(ctx, fx_node, x))


@lower(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(ctx: Importer, fx_node, a: Node, b: Node, weight: Any) -> Node:
    """PyTorch's two-sided form: a + w * (b - a) for |w| < 0.5, else b - (b - a) * (1 - w)."""
    diff = _op(ctx, fx_node, "sub", b, a)
    low = _op(ctx, fx_node, "add", a, _op(ctx, fx_node, "mul", weight, diff))
    high = _op(ctx, fx_node, "sub", b, _op(ctx, fx_node, "mul", diff, _op(ctx, fx_node, "sub", 1.0, weight)))
    if not isinstance(weight, Node):
        return low if abs(weight) < 0.5 else high
    small = _op(ctx, fx_node, "lt", ctx.graph.add("abs", (weight,)), 0.5)
    return _where(ctx, fx_node, small, low, high)


@lower(aten.addcmul.default, aten.addcdiv.default)
def _addc(ctx: Importer, fx_node, x: Node, t1: Node, t2: Node, value: Any = 1) -> Node:
    op = "mul" if fx_node.target is aten.addcmul.default else "div"
    term = _op(ctx, fx_node, op, t1, t2)
    if value != 1:
        term = _op(ctx, fx_node, "mul", term, value)
    return _op(ctx, fx_node, "add", x, term)

