"""Reductions, arg-reductions, TopK and running sums/products."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from disc.frontends.arrays import known_ints as _ints
from disc.frontends.onnx.importer import OnnxImporter
from disc.frontends.onnx.ops import onnx_op
from disc.frontends.onnx.ops.common import known_dim
from disc.ir.builder import (
    LoweringError,
    broadcast_to,
    convert,
    cumulative_sum,
    elementwise,
    flip,
    mean,
    positions,
    reduce,
    reshape,
    select,
    top_k,
)
from disc.ir.graph import Node
from disc.ir.registry import normalize_axis
from disc.ir.types import FLOAT_DTYPES

_REDUCE = {"ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min", "ReduceProd": "prod", "ReduceMean": "mean"}


@onnx_op(*_REDUCE)
def _reduce(imp: OnnxImporter, node: Any, x: Any, axes_in: Any = None, keepdims: int = 1, noop_with_empty_axes: int = 0, axes: Sequence[int] | None = None) -> Node:
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    chosen = axes if axes is not None else (_ints(axes_in, f"{node.op_type} axes") if axes_in is not None else None)
    if not chosen:
        if noop_with_empty_axes:
            return x
        chosen = list(range(rank))
    dims = sorted({normalize_axis(a, rank, node.op_type) for a in chosen})
    kind = _REDUCE[node.op_type]
    out = mean(imp, x, dims, True) if kind == "mean" else reduce(imp, x, dims, kind, True)
    if keepdims:
        return out
    return reshape(imp, out, [d for i, d in enumerate(x.shape) if i not in dims])


@onnx_op("CumSum")
def _cumsum(imp: OnnxImporter, node: Any, x: Any, axis: Any, exclusive: int = 0, reverse: int = 0) -> Node:
    x = imp.tensor(x)
    a = normalize_axis(_ints(axis, "CumSum's axis")[0], x.tensor_type.rank, "CumSum")
    return cumulative_sum(imp, x, a, bool(exclusive), bool(reverse))


@onnx_op("CumProd")
def _cumprod(imp: OnnxImporter, node: Any, x: Any, axis: Any, exclusive: int = 0, reverse: int = 0) -> Node:
    """Running products along ``axis`` by doubling: after the round with shift d each element
    holds the product of the 2d elements ending at it (ones shifted in), so a known length n
    takes ceil(log2 n) rounds."""
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    a = normalize_axis(_ints(axis, "CumProd's axis")[0], rank, "CumProd")
    n = known_dim(x.shape[a])
    if n is None:
        raise LoweringError(f"CumProd along axis {a}, whose length ({x.shape[a]}) is not known when the model is compiled")
    one = 1.0 if x.dtype in FLOAT_DTYPES else 1

    def shifted(t: Node, d: int) -> Node:
        low, high = [0] * rank, [0] * rank
        low[a], high[a] = d, -d
        return imp.graph.add("pad", (t,), {"low": tuple(low), "high": tuple(high), "value": one})

    if reverse:
        x = flip(imp, x, a)
    if exclusive and n:
        x = shifted(x, 1)
    d = 1
    while d < n:
        x = elementwise(imp, "mul", [x, shifted(x, d)], x.dtype)
        d *= 2
    return flip(imp, x, a) if reverse else x


@onnx_op("Hardmax")
def _hardmax(imp: OnnxImporter, node: Any, x: Any, axis: int = -1) -> Node:
    """1 where the first maximum along ``axis`` lies, 0 elsewhere."""
    x = imp.tensor(x)
    a = normalize_axis(axis, x.tensor_type.rank, "Hardmax")
    first = imp.graph.add("argreduce", (x,), {"axis": a, "kind": "argmax", "keepdim": True, "last": False})
    hit = imp.graph.add("eq", (positions(imp, x.shape, a), broadcast_to(imp, first, x.shape)))
    return convert(imp, hit, x.dtype)


@onnx_op("ArgMax", "ArgMin")
def _argreduce(imp: OnnxImporter, node: Any, x: Any, axis: int = 0, keepdims: int = 1, select_last_index: int = 0) -> Node:
    x = imp.tensor(x)
    axis = normalize_axis(axis, x.tensor_type.rank, node.op_type)
    return imp.graph.add("argreduce", (x,), {"axis": axis, "kind": node.op_type.lower(), "keepdim": bool(keepdims), "last": bool(select_last_index)})


@onnx_op("TopK")
def _top_k(imp: OnnxImporter, node: Any, x: Any, k: Any, axis: int = -1, largest: int = 1, sorted: int = 1) -> list[Node]:
    x = imp.tensor(x)
    a = normalize_axis(axis, x.tensor_type.rank, "TopK")
    return list(top_k(imp, x, a, _ints(k, "TopK's k")[0], bool(largest), "TopK"))


_NORM_REDUCE = {"ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"}


@onnx_op(*_NORM_REDUCE)
def _norm_reduce(imp: OnnxImporter, node: Any, x: Any, axes_in: Any = None, keepdims: int = 1, noop_with_empty_axes: int = 0, axes: Sequence[int] | None = None) -> Node:
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    chosen = axes if axes is not None else (_ints(axes_in, f"{node.op_type} axes") if axes_in is not None else None)
    if not chosen and noop_with_empty_axes:
        chosen = []
    elif not chosen:
        chosen = list(range(rank))
    dims = sorted({normalize_axis(a, rank, node.op_type) for a in chosen})
    op = node.op_type
    if op == "ReduceLogSumExp":  # log(sum(exp(x - max))) + max: no overflow
        peak = reduce(imp, x, dims, "max", True) if dims else x
        finite = select(imp, imp.graph.add("isinf", (peak,)), 0.0, peak, x.dtype) if x.dtype in FLOAT_DTYPES else peak
        shifted = imp.graph.add("exp", (elementwise(imp, "sub", [x, finite], x.dtype),))
        out = elementwise(imp, "add", [imp.graph.add("log", (reduce(imp, shifted, dims, "sum", True) if dims else shifted,)), finite], x.dtype)
    else:
        term = {"ReduceL1": lambda: imp.graph.add("abs", (x,)), "ReduceLogSum": lambda: x}.get(op, lambda: elementwise(imp, "mul", [x, x], x.dtype))()
        out = reduce(imp, term, dims, "sum", True) if dims else term
        if op == "ReduceL2":
            out = imp.graph.add("sqrt", (out,))
        elif op == "ReduceLogSum":
            out = imp.graph.add("log", (out,))
    if keepdims or not dims:
        return out
    return reshape(imp, out, [d for i, d in enumerate(x.shape) if i not in dims])
