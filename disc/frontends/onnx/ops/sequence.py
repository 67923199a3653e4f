"""Sequences of tensors, held at compile time as Python lists: every position and length is known
when the model is compiled, so each element stays an ordinary value (a sequence the model takes
or gives is one program input or output per element, ``disc/frontends/onnx/__init__.py``).
Optionals likewise: an empty one is ``EMPTY_OPTIONAL``, a present one its element's value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from disc.frontends.arrays import known_ints as _ints
from disc.frontends.onnx.importer import OnnxImporter
from disc.frontends.onnx.ops import onnx_op
from disc.frontends.onnx.ops.common import known_dim
from disc.ir.builder import LoweringError, reshape
from disc.ir.registry import normalize_axis


@dataclass(frozen=True)
class SequenceValue:
    """An ONNX sequence: its elements' values, in order."""

    items: tuple[Any, ...] = ()


class _EmptyOptional:
    """An ONNX optional holding nothing (a present optional is held as its element's value)."""

    def __repr__(self) -> str:
        return "EMPTY_OPTIONAL"


EMPTY_OPTIONAL = _EmptyOptional()


def _sequence(v: Any, op: str) -> list[Any]:
    if not isinstance(v, SequenceValue):
        raise LoweringError(f"{op} takes a sequence")
    return list(v.items)


def _position(seq: list[Any], pos: Any, op: str, inserting: bool = False) -> int:
    """A position into ``seq`` (negative counts from the end); inserting may also name the end."""
    p = _ints(pos, f"{op}'s position")[0]
    n = len(seq)
    if not (-n <= p <= n if inserting else -n <= p < n):
        raise LoweringError(f"{op}: position {p} outside a sequence of {n}")
    return p + n if p < 0 else p


@onnx_op("SequenceEmpty")
def _sequence_empty(imp: OnnxImporter, node: Any, dtype: int = 1) -> SequenceValue:
    return SequenceValue()


@onnx_op("SequenceConstruct")
def _sequence_construct(imp: OnnxImporter, node: Any, *xs: Any) -> SequenceValue:
    return SequenceValue(tuple(xs))


@onnx_op("SequenceAt")
def _sequence_at(imp: OnnxImporter, node: Any, seq: Any, pos: Any) -> Any:
    seq = _sequence(seq, "SequenceAt")
    return seq[_position(seq, pos, "SequenceAt")]


@onnx_op("SequenceInsert")
def _sequence_insert(imp: OnnxImporter, node: Any, seq: Any, x: Any, pos: Any = None) -> SequenceValue:
    items = _sequence(seq, "SequenceInsert")
    items.insert(len(items) if pos is None else _position(items, pos, "SequenceInsert", inserting=True), x)
    return SequenceValue(tuple(items))


@onnx_op("SequenceErase")
def _sequence_erase(imp: OnnxImporter, node: Any, seq: Any, pos: Any = None) -> SequenceValue:
    items = _sequence(seq, "SequenceErase")
    if not items:
        raise LoweringError("SequenceErase on an empty sequence")
    del items[len(items) - 1 if pos is None else _position(items, pos, "SequenceErase")]
    return SequenceValue(tuple(items))


@onnx_op("SequenceLength")
def _sequence_length(imp: OnnxImporter, node: Any, seq: Any) -> np.ndarray:
    return np.array(len(_sequence(seq, "SequenceLength")), np.int64)


@onnx_op("SplitToSequence")
def _split_to_sequence(imp: OnnxImporter, node: Any, x: Any, split: Any = None, axis: int = 0, keepdims: int = 1) -> SequenceValue:
    """Pieces along ``axis``: of one length each (the last may be shorter), of the lengths listed,
    or (no ``split``) single elements, whose axis is dropped unless ``keepdims``."""
    x = imp.tensor(x)
    a = normalize_axis(axis, x.tensor_type.rank, "SplitToSequence")
    total = known_dim(x.shape[a])
    if total is None:
        raise LoweringError(f"SplitToSequence along axis {a}, whose length ({x.shape[a]}) is not known when the model is compiled")
    if split is None:
        sizes, drop = [1] * total, not keepdims
    else:
        given = _ints(split, "SplitToSequence's split")
        scalar = np.ndim(split) == 0 if isinstance(split, np.ndarray) else len(given) == 1 and total != given[0]
        sizes = [min(given[0], total - i) for i in range(0, total, given[0])] if scalar else given
        drop = False
    if sum(sizes) != total:
        raise LoweringError(f"SplitToSequence: pieces {sizes} do not add up to axis {a}'s {total}")
    out, start = [], 0
    for size in sizes:
        piece = imp.graph.add("slice", (x, imp.index(start), imp.index(start + size)), {"axis": a, "step": 1})
        out.append(reshape(imp, piece, [d for i, d in enumerate(piece.shape) if i != a]) if drop else piece)
        start += size
    return SequenceValue(tuple(out))


@onnx_op("ConcatFromSequence")
def _concat_from_sequence(imp: OnnxImporter, node: Any, seq: Any, axis: int = 0, new_axis: int = 0) -> Any:
    """The elements joined along ``axis``, or stacked along a new one (``new_axis``)."""
    items = [imp.tensor(v) for v in _sequence(seq, "ConcatFromSequence")]
    if not items:
        raise LoweringError("ConcatFromSequence of an empty sequence")
    rank = items[0].tensor_type.rank
    a = normalize_axis(axis, rank + 1 if new_axis else rank, "ConcatFromSequence")
    if new_axis:
        items = [reshape(imp, v, [*v.shape[:a], 1, *v.shape[a:]]) for v in items]
    return items[0] if len(items) == 1 else imp.graph.add("concat", items, {"axis": a})


@onnx_op("Optional")
def _optional(imp: OnnxImporter, node: Any, x: Any = None, type: Any = None) -> Any:
    return EMPTY_OPTIONAL if x is None else x


@onnx_op("OptionalHasElement")
def _optional_has_element(imp: OnnxImporter, node: Any, x: Any = None) -> np.ndarray:
    return np.array(x is not None and x is not EMPTY_OPTIONAL)


@onnx_op("OptionalGetElement")
def _optional_get_element(imp: OnnxImporter, node: Any, x: Any) -> Any:
    if x is EMPTY_OPTIONAL:
        raise LoweringError("OptionalGetElement of an empty optional")
    return x
