"""Value types of the IR: tensors with symbolic dims, and index scalars.

``TensorType`` is dtype + shape, each dim an ``int`` or a ``SymExpr``.
``IndexType`` types the scalars of the shape computation (``dim``, ``imul``...);
it carries the symbolic value the scalar is known to have, so shape rules of
ops that take sizes as operands (reshape, broadcast, iota, slice) can read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from disc.shape.expr import DimLike, SymExpr, as_expr, simplify_dim

# The IR's element types, by the short names the printer writes. The IR knows no framework:
# `numpy_dtype` and `torch_dtype` convert at its edges (frontends, hosts).
DTYPE_NAMES = ("f16", "bf16", "f32", "f64", "i8", "u8", "i16", "i32", "i64", "i1", "u16", "u32", "u64")
ITEMSIZE = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "u8": 1, "i16": 2, "i32": 4, "i64": 8, "i1": 1, "u16": 2, "u32": 4, "u64": 8}
FLOAT_DTYPES = frozenset({"f16", "bf16", "f32", "f64"})
UNSIGNED_DTYPES = frozenset({"u8", "u16", "u32", "u64"})
INT_DTYPES = frozenset({"i8", "i16", "i32", "i64"}) | UNSIGNED_DTYPES
_NUMPY = {"f16": "float16", "f32": "float32", "f64": "float64", "i8": "int8", "u8": "uint8", "i16": "int16", "i32": "int32", "i64": "int64",
          "i1": "bool", "u16": "uint16", "u32": "uint32", "u64": "uint64"}  # fmt: skip


def promote(a: str, b: str) -> str:
    """The dtype of a binary op on ``a`` and ``b`` (PyTorch's and numpy's category rules): bool <
    integers < floats; the wider within a category; f16 with bf16 is f32. A signed integer with
    an unsigned one is the narrowest signed type holding both (i8 with u8 is i16); none holds
    u64 and a signed type, which numpy makes f64 and PyTorch refuses: disc refuses too."""
    if a == b:
        return a
    rank = {"i1": 0, **dict.fromkeys(INT_DTYPES, 1), **dict.fromkeys(FLOAT_DTYPES, 2)}
    if rank[a] != rank[b]:
        return a if rank[a] > rank[b] else b
    if {a, b} == {"f16", "bf16"}:
        return "f32"
    if (a in UNSIGNED_DTYPES) != (b in UNSIGNED_DTYPES):
        unsigned, signed = (a, b) if a in UNSIGNED_DTYPES else (b, a)
        if ITEMSIZE[signed] > ITEMSIZE[unsigned]:
            return signed
        if unsigned == "u64":
            raise TypeError(f"no promotion rule for {a} and {b}: no integer type holds both")
        return {1: "i16", 2: "i32", 4: "i64"}[ITEMSIZE[unsigned]]
    return a if ITEMSIZE[a] > ITEMSIZE[b] else b


def numpy_dtype(name: str) -> object:
    """The numpy dtype of an IR dtype (bf16 has none in numpy: its bits travel as uint16)."""
    import numpy as np

    return np.dtype("uint16" if name == "bf16" else _NUMPY[name])


def dtype_of_numpy(dt: object) -> str:
    for name, np_name in _NUMPY.items():
        if str(dt) == np_name:
            return name
    if str(dt) == "bfloat16":  # ml_dtypes
        return "bf16"
    raise TypeError(f"numpy dtype {dt} is not supported by disc")


def torch_dtype(name: str) -> object:
    """The torch dtype of an IR dtype (the PyTorch frontend and host; imports torch)."""
    return _torch_maps()[0][name]


def dtype_of_torch(dt: object) -> str:
    to_ir = _torch_maps()[1]
    if dt not in to_ir:
        raise TypeError(f"dtype {dt} is not supported by disc")
    return to_ir[dt]


_maps: tuple[dict, dict] | None = None


def _torch_maps() -> tuple[dict, dict]:
    global _maps
    if _maps is None:
        import torch

        names = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64, "i8": torch.int8,
                 "u8": torch.uint8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64, "i1": torch.bool,
                 "u16": torch.uint16, "u32": torch.uint32, "u64": torch.uint64}  # fmt: skip
        _maps = (names, {v: k for k, v in names.items()})
    return _maps


def __getattr__(name: str) -> object:
    # DTYPES (IR name -> torch dtype) and TORCH_TO_DTYPE, for the PyTorch frontend and hosts: built,
    # and torch imported, on first use, so the IR itself imports without torch.
    if name == "DTYPES":
        return _torch_maps()[0]
    if name == "TORCH_TO_DTYPE":
        return _torch_maps()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class TensorType:
    dtype: str
    shape: tuple[DimLike, ...]

    def __post_init__(self) -> None:
        if self.dtype not in ITEMSIZE:
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
