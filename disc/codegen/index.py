"""Positions inside a fused kernel, shared by the C++ and Triton generators.

An ``Idx`` holds index expressions as source text (C++ or Triton); each generator's emitter
supplies ``c`` (the graph's constraints) and how to write a dim size (``dim``), a linear offset
(``linear_of``) and per-dim indices (``dims_of``) in its language. What an index becomes when
the same elements are viewed in another shape is the same reasoning for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Idx:
    """A position (C++: one; Triton: a block of them) in a value of shape ``shape``: per-dim
    indices, the linear offset, or both."""

    shape: tuple[str, ...]
    dims: tuple[str, ...] | None = None
    linear: str | None = None


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
