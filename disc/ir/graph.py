"""The graph: SSA nodes in topological order, the constraint set and constant payloads.

A ``Node`` is both the operation and the one value it produces (every disc op
has exactly one result, which keeps rewrites and CSE simple). Nodes are
created through ``Graph.add``, which asks the op registry for the result type,
so a graph is always shape-inferred and its constraints always collected.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from disc.ir.types import IndexType, TensorType, Type
from disc.shape.constraints import ShapeConstraints

AttrValue = Any  # int | float | bool | str | None | tuple[int, ...] | tuple[tuple[int,int],...]


def freeze_attr(v: AttrValue) -> AttrValue:
    if isinstance(v, list):
        return tuple(freeze_attr(x) for x in v)
    if isinstance(v, tuple):
        return tuple(freeze_attr(x) for x in v)
    return v


class Node:
    """One SSA value: ``name = op(inputs) {attrs} : type``."""

    __slots__ = ("attrs", "inputs", "name", "op", "type")

    def __init__(self, op: str, inputs: Sequence[Node], attrs: Mapping[str, AttrValue], type: Type, name: str) -> None:
        self.op = op
        self.inputs: tuple[Node, ...] = tuple(inputs)
        self.attrs: dict[str, AttrValue] = {k: freeze_attr(v) for k, v in attrs.items()}
        self.type = type
        self.name = name

    @property
    def tensor_type(self) -> TensorType:
        if not isinstance(self.type, TensorType):
            raise TypeError(f"%{self.name} is {self.type}, not a tensor")
        return self.type

    @property
    def shape(self) -> tuple:
        return self.tensor_type.shape

    @property
    def dtype(self) -> str:
        return self.tensor_type.dtype

    @property
    def is_index(self) -> bool:
        return isinstance(self.type, IndexType)

    @property
    def constant_ref(self) -> str | None:
        """The name of the ``Graph.constants`` tensor this constant stands for (None for a literal or another op)."""
        ref = self.attrs.get("ref") if self.op == "constant" else None
        return ref if isinstance(ref, str) else None

    @property
    def is_literal(self) -> bool:
        """A constant whose value is written in its attributes: generated code inlines it, nothing holds it in memory."""
        return self.op == "constant" and self.attrs.get("ref") is None

    def key(self) -> tuple:
        """Identity of the computation (for CSE): op, operands, attributes."""
        return (self.op, tuple(id(i) for i in self.inputs), tuple(sorted(self.attrs.items())))

    def __repr__(self) -> str:
        return f"<%{self.name} = {self.op} : {self.type}>"


@dataclass
class Graph:
    """A function: named inputs, nodes in topological order, outputs."""

    name: str = "main"
    nodes: list[Node] = field(default_factory=list)
    outputs: list[Node] = field(default_factory=list)
    constraints: ShapeConstraints = field(default_factory=ShapeConstraints)
    constants: dict[str, Any] = field(default_factory=dict)  # name -> torch tensor or numpy array (ir/payloads.py)
    _names: set[str] = field(default_factory=set, repr=False)
    _counter: int = field(default=0, repr=False)

    # -- construction ---------------------------------------------------------
    def fresh_name(self, hint: str | None = None) -> str:
        if hint and hint not in self._names:
            return hint
        while True:
            name = f"{hint}_{self._counter}" if hint else str(self._counter)
            self._counter += 1
            if name not in self._names:
                return name

    def add_input(self, name: str, type: TensorType) -> Node:
        if name in self._names:
            raise ValueError(f"duplicate value name %{name}")
        node = Node("input", (), {}, type, name)
        self._append(node)
        return node

    def add(self, op: str, inputs: Sequence[Node] = (), attrs: Mapping[str, AttrValue] | None = None, name: str | None = None) -> Node:
        """Create ``op(inputs){attrs}``, inferring its type through the op registry."""
        from disc.ir.registry import get_spec, infer_type

        # Attributes are stored complete (defaults filled in) so equal ops compare equal.
        attrs = {k: freeze_attr(v) for k, v in get_spec(op).full_attrs(attrs or {}).items()}
        type = infer_type(self, op, list(inputs), attrs)
        node = Node(op, inputs, attrs, type, self.fresh_name(name))
        self._append(node)
        return node

    def add_typed(self, op: str, inputs: Sequence[Node], attrs: Mapping[str, AttrValue], type: Type, name: str) -> Node:
        """Create a node with a given type (the parser; the verifier re-checks it)."""
        if name in self._names:
            raise ValueError(f"duplicate value name %{name}")
        node = Node(op, inputs, attrs, type, name)
        self._append(node)
        return node

    def add_constant(self, tensor: Any, name: str | None = None) -> Node:
        """A tensor literal (a torch tensor or numpy array): small scalars inline as ``value``,
        others by name in ``constants``."""
        from disc.ir.payloads import contiguous, dtype_name

        dtype = dtype_name(tensor)
        tensor = contiguous(tensor)
        if len(tensor.shape) == 0 and dtype != "i1":
            return self.add("constant", (), {"value": tensor.item(), "dtype": dtype}, name=name)
        key = self.fresh_constant_name(name or "c")
        self.constants[key] = tensor
        return self.add("constant", (), {"ref": key, "dtype": dtype}, name=name)

    def fresh_constant_name(self, hint: str) -> str:
        key, i = hint, 0
        while key in self.constants:
            i += 1
            key = f"{hint}_{i}"
        return key

    def _append(self, node: Node) -> None:
        self._names.add(node.name)
        self.nodes.append(node)

    # -- queries --------------------------------------------------------------
    @property
    def inputs(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "input"]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def users(self) -> dict[Node, list[Node]]:
        out: dict[Node, list[Node]] = {n: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                out[i].append(n)
        return out

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def __str__(self) -> str:
        from disc.ir.printer import print_graph

        return print_graph(self)




def clone_graph_header(src: Graph) -> Graph:
    """A new empty graph sharing the constraint set copy and constants of ``src``."""
    return Graph(name=src.name, constraints=src.constraints.copy(), constants=dict(src.constants))


def live_nodes(outputs: Iterable[Node]) -> set[Node]:
    seen: set[Node] = set()
    stack = list(outputs)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(n.inputs)
    return seen
