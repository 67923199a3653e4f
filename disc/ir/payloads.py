"""Reading constant payloads without caring which framework holds them.

``Graph.constants`` holds torch tensors (the PyTorch frontend) or numpy arrays (a frontend or
tool without torch). The passes only ask a few things of a payload, answered here for both:
its IR dtype, whether two are the same value, the single value a splat holds, a scalar.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from disc.ir.types import FLOAT_DTYPES, dtype_of_numpy, dtype_of_torch, numpy_dtype


def is_numpy(t: Any) -> bool:
    return isinstance(t, np.ndarray)


def dtype_name(t: Any) -> str:
    """The IR dtype of a payload."""
    return dtype_of_numpy(t.dtype) if is_numpy(t) else dtype_of_torch(t.dtype)


def contiguous(t: Any) -> Any:
    return np.require(t, requirements=["C"]) if is_numpy(t) else t.detach().contiguous()  # (ascontiguousarray makes 0-d arrays 1-d)


def same_payload(a: Any, b: Any) -> bool:
    """Same dtype, shape and elements, signs of zero included; NaN is never equal (such payloads stay apart)."""
    if a is b:
        return True
    if is_numpy(a) != is_numpy(b) or a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    if is_numpy(a):
        if not np.array_equal(a, b):
            return False
        return not np.issubdtype(a.dtype, np.floating) or np.array_equal(np.signbit(a), np.signbit(b))
    import torch

    if not torch.equal(a, b):
        return False
    if a.is_floating_point() or a.is_complex():
        return torch.equal(torch.signbit(a), torch.signbit(b))
    return True


def splat_value(t: Any) -> Any:
    """The single value every element holds (a Python scalar), or None; elements must be identical,
    sign of zero included; NaN never counts as a splat."""
    if int(np.prod(t.shape)) == 0:
        return None
    if is_numpy(t):
        flat = t.reshape(-1)
        first = flat[0]
        if not bool((flat == first).all()):
            return None
        if np.issubdtype(t.dtype, np.floating) and not bool((np.signbit(flat) == np.signbit(first)).all()):
            return None
        return first.item()
    import torch

    flat = t.reshape(-1)
    first = flat[0]
    if not bool((flat == first).all()):
        return None
    if t.is_floating_point() and not bool((torch.signbit(flat) == torch.signbit(first)).all()):
        return None
    return first.item()


def scalar(value: Any, dtype: str) -> Any:
    """A 0-d payload: a torch tensor where torch is installed (the references evaluate on it), else numpy."""
    try:
        import torch
    except ImportError:
        return np.array(value, dtype=numpy_dtype(dtype)) if dtype != "bf16" else None
    from disc.ir.types import torch_dtype

    return torch.tensor(value, dtype=torch_dtype(dtype))


def is_scalar_payload(t: Any) -> bool:
    return hasattr(t, "shape") and len(t.shape) == 0


__all__ = ["FLOAT_DTYPES", "contiguous", "dtype_name", "is_numpy", "is_scalar_payload", "same_payload", "scalar", "splat_value"]
