"""Value types of the IR: tensors with symbolic dims, and index scalars.

``TensorType`` is dtype + shape, each dim an ``int`` or a ``SymExpr``.
``IndexType`` types the scalars of the shape computation (``dim``, ``imul``...);
it carries the symbolic value the scalar is known to have, so shape rules of
ops that take sizes as operands (reshape, broadcast, iota, slice) can read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch

from disc.shape.expr import DimLike, SymExpr, as_expr, simplify_dim

# IR dtype names <-> torch dtypes. The short names are what the printer writes.
DTYPES: dict[str, torch.dtype] = {
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f32": torch.float32,
    "f64": torch.float64,
    "i8": torch.int8,
    "u8": torch.uint8,
    "i16": torch.int16,
    "i32": torch.int32,
    "i64": torch.int64,
    "i1": torch.bool,
}
TORCH_TO_DTYPE: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
FLOAT_DTYPES = frozenset({"f16", "bf16", "f32", "f64"})
INT_DTYPES = frozenset({"i8", "u8", "i16", "i32", "i64"})


def dtype_of_torch(dt: torch.dtype) -> str:
    if dt not in TORCH_TO_DTYPE:
        raise TypeError(f"dtype {dt} is not supported by disc")
    return TORCH_TO_DTYPE[dt]


def promote(a: str, b: str) -> str:
    """Type promotion for binary ops, following torch's category rules."""
    if a == b:
        return a
    return dtype_of_torch(torch.promote_types(DTYPES[a], DTYPES[b]))


@dataclass(frozen=True)
class TensorType:
    dtype: str
    shape: tuple[DimLike, ...]

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise TypeError(f"unknown dtype {self.dtype!r}")
        object.__setattr__(self, "shape", tuple(simplify_dim(d) for d in self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def numel(self) -> SymExpr:
        out = SymExpr.const(1)
        for d in self.shape:
            out = out * as_expr(d)
        return out

    def with_shape(self, shape: tuple[DimLike, ...]) -> TensorType:
        return TensorType(self.dtype, tuple(shape))

    def with_dtype(self, dtype: str) -> TensorType:
        return TensorType(dtype, self.shape)

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True)
class IndexType:
    """A host-side integer of the shape computation, with its symbolic value."""

    value: DimLike

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", simplify_dim(self.value))

    def __str__(self) -> str:
        return f"index({self.value})"


Type = Union[TensorType, IndexType]
