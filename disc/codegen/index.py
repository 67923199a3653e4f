"""Positions inside a fused kernel, shared by the C++ and Triton generators.

An ``Idx`` holds index expressions as source text (C++ or Triton); each generator's emitter
supplies ``c`` (the graph's constraints) and how to write a dim size (``dim``), a linear offset
(``linear_of``) and per-dim indices (``dims_of``) in its language. What an index becomes when
the same elements are viewed in another shape is the same reasoning for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from disc.codegen.lowering import Unsupported
from disc.ir.graph import Node
from disc.ir.types import IndexType


@dataclass
class Idx:
    """A position (C++: one; Triton: a block of them) in a value of shape ``shape``: per-dim
    indices, the linear offset, or both."""

    shape: tuple[str, ...]
    dims: tuple[str, ...] | None = None
    linear: str | None = None


class IndexEmitter:
    """The index reasoning of the ops that only move elements, the same for both generators.

    A subclass writes text in its language: ``dim`` (a dim size), ``value`` (a node's value at an
    index), ``dims_of`` (an index's per-dim indices) and ``broadcast_index`` (the index into a dim
    that may be 1 only at run time); it keeps ``c`` (the constraints), ``scopes`` (memoised
    expressions, innermost last) and the broadcast speculation flags.
    """

    c: Any
    scopes: list[dict]
    assume_no_broadcast: bool  # the speculated version: every such dim is taken as not 1
    maybe_broadcast: bool  # did any broadcast need a run-time decision (or the speculation)?

    def dim(self, d: Any) -> str:
        raise NotImplementedError

    def value(self, n: Node, idx: Idx) -> str:
        raise NotImplementedError

    def broadcast_index(self, size: str, index: str) -> str:
        raise NotImplementedError

    def dims_of(self, idx: Idx) -> tuple[str, ...]:
        raise NotImplementedError

    def shape(self, n: Node) -> tuple[str, ...]:
        return tuple(self.dim(d) for d in n.shape)

    def memo_get(self, key: Any) -> Any:
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        return None

    def _operand_idx(self, x: Node, dims: list[str]) -> Idx:
        return Idx(self.shape(x), tuple(dims))

    def _index_scalar(self, n: Node) -> str:
        if not isinstance(n.type, IndexType):
            raise Unsupported(f"%{n.name} must be a shape scalar")
        return self.dim(n.type.value)

    def _op_broadcast_in_dim(self, n: Node, idx: Idx) -> str:
        x = n.inputs[0]
        out = self.dims_of(idx)
        dims = []
        for m, d in enumerate(n.attrs["dims"]):
            src, dst = x.shape[m], n.shape[d]
            if self.c.prove_is_one(src):
                dims.append("0")
            elif self.c.prove_equal(src, dst):
                dims.append(out[d])
            else:
                self.maybe_broadcast = True
                dims.append(out[d] if self.assume_no_broadcast else self.broadcast_index(self.dim(src), out[d]))
        return self.value(x, self._operand_idx(x, dims))

    def _op_transpose(self, n: Node, idx: Idx) -> str:
        x = n.inputs[0]
        out = self.dims_of(idx)
        dims = [""] * len(out)
        for k, p in enumerate(n.attrs["perm"]):
            dims[p] = out[k]
        return self.value(x, self._operand_idx(x, dims))



def reshaped(em: Any, idx: Idx, shape: tuple, new_shape: tuple) -> Idx:
    """The position ``idx`` in a value of IR shape ``shape`` as a position in the same elements
    viewed as ``new_shape`` (equal counts, row-major).

    Group by group of dims whose products are proven equal, so that a row keeps its index (it
    splits once per row and the columns by constants, rather than the flat index by divisions
    per element), and a unit dim added or dropped moves nothing: a row statistic read as
    [rows, 1] is the row's own value.
    """
    new_c = tuple(em.dim(d) for d in new_shape)
    groups = em.c.reshape_groups(shape, new_shape) if idx.dims is not None else None
    if groups is None:
        return Idx(new_c, None, em.linear_of(idx))
    dims = ["0"] * len(new_c)
    for src, dst in groups:
        if len(src) == 1 and len(dst) == 1:
            dims[dst[0]] = idx.dims[src[0]]
            continue
        lin = em.linear_of(Idx(tuple(em.dim(shape[k]) for k in src), tuple(idx.dims[k] for k in src)))
        for k, i in zip(dst, em.dims_of(Idx(new_c[dst.start : dst.stop], None, lin))):
            dims[k] = i
    return Idx(new_c, tuple(dims), idx.linear)
