"""DFT and STFT as GEMMs with cosine/sine tables; the window functions."""

from __future__ import annotations

from typing import Any

import numpy as np

from disc.frontends.arrays import known_ints as _ints
from disc.frontends.onnx.importer import ELEM_TYPES, OnnxImporter
from disc.frontends.onnx.ops import onnx_op
from disc.frontends.onnx.ops.common import known_dim, matmul
from disc.ir.builder import (
    LoweringError,
    convert,
    elementwise,
    reshape,
)
from disc.ir.graph import Node
from disc.ir.registry import normalize_axis
from disc.ir.types import numpy_dtype
from disc.shape.expr import product


def _dft_last(imp: OnnxImporter, re: Node, im: Node | None, n: int, inverse: bool, onesided: bool) -> tuple[Node, Node | None]:
    """The DFT of length ``n`` along the last axis as GEMMs with cosine and sine tables (float64
    tables, in the data's dtype): forward e^-i2pi jk/n, inverse e^+i2pi jk/n / n. ``onesided``
    keeps the first n//2 + 1 bins of a forward transform; an inverse one reads such bins (the
    rest mirrored) and gives a real signal, as numpy's irfft."""
    dt = re.dtype
    lead = list(re.shape[:-1])
    rows = product(lead) if lead else 1
    bins = re.shape[-1]

    def table(values: np.ndarray) -> Node:
        return imp.graph.add_constant(values.astype(numpy_dtype(dt)))

    def gemm(x: Node, t: np.ndarray) -> Node:
        flat = reshape(imp, x, [rows, x.shape[-1]])
        return reshape(imp, matmul(imp, flat, table(t)), [*lead, t.shape[1]])

    if inverse and onesided:  # bins k < n//2 + 1 in, n real samples out
        k = np.arange(known_dim(bins))[:, None]
        j = np.arange(n)[None, :]
        weight = np.where((k == 0) | (2 * k == n), 1.0, 2.0) / n
        theta = 2 * np.pi * k * j / n
        out = gemm(re, weight * np.cos(theta))
        if im is not None:
            out = elementwise(imp, "sub", [out, gemm(im, weight * np.sin(theta))], dt)
        return out, None
    j = np.arange(n)[:, None]
    k = np.arange(n // 2 + 1 if onesided else n)[None, :]
    theta = 2 * np.pi * j * k / n
    scale = 1.0 / n if inverse else 1.0
    sign = 1.0 if inverse else -1.0
    cos, sin = np.cos(theta) * scale, np.sin(theta) * scale * sign
    out_re, out_im = gemm(re, cos), gemm(re, sin)
    if im is not None:  # (a + ib)(c + id) with c = cos, d = sign * sin
        out_re = elementwise(imp, "sub", [out_re, gemm(im, sin)], dt)
        out_im = elementwise(imp, "add", [out_im, gemm(im, cos)], dt)
    return out_re, out_im


def _complex_parts(imp: OnnxImporter, x: Node) -> tuple[Node, Node | None]:
    """A [..., 1] real or [..., 2] complex tensor as its real and imaginary parts ([...])."""
    width = known_dim(x.shape[-1])
    if width not in (1, 2):
        raise LoweringError(f"a signal's last dim must be 1 (real) or 2 (complex), not {x.shape[-1]}")
    last = x.tensor_type.rank - 1
    part = [reshape(imp, imp.graph.add("slice", (x, imp.index(i), imp.index(i + 1)), {"axis": last, "step": 1}), list(x.shape[:-1])) for i in range(width)]
    return part[0], part[1] if width == 2 else None


def _as_complex(imp: OnnxImporter, re: Node, im: Node | None) -> Node:
    parts = [reshape(imp, v, [*re.shape, 1]) for v in ((re,) if im is None else (re, im))]
    return parts[0] if im is None else imp.graph.add("concat", parts, {"axis": re.tensor_type.rank})


@onnx_op("DFT")
def _dft(imp: OnnxImporter, node: Any, x: Any, dft_length: Any = None, axis_in: Any = None, axis: int = 1, inverse: int = 0, onesided: int = 0) -> Node:
    x = imp.tensor(x)
    signal_rank = x.tensor_type.rank - 1
    a = _ints(axis_in, "DFT's axis")[0] if axis_in is not None else (axis if imp.opset < 20 else -2)
    a = normalize_axis(a, x.tensor_type.rank, "DFT")
    if a == signal_rank:
        raise LoweringError("DFT along the real/imaginary axis")
    size = known_dim(x.shape[a])
    if size is None:
        raise LoweringError(f"DFT along axis {a}, whose length ({x.shape[a]}) is not known when the model is compiled")
    n = _ints(dft_length, "DFT's dft_length")[0] if dft_length is not None else (2 * (size - 1) if inverse and onesided else size)
    re, im = _complex_parts(imp, x)
    perm = [i for i in range(signal_rank) if i != a] + [a]
    back = [perm.index(i) for i in range(signal_rank)]
    re = imp.graph.add("transpose", (re,), {"perm": tuple(perm)})
    im = imp.graph.add("transpose", (im,), {"perm": tuple(perm)}) if im is not None else None
    if not (inverse and onesided) and size != n:  # numpy's n: cut or zero-pad the signal
        re, im = (None if v is None else _fit_last(imp, v, n) for v in (re, im))
    elif inverse and onesided and size != n // 2 + 1:
        re, im = (None if v is None else _fit_last(imp, v, n // 2 + 1) for v in (re, im))
    out_re, out_im = _dft_last(imp, re, im, n, bool(inverse), bool(onesided))
    out_re = imp.graph.add("transpose", (out_re,), {"perm": tuple(back)})
    out_im = imp.graph.add("transpose", (out_im,), {"perm": tuple(back)}) if out_im is not None else None
    return _as_complex(imp, out_re, out_im)


def _fit_last(imp: OnnxImporter, v: Node, n: int) -> Node:
    have = known_dim(v.shape[-1])
    last = v.tensor_type.rank - 1
    if have > n:
        return imp.graph.add("slice", (v, imp.index(0), imp.index(n)), {"axis": last, "step": 1})
    high = [0] * v.tensor_type.rank
    high[-1] = n - have
    return imp.graph.add("pad", (v,), {"low": (0,) * v.tensor_type.rank, "high": tuple(high), "value": 0.0})


@onnx_op("STFT")
def _stft(imp: OnnxImporter, node: Any, signal: Any, frame_step: Any, window: Any = None, frame_length: Any = None, onesided: int = 1) -> Node:
    """Frames of ``frame_length`` every ``frame_step`` samples (a gather with a constant index
    table), windowed, each transformed: [batch, frames, bins, 2]."""
    x = imp.tensor(signal)
    step = _ints(frame_step, "STFT's frame_step")[0]
    win = imp.tensor(window) if window is not None else None
    length = _ints(frame_length, "STFT's frame_length")[0] if frame_length is not None else (known_dim(win.shape[0]) if win is not None else None)
    total = known_dim(x.shape[1])
    if length is None or total is None:
        raise LoweringError("STFT needs a frame length and a signal length known when the model is compiled")
    frames = (total - length) // step + 1
    re, im = _complex_parts(imp, x)
    starts = np.arange(frames)[:, None] * step + np.arange(length)[None, :]
    index = imp.graph.add_constant(starts.reshape(-1).astype(np.int64))
    batch = re.shape[0]
    re, im = (None if v is None else reshape(imp, imp.graph.add("index_select", (v, index), {"axis": 1}), [batch, frames, length]) for v in (re, im))
    if win is not None:
        re, im = (None if v is None else elementwise(imp, "mul", [v, convert(imp, win, v.dtype)], v.dtype) for v in (re, im))
    out_re, out_im = _dft_last(imp, re, im, length, False, bool(onesided) and im is None)
    return _as_complex(imp, out_re, out_im)


@onnx_op("HannWindow", "HammingWindow", "BlackmanWindow")
def _window(imp: OnnxImporter, node: Any, size: Any, output_datatype: int = 1, periodic: int = 1) -> np.ndarray:
    """The window for a size known when the model is compiled (a constant or the caller's value),
    computed as ONNX defines it: n over N (periodic) or N - 1 (symmetric)."""
    n = _ints(size, f"{node.op_type}'s size")[0]
    out = ELEM_TYPES.get(output_datatype)
    if out is None or out == "bf16":
        raise LoweringError(f"{node.op_type} to element type {output_datatype}")
    k = np.arange(n, dtype=np.float64)
    span = n if periodic else n - 1
    if node.op_type == "HannWindow":
        w = np.sin(k * np.pi / span) ** 2
    elif node.op_type == "HammingWindow":
        w = 25.0 / 46.0 - np.cos(k * np.pi * 2 / span) * (1 - 25.0 / 46.0)
    else:
        w = 0.42 - 0.5 * np.cos(k * np.pi * 2 / span) + 0.08 * np.cos(k * np.pi * 4 / span)
    return w.astype(numpy_dtype(out))
