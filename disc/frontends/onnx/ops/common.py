"""Helpers the ONNX lowerings share."""

from __future__ import annotations

from disc.frontends.onnx.importer import OnnxImporter
from disc.ir.builder import (
    LoweringError,
    batched_matmul,
    reshape,
)
from disc.ir.graph import Node
from disc.shape.expr import DimLike, as_expr


def require_divisible(imp: OnnxImporter, d: DimLike, k: int, why: str) -> None:
    """``d % k == 0``: proven now, or checked when the program runs (a known dim that fails is an
    error now)."""
    c = imp.graph.constraints
    if c.prove_divisible(d, k):
        return
    if known_dim(d) is not None:
        raise LoweringError(f"{why}; it is {d}")
    c.assume(d, "%", k, why)


def known_dim(d: DimLike) -> int | None:
    if isinstance(d, int):
        return d
    e = as_expr(d)
    return e.const_value if e.is_const else None


def matmul(imp: OnnxImporter, a: Node, b: Node) -> Node:
    """numpy's matmul: a 1-d operand is a row (lhs) or a column (rhs) whose dim is then dropped,
    batch dims broadcast."""
    ra, rb = a.tensor_type.rank, b.tensor_type.rank
    out = batched_matmul(imp, reshape(imp, a, [1, a.shape[0]]) if ra == 1 else a, reshape(imp, b, [b.shape[0], 1]) if rb == 1 else b)
    if ra > 1 and rb > 1:
        return out
    shape = list(out.shape)
    if rb == 1:
        shape.pop(-1)
    if ra == 1:
        shape.pop(-1 if rb == 1 else -2)
    return reshape(imp, out, shape)
