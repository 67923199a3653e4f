"""The verifier: a graph is well formed and every type follows from the op registry.

Run after every pass in tests (and with ``DISC_VERIFY=1`` in the pipeline). It
re-infers each node's type on a copy of the constraint set and requires the
written type to be provably equal, so a pass cannot silently change a shape.
"""

from __future__ import annotations

from disc.ir.graph import Graph
from disc.ir.registry import ShapeRuleError, get_spec, infer_type
from disc.ir.types import IndexType, TensorType
from disc.shape.expr import SymExpr


class VerificationError(ValueError):
    pass


def verify(g: Graph) -> None:
    shadow = Graph(name=g.name, constraints=g.constraints.copy(), constants=g.constants)
    c = shadow.constraints
    seen: set[int] = set()
    names: set[str] = set()
    for n in g.nodes:
        where = f"%{n.name} = {n.op}"
        if n.name in names:
            raise VerificationError(f"{where}: name defined twice")
        names.add(n.name)
        for i in n.inputs:
            if id(i) not in seen:
                raise VerificationError(f"{where}: operand %{i.name} is not defined before use")
        seen.add(id(n))
        if n.op == "input":
            if not isinstance(n.type, TensorType):
                raise VerificationError(f"{where}: inputs must be tensors")
            continue
        known = set(c.facts)
        try:
            get_spec(n.op)
            expected = infer_type(shadow, n.op, list(n.inputs), n.attrs)
        except (ShapeRuleError, KeyError) as e:
            raise VerificationError(f"{where}: {e}") from None
        if type(expected) is not type(n.type):
            raise VerificationError(f"{where}: type {n.type} but the op produces {expected}")
        if isinstance(expected, IndexType) and _minted(expected.value, known):
            # The op computes a value no expression captures (max, inexact //): the
            # symbol it mints is as good as the one written, so they are the same.
            c.add_equal(expected.value, n.type.value)  # type: ignore[union-attr]
            continue
        if isinstance(expected, IndexType):
            if not c.prove_equal(expected.value, n.type.value):  # type: ignore[union-attr]
                raise VerificationError(f"{where}: value {n.type} but the op computes {expected}")
            continue
        t = n.tensor_type
        if expected.dtype != t.dtype or not c.prove_same_shape(expected.shape, t.shape):
            raise VerificationError(f"{where}: type {t} but the op produces {expected}")
    for o in g.outputs:
        if id(o) not in seen:
            raise VerificationError(f"output %{o.name} is not a node of the graph")
    for n in g.nodes:
        if n.constant_ref is not None and n.constant_ref not in g.constants:
            raise VerificationError(f"%{n.name}: constant payload {n.constant_ref!r} is missing")


def _minted(value: object, known: set[str]) -> bool:
    name = value.as_symbol() if isinstance(value, SymExpr) else None
    return name is not None and name not in known
