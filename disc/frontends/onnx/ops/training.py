"""The optimizers of ONNX's ``ai.onnx.preview.training`` domain: one update step of Adagrad,
Momentum (standard or Nesterov) and Adam, for any number of tensors at once.

Inputs are R (learning rate), T (update count), then the tensors grouped by kind (all X, then all
G, then each state); outputs are the new X, then each new state, grouped the same way. Every
update is elementwise, computed in float64 (the reference's scalars are Python floats) and
rounded once to each tensor's dtype.
"""

from __future__ import annotations

from typing import Any

from disc.frontends.onnx.importer import OnnxImporter
from disc.frontends.onnx.ops import onnx_op
from disc.ir.builder import LoweringError, arithmetic, convert, elementwise, select
from disc.ir.graph import Node


def _groups(imp: OnnxImporter, node: Any, tensors: tuple[Any, ...], kinds: int) -> list[list[Node]]:
    """``tensors`` split into ``kinds`` equal groups (X, G, then the states), each as f64 nodes."""
    if not tensors or len(tensors) % kinds:
        raise LoweringError(f"{node.op_type}: {len(tensors)} tensor inputs after R and T; expected a multiple of {kinds} (X, G and the states, grouped by kind)")
    n = len(tensors) // kinds
    nodes = [imp.tensor(t) for t in tensors]
    return [[convert(imp, x, "f64") for x in nodes[k * n : (k + 1) * n]] for k in range(kinds)] + [nodes[:n]]


def _scalar_f64(imp: OnnxImporter, v: Any) -> Node:
    return convert(imp, imp.tensor(v), "f64")


@onnx_op("Adagrad")
def _adagrad(imp: OnnxImporter, node: Any, r: Any, t: Any, *tensors: Any, decay_factor: float = 0.0, epsilon: float = 1e-6, norm_coefficient: float = 0.0) -> list[Node]:
    xs, gs, hs, originals = _groups(imp, node, tensors, 3)
    op = arithmetic(imp, "f64")
    rate = op("div", _scalar_f64(imp, r), op("add", 1.0, op("mul", _scalar_f64(imp, t), float(decay_factor))))
    new_x, new_h = [], []
    for x, g, h, orig in zip(xs, gs, hs, originals):
        reg = op("add", op("mul", float(norm_coefficient), x), g)
        h2 = op("add", h, op("mul", reg, reg))
        step = op("div", op("mul", rate, reg), op("add", imp.graph.add("sqrt", (h2,)), float(epsilon)))
        new_x.append(convert(imp, op("sub", x, step), orig.dtype))
        new_h.append(convert(imp, h2, orig.dtype))
    return new_x + new_h


@onnx_op("Momentum")
def _momentum(imp: OnnxImporter, node: Any, r: Any, t: Any, *tensors: Any, alpha: float, beta: float, mode: str, norm_coefficient: float) -> list[Node]:
    if mode not in ("standard", "nesterov"):
        raise LoweringError(f"Momentum: mode {mode!r}; ONNX takes 'standard' or 'nesterov'")
    xs, gs, vs, originals = _groups(imp, node, tensors, 3)
    op = arithmetic(imp, "f64")
    rate = _scalar_f64(imp, r)
    first = elementwise(imp, "le", [imp.tensor(t), 0], imp.tensor(t).dtype)
    beta_now = select(imp, first, 1.0, float(beta), "f64")  # the first step takes the whole gradient
    new_x, new_v = [], []
    for x, g, v, orig in zip(xs, gs, vs, originals):
        reg = op("add", op("mul", float(norm_coefficient), x), g)
        v2 = op("add", op("mul", float(alpha), v), op("mul", beta_now, reg))
        direction = v2 if mode == "standard" else op("add", reg, op("mul", float(alpha), v2))
        new_x.append(convert(imp, op("sub", x, op("mul", rate, direction)), orig.dtype))
        new_v.append(convert(imp, v2, orig.dtype))
    return new_x + new_v


@onnx_op("Adam")
def _adam(
    imp: OnnxImporter, node: Any, r: Any, t: Any, *tensors: Any, alpha: float = 0.9, beta: float = 0.999, epsilon: float = 1e-6, norm_coefficient: float = 0.0, norm_coefficient_post: float = 0.0
) -> list[Node]:
    xs, gs, vs, hs, originals = _groups(imp, node, tensors, 4)
    op = arithmetic(imp, "f64")
    steps = _scalar_f64(imp, t)
    corrected = op("div", op("mul", _scalar_f64(imp, r), imp.graph.add("sqrt", (op("sub", 1.0, op("pow", float(beta), steps)),))), op("sub", 1.0, op("pow", float(alpha), steps)))
    rate = select(imp, elementwise(imp, "gt", [imp.tensor(t), 0], imp.tensor(t).dtype), corrected, _scalar_f64(imp, r), "f64")  # bias-corrected after the first step
    new_x, new_v, new_h = [], [], []
    for x, g, v, h, orig in zip(xs, gs, vs, hs, originals):
        reg = op("add", op("mul", float(norm_coefficient), x), g)
        v2 = op("add", op("mul", float(alpha), v), op("mul", 1.0 - float(alpha), reg))
        h2 = op("add", op("mul", float(beta), h), op("mul", 1.0 - float(beta), op("mul", reg, reg)))
        stepped = op("sub", x, op("mul", rate, op("div", v2, op("add", imp.graph.add("sqrt", (h2,)), float(epsilon)))))
        new_x.append(convert(imp, op("mul", 1.0 - float(norm_coefficient_post), stepped), orig.dtype))
        new_v.append(convert(imp, v2, orig.dtype))
        new_h.append(convert(imp, h2, orig.dtype))
    return new_x + new_v + new_h
