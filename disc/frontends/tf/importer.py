"""A TensorFlow graph as disc IR: the concrete function's frozen ``GraphDef`` walked in
dependency order, ``None`` dims of the input signature as symbols.

The graph is the concrete function's with variables frozen to constants and function calls
inlined (``convert_variables_to_constants_v2``). Only the nodes the outputs depend on are
imported (control edges are dropped: a frozen inference graph has no side effects to order).
``Const`` nodes stay numpy arrays while only attribute-like operands read them (a ``Reshape``'s
shape, a reduction's axes) and become graph constants where an op computes with them;
``Shape`` gives a ``ShapeValue`` and the integer ops over it (``StridedSlice``, ``GatherV2``,
``Pack``, ``ConcatV2``, ``Prod``, arithmetic) compute on symbolic dims at compile time. Each
op's lowering is in ``ops.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from disc.errors import CompileError
from disc.frontends.arrays import ArrayBuilder
from disc.ir.builder import LoweringError
from disc.ir.types import TensorType
from disc.shape.expr import DimLike

# TensorFlow DataType enum values disc runs (tensorflow/core/framework/types.proto).
TF_DTYPES = {1: "f32", 2: "f64", 3: "i32", 4: "u8", 5: "i16", 6: "i8", 9: "i64", 10: "i1", 14: "bf16", 17: "u16", 19: "f16", 22: "u32", 23: "u64"}


@dataclass(frozen=True)
class InputSpec:
    """One input of the graph: its placeholder's name, dtype and dims (None: unknown), and the
    name a caller uses for it (the signature's ``TensorSpec`` name, else the placeholder's)."""

    name: str
    dtype: str
    dims: tuple[int | None, ...]
    call_name: str = ""


class TfImporter(ArrayBuilder):
    """One graph's import: values by (node name, output index)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.values: dict[tuple[str, int], Any] = {}
        self.host_calls: dict[str, Any] = {}  # host_call key -> TfCall (fallback.py)
        self.host_functions: dict[str, Any] = {}  # op name -> its single-op TensorFlow function
        self.host_counts: dict[str, int] = {}  # op type -> how many run in TensorFlow


def attr_value(a: Any) -> Any:
    """An ``AttrValue`` as a Python value: str, int, float, bool, disc dtype, numpy array or list."""
    kind = a.WhichOneof("value")
    if kind is None:
        return None
    if kind == "s":
        return a.s.decode()
    if kind == "type":
        return TF_DTYPES.get(a.type, f"tf-dtype-{a.type}")
    if kind == "tensor":
        import tensorflow as tf

        return tf.make_ndarray(a.tensor)
    if kind == "shape":
        return None if a.shape.unknown_rank else tuple(d.size if d.size >= 0 else None for d in a.shape.dim)
    if kind == "list":
        lst = a.list
        if lst.i:
            return [int(v) for v in lst.i]
        if lst.f:
            return [float(v) for v in lst.f]
        if lst.s:
            return [v.decode() for v in lst.s]
        if lst.type:
            return [TF_DTYPES.get(t, f"tf-dtype-{t}") for t in lst.type]
        return []
    if kind == "func":
        return a.func.name
    return getattr(a, kind)


def node_attrs(node: Any) -> dict[str, Any]:
    # Attributes that only record operand types or placement are read from the operands instead.
    return {k: attr_value(v) for k, v in node.attr.items() if not k.startswith("_")}


def edge(name: str) -> tuple[str, int] | None:
    """A NodeDef input (``"n"``, ``"n:1"``, ``"^n"``) as (node, output index); None for a control edge."""
    if name.startswith("^"):
        return None
    node, _, index = name.partition(":")
    return node, int(index) if index else 0


def dependency_order(nodes: Mapping[str, Any], outputs: Sequence[tuple[str, int]]) -> list[Any]:
    """The nodes the outputs read, each after the nodes it reads (an iterative depth-first walk)."""
    order, done, active = [], set(), set()
    for root, _ in outputs:
        stack = [(root, False)]
        while stack:
            name, expanded = stack.pop()
            if name in done:
                continue
            if expanded:
                active.discard(name)
                done.add(name)
                order.append(nodes[name])
                continue
            if name in active:
                raise LoweringError(f"the graph has a cycle through node {name!r} (a loop disc does not import)")
            if name not in nodes:
                raise LoweringError(f"node {name!r} is read but not in the graph")
            active.add(name)
            stack.append((name, True))
            for i in nodes[name].input:
                e = edge(i)
                if e is not None and e[0] not in done:
                    stack.append((e[0], False))
    return order


def add_inputs(imp: TfImporter, specs: Sequence[InputSpec], dynamic: Mapping[str, Mapping[int, str | int]]) -> None:
    """Declare the inputs: a ``None`` dim becomes a symbol (named by ``dynamic`` where it names
    one; one name in two places is one symbol), an int in ``dynamic`` pins a dim."""
    c = imp.graph.constraints
    names = [s.name for s in specs]
    unknown = sorted(set(dynamic) - set(names))
    if unknown:
        raise LoweringError(f"dynamic names input(s) {unknown}; the function's inputs are {names}")
    symbols: dict[str, Any] = {}
    for spec in specs:
        if spec.dtype not in TF_DTYPES.values():
            raise LoweringError(f"input {spec.name!r}: dtype {spec.dtype} is not one disc runs ({sorted(TF_DTYPES.values())})")
        override = dynamic.get(spec.name, {})
        for axis in override:
            if not isinstance(axis, int) or not 0 <= axis < len(spec.dims):
                raise LoweringError(f"dynamic[{spec.name!r}] names axis {axis!r}; the input has rank {len(spec.dims)}")
        shape: list[DimLike] = []
        for axis, d in enumerate(spec.dims):
            want = override.get(axis)
            if isinstance(want, int) and not isinstance(want, bool):
                if d is not None and d != want:
                    raise LoweringError(f"dynamic[{spec.name!r}][{axis}] = {want}, but the signature fixes that dim at {d}")
                shape.append(want)
            elif isinstance(want, str):
                if want not in symbols:
                    symbols[want] = c.declare(want, source=f"input {spec.name!r} dim {axis}")
                shape.append(symbols[want])
            elif d is not None:
                shape.append(int(d))
            else:
                shape.append(c.new_symbol("d", source=f"input {spec.name!r} dim {axis}"))
        node = imp.graph.add_input(spec.name, TensorType(spec.dtype, tuple(shape)))
        imp.register_dims(node)
        imp.values[(spec.name, 0)] = node


OutputTypes = Callable[[str], list[tuple[str, "tuple[int | None, ...] | None"]]]


def import_graph_def(
    graph_def: Any,
    name: str,
    specs: Sequence[InputSpec],
    outputs: Sequence[str],
    dynamic: Mapping[str, Mapping[int, str | int]] | None = None,
    output_types: OutputTypes | None = None,
) -> TfImporter:
    """A frozen GraphDef as IR: ``specs`` name its placeholders, ``outputs`` (``"node:k"``) its results.

    With ``output_types`` (a node's outputs as TensorFlow infers them: dtype and dims), an op the
    table does not lower runs in TensorFlow (``fallback.py``); without, it is a CompileError."""
    from disc.frontends.tf.fallback import host_calls
    from disc.frontends.tf.ops import OPS  # the table imports this module

    imp = TfImporter(name)
    try:
        add_inputs(imp, specs, dict(dynamic or {}))
    except LoweringError as e:
        raise CompileError(str(e)) from None
    nodes = {n.name: n for n in graph_def.node}
    wanted = [edge(o) for o in outputs]
    try:
        order = dependency_order(nodes, wanted)  # type: ignore[arg-type]
    except LoweringError as e:
        raise CompileError(str(e)) from None
    for node in order:
        if (node.name, 0) in imp.values:  # an input's placeholder
            continue
        where = f"node {node.name!r} ({node.op})"
        if node.op == "Placeholder":
            raise CompileError(f"{where}: a placeholder that is not one of the signature's inputs {[s.name for s in specs]}")
        operands = []
        for i in node.input:
            e = edge(i)
            if e is not None:
                operands.append(imp.values[e])
        fn = OPS.get(node.op)
        refused = f"{node.op} is not in disc's TensorFlow op table" if fn is None else None
        if fn is not None:
            try:
                result = fn(imp, node, *operands, **node_attrs(node))
            except LoweringError as e:
                refused = str(e)
            except (ValueError, TypeError, KeyError, IndexError) as e:
                raise CompileError(f"{where}: {type(e).__name__}: {e}") from None
        if refused is not None:
            if output_types is None:
                hint = f" (supported: {', '.join(sorted(OPS))})" if fn is None else ""
                raise CompileError(f"{where}: {refused}{hint}")
            try:
                result = host_calls(imp, node, operands, output_types(node.name), refused)
            except LoweringError as e:
                raise CompileError(f"{where}: {refused}, and it cannot run in TensorFlow between compiled segments: {e}") from None
        results = result if isinstance(result, list) else [result]
        for k, value in enumerate(results):
            imp.values[(node.name, k)] = value
    missing = [o for o, e in zip(outputs, wanted) if e not in imp.values]
    if missing:
        raise CompileError(f"output(s) {missing} are not produced by the graph")
    imp.graph.outputs = [imp.tensor(_as_array_output(imp.values[e])) for e in wanted]  # type: ignore[index]
    return imp


def _as_array_output(v: Any) -> Any:
    # A constant output is still a graph value (a program returns tensors, never Python numbers).
    return np.asarray(v, order="C") if isinstance(v, np.ndarray) else v
