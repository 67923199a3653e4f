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
from disc.ir.builder import LoweringError, convert, elementwise, select
from disc.ir.graph import Node


def _groups(imp: OnnxImporter, node: Any, tensors: tuple[Any, ...], kinds: int) -> list[list[Node]]:
    """``tensors`` split into ``kinds`` equal groups (X, G, then the states), each as f64 nodes."""
    if not tensors or len(tensors) % kinds:
        raise LoweringError(f"{node.op_type}: {len(tensors)} tensor inputs after R and T; expected a multiple of {kinds} (X, G and the states, grouped by kind)")
    n = len(tensors) // kinds
    nodes = [imp.tensor(t) for t in tensors]
    return [[convert(imp, x, "f64") for x in nodes[k * n : (k + 1) * n]] for k in range(kinds)] + [nodes[:n]]


def _op(imp: OnnxImporter, op: str, *xs: Any) -> Node:
    return elementwise(imp, op, list(xs), "f64")


def _scalar_f64(imp: OnnxImporter, v: Any) -> Node:
    return convert(imp, imp.tensor(v), "f64")


@onnx_op("Adagrad")
def _adagrad(imp: OnnxImporter, node: Any, r: Any, t: Any, *tensors: Any, decay_factor: float = 0.0, epsilon: float = 1e-6, norm_coefficient: float = 0.0) -> list[Node]:
    xs, gs, hs, originals = _groups(imp, node, tensors, 3)
    rate = _op(imp, "div", _scalar_f64(imp, r), _op(imp, "add", 1.0, _op(imp, "mul", _scalar_f64(imp, t), float(decay_factor))))
    new_x, new_h = [], []
    for x, g, h, orig in zip(xs, gs, hs, originals):
        reg = _op(imp, "add", _op(imp, "mul", float(norm_coefficient), x), g)
        h2 = _op(imp, "add", h, _op(imp, "mul", reg, reg))
        step = _op(imp, "div", _op(imp, "mul", rate, reg), _op(imp, "add", imp.graph.add("sqrt", (h2,)), float(epsilon)))
        new_x.append(convert(imp, _op(imp, "sub", x, step), orig.dtype))
        new_h.append(convert(imp, h2, orig.dtype))
    return new_x + new_h


@onnx_op("Momentum")
def _momentum(imp: OnnxImporter, node: Any, r: Any, t: Any, *tensors: Any, alpha: float, beta: float, mode: str, norm_coefficient: float) -> list[Node]:
    if mode not in ("standard", "nesterov"):
        raise LoweringError(f"Momentum: mode {mode!r}; ONNX takes 'standard' or 'nesterov'")
    xs, gs, vs, originals = _groups(imp, node, tensors, 3)
    rate = _scalar_f64(imp, r)
    first = elementwise(imp, "le", [imp.tensor(t), 0], imp.tensor(t).dtype)
    beta_now = select(imp, first, 1.0, float(beta), "f64")  # the first step takes the whole gradient
    new_x, new_v = [], []
    for x, g, v, orig in zip(xs, gs, vs, originals):
        reg = _op(imp, "add", _op(imp, "mul", float(norm_coefficient), x), g)
        v2 = _op(imp, "add", _op(imp, "mul", float(alpha), v), _op(imp, "mul", beta_now, reg))
        direction = v2 if mode == "standard" else _op(imp, "add", reg, _op(imp, "mul", float(alpha), v2))
        new_x.append(convert(imp, _op(imp, "sub", x, _op(imp, "mul", rate, direction)), orig.dtype))
        new_v.append(convert(imp, v2, orig.dtype))
    return new_x + new_v


@onnx_op("Adam")
def _adam(
    imp: OnnxImporter, node: Any, r: Any, t: Any, *tensors: Any, alpha: float = 0.9, beta: float = 0.999, epsilon: float = 1e-6, norm_coefficient: float = 0.0, norm_coefficient_post: float = 0.0
) -> list[Node]:
    xs, gs, vs, hs, originals = _groups(imp, node, tensors, 4)
    steps = _scalar_f64(imp, t)
    corrected = _op(imp, "div", _op(imp, "mul", _scalar_f64(imp, r), imp.graph.add("sqrt", (_op(imp, "sub", 1.0, _op(imp, "pow", float(beta), steps)),))), _op(imp, "sub", 1.0, _op(imp, "pow", float(alpha), steps)))
    rate = select(imp, elementwise(imp, "gt", [imp.tensor(t), 0], imp.tensor(t).dtype), corrected, _scalar_f64(imp, r), "f64")  # bias-corrected after the first step
    new_x, new_v, new_h = [], [], []
    for x, g, v, h, orig in zip(xs, gs, vs, hs, originals):
        reg = _op(imp, "add", _op(imp, "mul", float(norm_coefficient), x), g)
        v2 = _op(imp, "add", _op(imp, "mul", float(alpha), v), _op(imp, "mul", 1.0 - float(alpha), reg))
        h2 = _op(imp, "add", _op(imp, "mul", float(beta), h), _op(imp, "mul", 1.0 - float(beta), _op(imp, "mul", reg, reg)))
        stepped = _op(imp, "sub", x, _op(imp, "mul", rate, _op(imp, "div", v2, _op(imp, "add", imp.graph.add("sqrt", (h2,)), float(epsilon)))))
        new_x.append(convert(imp, _op(imp, "mul", 1.0 - float(norm_coefficient_post), stepped), orig.dtype))
        new_v.append(convert(imp, v2, orig.dtype))
        new_h.append(convert(imp, h2, orig.dtype))
    return new_x + new_v + new_h
