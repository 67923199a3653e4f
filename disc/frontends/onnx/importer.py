"""An ONNX ``ModelProto`` as disc IR: symbolic dims from ``dim_param``, shape subgraphs as shape values.

Inputs: a ``dim_param`` names a symbol (the same name in two places is one symbol, a
constraint), a ``dim_value`` is a static dim, an unnamed unknown dim gets a fresh symbol;
``dynamic={"input": {axis: "name"}}`` names or replaces dims, an int pins one.
Initializers and ``Constant`` nodes stay numpy arrays while only attribute-like operands read
them (a ``Reshape``'s shape, ``Unsqueeze``'s axes) and become graph constants where an op
computes with them. ``Shape`` gives a *shape value*, the list of the tensor's symbolic dims,
and the integer ops over it (``Gather``, ``Slice``, ``Concat``, ``Unsqueeze``, arithmetic)
compute on those dims at compile time: the shape computation becomes the IR's index ops,
never a per-call evaluation. Each op's lowering is in ``ops/``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from disc.frontends.arrays import ArrayBuilder, DimValue, ShapeValue
from disc.ir.builder import LoweringError
from disc.ir.types import TensorType, dtype_of_numpy
from disc.shape.expr import SYMBOL_NAME_RULE, DimLike, SymExpr, is_symbol_name, symbol_name_like

__all__ = ["ELEM_TYPES", "DimValue", "OnnxImporter", "ShapeValue", "add_inputs"]

# ONNX TensorProto element types disc runs.
ELEM_TYPES = {1: "f32", 2: "u8", 3: "i8", 4: "u16", 5: "i16", 6: "i32", 7: "i64", 9: "i1", 10: "f16", 11: "f64", 12: "u32", 13: "u64", 16: "bf16"}


class OnnxImporter(ArrayBuilder):
    """One model's import: values by ONNX name (a Node, a numpy constant or a ShapeValue)."""

    def __init__(self, name: str, opset: int) -> None:
        super().__init__(name)
        self.opset = opset
        self.values: dict[str, Any] = {}

    def run_nodes(self, nodes: Sequence[Any]) -> None:
        """Lower ``nodes`` in order through the op table, binding their outputs by name."""
        from disc.errors import CompileError
        from disc.frontends.arrays import NeedsValue
        from disc.frontends.onnx import narrow
        from disc.frontends.onnx.ops import OPS, PREVIEW_DOMAINS

        for k, node in enumerate(nodes):
            where = f"node {node.name or k!r} ({node.op_type}, opset {self.opset})"
            if node.domain not in ("", "ai.onnx") and node.op_type not in PREVIEW_DOMAINS.get(node.domain, ()):
                raise CompileError(f"{where}: operator domain {node.domain!r} is not supported")
            fn = OPS.get(node.op_type)
            if fn is None:
                raise CompileError(f"{where}: {node.op_type} is not supported by disc's ONNX frontend (supported: {', '.join(sorted(OPS))})")
            operands = [self.values[name] if name else None for name in node.input]
            try:
                attrs = attributes(node)
                fn, operands = narrow.route(node, fn, operands, attrs)  # ONNX's narrow types (narrow.py)
                result = fn(self, node, *operands, **attrs)
            except NeedsValue:
                raise
            except (LoweringError, ValueError, TypeError, KeyError) as e:
                raise CompileError(f"{where}: {type(e).__name__}: {e}") from None
            results = result if isinstance(result, list) else [result]
            for name, value in zip(node.output, results):
                if name:
                    self.values[name] = value

    def call_graph(self, graph: Any, args: Sequence[Any]) -> list[Any]:
        """A subgraph with formal inputs (a Loop's or Scan's body, SequenceMap's, FlexAttention's
        modifiers) applied to ``args``: inputs bound, nodes lowered in the enclosing scope (outer
        values read by name), its outputs' values returned; its names do not leak out."""
        if len(graph.input) != len(args):
            raise LoweringError(f"subgraph {graph.name!r} takes {len(graph.input)} inputs; {len(args)} given")
        saved = dict(self.values)
        try:
            self.values.update({vi.name: a for vi, a in zip(graph.input, args)})
            return self.run_subgraph(graph)
        finally:
            self.values = saved

    def run_subgraph(self, graph: Any) -> list[Any]:
        """A control-flow op's body (``If``'s branches) lowered in the enclosing scope: it reads
        outer values by name; its own names do not leak out. Returns its outputs' values."""
        from onnx import numpy_helper

        outer = dict(self.values)
        try:
            self.values.update({t.name: numpy_helper.to_array(t) for t in graph.initializer})
            self.run_nodes(graph.node)
            return [self.values[o.name] for o in graph.output]
        finally:
            self.values = outer


def attributes(node: Any) -> dict[str, Any]:
    """A node's attributes as Python values (tensors as numpy arrays, strings decoded; graphs
    stay GraphProtos for the control-flow ops)."""
    from onnx import AttributeProto, helper, numpy_helper

    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if a.type == AttributeProto.TENSOR:
            v = numpy_helper.to_array(v)
        elif isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode() for x in v]
        out[a.name] = v
    return out


def _dims(value_info: Any) -> list[Any]:
    return [d for d in value_info.type.tensor_type.shape.dim]


def add_inputs(
    imp: OnnxImporter,
    graph: Any,
    initializers: set[str],
    dynamic: Mapping[str, Mapping[int, str | int]],
    values: Mapping[str, np.ndarray] | None = None,
    sequences: Mapping[str, Sequence[tuple[str, int]]] | None = None,
    optionals: Mapping[str, bool] | None = None,
) -> list[str]:
    """Declare the graph's inputs (initializers and ``values`` excepted: those are compile-time
    arrays); returns the names of the program's inputs in order. A sequence input needs its
    elements' (dtype, rank) in ``sequences``: element i becomes the input ``name[i]``. An
    optional input needs whether it is given in ``optionals``: an absent one is no input."""
    from disc.frontends.onnx import narrow

    c = imp.graph.constraints
    symbols: dict[str, SymExpr] = {}
    names = []
    values = values or {}
    for what, given in (("dynamic", dynamic), ("values", values)):
        unknown = sorted(set(given) - {i.name for i in graph.input})
        if unknown:
            raise LoweringError(f"{what} names input(s) {unknown}; the model's inputs are {[i.name for i in graph.input if i.name not in initializers]}")
    for vi in graph.input:
        if vi.name in initializers:
            continue
        if vi.type.HasField("optional_type"):
            if vi.name not in (optionals or {}):
                raise LoweringError(f"input {vi.name!r} is optional: whether it is given is needed to compile (disc.onnx.compile defers to the first call)")
            if not optionals[vi.name]:  # type: ignore[index]
                from disc.frontends.onnx.ops.sequence import EMPTY_OPTIONAL

                imp.values[vi.name] = EMPTY_OPTIONAL
                continue
            vi = _element_of_optional(vi)
        if vi.type.HasField("sequence_type"):
            names += _sequence_input(imp, vi, (sequences or {}).get(vi.name))
            continue
        tt = vi.type.tensor_type
        carried = tt.elem_type in narrow.FORMATS  # held in its carrier, a Carried (narrow.py)
        if not vi.type.HasField("tensor_type") or (tt.elem_type not in ELEM_TYPES and not carried):
            raise LoweringError(f"input {vi.name!r}: element type {tt.elem_type} is not one disc runs ({sorted(ELEM_TYPES.values())})")
        if vi.name in values:
            imp.values[vi.name] = narrow.Carried(narrow.to_carrier(vi.name, values[vi.name], tt.elem_type), tt.elem_type) if carried else _value_input(vi, values[vi.name])
            continue
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
            if isinstance(want, str) and not is_symbol_name(want):
                raise LoweringError(f"dynamic[{vi.name!r}] names dim {axis} {want!r}; a dim name is {SYMBOL_NAME_RULE}")
            name = want if isinstance(want, str) else (d.dim_param if d.HasField("dim_param") and d.dim_param else None)
            if want is None and d.HasField("dim_value"):
                shape.append(int(d.dim_value))
                continue
            if name is None:
                shape.append(c.new_symbol("d", source=f"input {vi.name!r} dim {axis}"))
                continue
            if name not in symbols:
                # A model's dim_param may be any string ("batch size", "N + 1"): its symbol gets a
                # name the IR's text (and a saved program) can hold, and no other dim's; the same
                # string is still one symbol.
                legal = name if is_symbol_name(name) and name not in c.facts else symbol_name_like(name, c.facts)
                where = f"input {vi.name!r} dim {axis}" + ("" if legal == name else f" (dim_param {name!r})")
                symbols[name] = c.declare(legal, source=where)
            shape.append(symbols[name])
        node = imp.graph.add_input(vi.name, TensorType(narrow.carrier(tt.elem_type) if carried else ELEM_TYPES[tt.elem_type], tuple(shape)))
        imp.register_dims(node)
        imp.values[vi.name] = narrow.Carried(node, tt.elem_type) if carried else node
        names.append(vi.name)
    return names


def _element_of_optional(vi: Any) -> Any:
    """A given optional input declared as its element (a tensor or a sequence)."""
    from onnx import ValueInfoProto

    inner = ValueInfoProto()
    inner.name = vi.name
    inner.type.CopyFrom(vi.type.optional_type.elem_type)
    return inner


def _sequence_input(imp: OnnxImporter, vi: Any, elements: Sequence[tuple[str, int]] | None) -> list[str]:
    """A sequence input as one program input per element (``name[i]``, each dim a fresh symbol
    unless the model pins it), held as a SequenceValue; returns the elements' input names."""
    from disc.frontends.onnx.ops.sequence import SequenceValue

    if elements is None:
        raise LoweringError(f"input {vi.name!r} is a sequence: its length and its elements' ranks are needed to compile (disc.onnx.compile defers to the first call)")
    element = vi.type.sequence_type.elem_type
    if not element.HasField("tensor_type") or element.tensor_type.elem_type not in ELEM_TYPES:
        raise LoweringError(f"input {vi.name!r}: a sequence of {element.WhichOneof('value') or 'unknown'} elements (disc takes sequences of numeric tensors)")
    dtype = ELEM_TYPES[element.tensor_type.elem_type]
    declared = [d.dim_value if d.HasField("dim_value") else None for d in element.tensor_type.shape.dim] if element.tensor_type.HasField("shape") else None
    nodes, names = [], []
    for i, (have, rank) in enumerate(elements):
        if have != dtype:
            raise LoweringError(f"input {vi.name!r} element {i} is {have}; the model's sequence holds {dtype}")
        if declared is not None and len(declared) != rank:
            raise LoweringError(f"input {vi.name!r} element {i} has rank {rank}; the model's sequence holds rank {len(declared)}")
        shape = [d if d is not None else imp.graph.constraints.new_symbol("d", source=f"input {vi.name!r} element {i} dim {axis}") for axis, d in enumerate(declared or [None] * rank)]
        node = imp.graph.add_input(f"{vi.name}[{i}]", TensorType(dtype, tuple(shape)))
        imp.register_dims(node)
        nodes.append(node)
        names.append(f"{vi.name}[{i}]")
    imp.values[vi.name] = SequenceValue(tuple(nodes))
    return names


def _value_input(vi: Any, value: Any) -> np.ndarray:
    """An input given at compile time, checked against the model's declaration of it."""
    arr = np.asarray(value)
    want = ELEM_TYPES[vi.type.tensor_type.elem_type]
    try:
        have = dtype_of_numpy(arr.dtype)
    except TypeError:
        have = str(arr.dtype)
    if have != want:
        raise LoweringError(f"input {vi.name!r} is {want} in the model; its value is {arr.dtype}")
    dims = _dims(vi)
    if vi.type.tensor_type.HasField("shape") and len(dims) != arr.ndim:
        raise LoweringError(f"input {vi.name!r} has rank {len(dims)} in the model; its value has rank {arr.ndim}")
    for axis, d in enumerate(dims):
        if d.HasField("dim_value") and d.dim_value != arr.shape[axis]:
            raise LoweringError(f"input {vi.name!r} dim {axis} is {d.dim_value} in the model; its value's is {arr.shape[axis]}")
    return arr
