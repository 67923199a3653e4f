"""An ONNX ``ModelProto`` as disc IR: symbolic dims from ``dim_param``, shape subgraphs as shape values.

Inputs: a ``dim_param`` names a symbol (the same name in two places is one symbol, a
constraint), a ``dim_value`` is a static dim, an unnamed unknown dim gets a fresh symbol;
``dynamic={"input": {axis: "name"}}`` names or replaces dims, an int pins one.
Initializers and ``Constant`` nodes stay numpy arrays while only attribute-like operands read
them (a ``Reshape``'s shape, ``Unsqueeze``'s axes) and become graph constants where an op
computes with them. ``Shape`` gives a *shape value*, the list of the tensor's symbolic dims,
and the integer ops over it (``Gather``, ``Slice``, ``Concat``, ``Unsqueeze``, arithmetic)
compute on those dims at compile time: the shape computation becomes the IR's index ops,
never a per-call evaluation. Each op's lowering is in ``ops.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disc.frontends.arrays import ArrayBuilder, DimValue, ShapeValue
from disc.ir.builder import LoweringError
from disc.ir.types import TensorType
from disc.shape.expr import DimLike, SymExpr

__all__ = ["ELEM_TYPES", "DimValue", "OnnxImporter", "ShapeValue", "add_inputs"]

# ONNX TensorProto element types disc runs.
ELEM_TYPES = {1: "f32", 2: "u8", 3: "i8", 5: "i16", 6: "i32", 7: "i64", 9: "i1", 10: "f16", 11: "f64", 16: "bf16"}


class OnnxImporter(ArrayBuilder):
    """One model's import: values by ONNX name (a Node, a numpy constant or a ShapeValue)."""

    def __init__(self, name: str, opset: int) -> None:
        super().__init__(name)
        self.opset = opset
        self.values: dict[str, Any] = {}


def _dims(value_info: Any) -> list[Any]:
    return [d for d in value_info.type.tensor_type.shape.dim]


def add_inputs(imp: OnnxImporter, graph: Any, initializers: set[str], dynamic: Mapping[str, Mapping[int, str | int]]) -> list[str]:
    """Declare the graph's inputs (initializers excepted); returns their names in order."""
    c = imp.graph.constraints
    symbols: dict[str, SymExpr] = {}
    names = []
    unknown = sorted(set(dynamic) - {i.name for i in graph.input})
    if unknown:
        raise LoweringError(f"dynamic names input(s) {unknown}; the model's inputs are {[i.name for i in graph.input if i.name not in initializers]}")
    for vi in graph.input:
        if vi.name in initializers:
            continue
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or tt.elem_type not in ELEM_TYPES:
            raise LoweringError(f"input {vi.name!r}: element type {tt.elem_type} is not one disc runs ({sorted(ELEM_TYPES.values())})")
        if not tt.HasField("shape"):
            raise LoweringError(f"input {vi.name!r} has no rank in the model; give it a shape")
        shape: list[DimLike] = []
        override = dynamic.get(vi.name, {})
        dims = _dims(vi)
        for axis in override:
            if not isinstance(axis, int) or not 0 <= axis < len(dims):
                raise LoweringError(f"dynamic[{vi.name!r}] names axis {axis!r}; the input has rank {len(dims)}")
        for axis, d in enumerate(dims):
            want = override.get(axis)
            if isinstance(want, int) and not isinstance(want, bool):
                shape.append(want)
                continue
            name = want if isinstance(want, str) else (d.dim_param if d.HasField("dim_param") and d.dim_param else None)
            if want is None and d.HasField("dim_value"):
                shape.append(int(d.dim_value))
                continue
            if name is None:
                shape.append(c.new_symbol("d", source=f"input {vi.name!r} dim {axis}"))
                continue
            if name not in symbols:
                symbols[name] = c.declare(name, source=f"input {vi.name!r} dim {axis}")
            shape.append(symbols[name])
        node = imp.graph.add_input(vi.name, TensorType(ELEM_TYPES[tt.elem_type], tuple(shape)))
        imp.register_dims(node)
        imp.values[vi.name] = node
        names.append(vi.name)
    return names
