"""Quantize/dequantize and the integer GEMMs and convolutions (exact in float64)."""

from __future__ import annotations

from typing import Any

from disc.frontends.onnx.importer import ELEM_TYPES, OnnxImporter
from disc.frontends.onnx.ops import OPS, onnx_op
from disc.frontends.onnx.ops.common import matmul
from disc.ir.builder import (
    LoweringError,
    broadcast_to,
    convert,
    elementwise,
    reduce,
    reshape,
    select,
)
from disc.ir.graph import Node
from disc.ir.registry import normalize_axis
from disc.shape.expr import as_expr

_QUANT_RANGES = {"u8": (0, 255), "i8": (-128, 127), "u16": (0, 65535), "i16": (-32768, 32767)}


def _per_axis(imp: OnnxImporter, v: Node, x: Node, axis: int, block_size: int) -> Node:
    """A scale or zero point spread over ``x``: one value (per tensor), one per element of ``axis``,
    or (``block_size`` > 0) one per block of that many elements along ``axis``."""
    rank = x.tensor_type.rank
    if v.tensor_type.rank == 0 or (v.tensor_type.rank == 1 and imp.graph.constraints.prove_is_one(v.shape[0]) and not block_size):
        return broadcast_to(imp, reshape(imp, v, []), x.shape)
    a = normalize_axis(axis, rank, "quantization axis")
    if not block_size:
        return imp.graph.add("broadcast_in_dim", (v, *imp.sizes(x.shape)), {"dims": (a,)})
    blocks = v.shape[a]  # [.., n / block, ..] -> each value repeated block times, cut to n
    wide = imp.graph.add("broadcast_in_dim", (v, *imp.sizes([*v.shape[: a + 1], block_size, *v.shape[a + 1 :]])), {"dims": tuple(i if i <= a else i + 1 for i in range(rank))})
    flat = reshape(imp, wide, [*v.shape[:a], as_expr(blocks) * block_size, *v.shape[a + 1 :]])
    return imp.graph.add("slice", (flat, imp.index(0), imp.index(x.shape[a])), {"axis": a, "step": 1})


def _quantize(imp: OnnxImporter, scaled: Node, zero: Node | None, out: str) -> Node:
    """round-half-even(scaled) + zero, saturated to ``out``'s range."""
    if out not in _QUANT_RANGES:
        raise LoweringError(f"quantization to {out} (disc quantizes to {', '.join(_QUANT_RANGES)})")
    q = convert(imp, imp.graph.add("round", (convert(imp, scaled, "f32"),)), "f32")
    if zero is not None:
        q = elementwise(imp, "add", [q, convert(imp, zero, "f32")], "f32")
    lo, hi = _QUANT_RANGES[out]
    q = elementwise(imp, "minimum", [elementwise(imp, "maximum", [q, float(lo)], "f32"), float(hi)], "f32")
    return convert(imp, q, out)


@onnx_op("QuantizeLinear")
def _quantize_linear(imp: OnnxImporter, node: Any, x: Any, scale: Any, zero_point: Any = None, axis: int = 1, saturate: int = 1, block_size: int = 0, output_dtype: int = 0, precision: int = 0) -> Node:
    x = imp.tensor(x)
    zero = imp.tensor(zero_point) if zero_point is not None else None
    out = zero.dtype if zero is not None else ELEM_TYPES.get(output_dtype, "u8") if output_dtype else "u8"
    if output_dtype and ELEM_TYPES.get(output_dtype) != out:
        raise LoweringError(f"QuantizeLinear to element type {output_dtype}, which disc does not run")
    s = _per_axis(imp, imp.tensor(scale), x, axis, block_size)
    work = ELEM_TYPES.get(precision, x.dtype) if precision else x.dtype
    scaled = elementwise(imp, "div", [convert(imp, x, work), convert(imp, s, work)], work)
    return _quantize(imp, scaled, _per_axis(imp, zero, x, axis, block_size) if zero is not None else None, out)


@onnx_op("DequantizeLinear")
def _dequantize_linear(imp: OnnxImporter, node: Any, x: Any, scale: Any, zero_point: Any = None, axis: int = 1, block_size: int = 0, output_dtype: int = 0) -> Node:
    x, s = imp.tensor(x), imp.tensor(scale)
    if x.dtype not in _QUANT_RANGES and x.dtype != "i32":
        raise LoweringError(f"DequantizeLinear of {x.dtype}")
    d = convert(imp, x, "f32")
    if zero_point is not None:
        d = elementwise(imp, "sub", [d, convert(imp, _per_axis(imp, imp.tensor(zero_point), x, axis, block_size), "f32")], "f32")
    out = ELEM_TYPES.get(output_dtype, s.dtype) if output_dtype else s.dtype
    return convert(imp, elementwise(imp, "mul", [d, convert(imp, _per_axis(imp, s, x, axis, block_size), "f32")], "f32"), out)


@onnx_op("DynamicQuantizeLinear")
def _dynamic_quantize_linear(imp: OnnxImporter, node: Any, x: Any) -> list[Node]:
    """uint8 with the scale and zero point that map [min(x, 0), max(x, 0)] onto [0, 255]."""
    x = imp.tensor(x)
    every = list(range(x.tensor_type.rank))
    hi = elementwise(imp, "maximum", [reshape(imp, reduce(imp, x, every, "max", True), []), 0.0], "f32")
    lo = elementwise(imp, "minimum", [reshape(imp, reduce(imp, x, every, "min", True), []), 0.0], "f32")
    span = select(imp, elementwise(imp, "eq", [hi, lo], "f32"), 1.0, elementwise(imp, "sub", [hi, lo], "f32"), "f32")
    scale = elementwise(imp, "div", [span, 255.0], "f32")
    zero = imp.graph.add("round", (elementwise(imp, "minimum", [elementwise(imp, "maximum", [elementwise(imp, "sub", [0.0, elementwise(imp, "div", [lo, scale], "f32")], "f32"), 0.0], "f32"), 255.0], "f32"),))
    y = _quantize(imp, elementwise(imp, "div", [x, scale], "f32"), zero, "u8")
    return [y, convert(imp, scale, x.dtype), convert(imp, zero, "u8")]


def _centred(imp: OnnxImporter, v: Any, zero: Any, axis_of_zero: int) -> Node:
    """An integer operand less its zero point (per tensor, or one per element of ``axis_of_zero``), as float64 (exact)."""
    t = convert(imp, imp.tensor(v), "f64")
    if zero is None:
        return t
    return elementwise(imp, "sub", [t, convert(imp, _per_axis(imp, imp.tensor(zero), t, axis_of_zero, 0), "f64")], "f64")


@onnx_op("MatMulInteger")
def _matmul_integer(imp: OnnxImporter, node: Any, a: Any, b: Any, a_zero_point: Any = None, b_zero_point: Any = None) -> Node:
    """(a - a_zero) @ (b - b_zero) in int32, computed in float64 (exact for 8-bit operands)."""
    return convert(imp, matmul(imp, _centred(imp, a, a_zero_point, -2), _centred(imp, b, b_zero_point, -1)), "i32")


@onnx_op("QLinearMatMul")
def _qlinear_matmul(imp: OnnxImporter, node: Any, a: Any, a_scale: Any, a_zero: Any, b: Any, b_scale: Any, b_zero: Any, y_scale: Any, y_zero: Any = None) -> Node:
    """The integer product, as MatMulInteger, times a_scale * b_scale / y_scale, requantized."""
    product_ = matmul(imp, _centred(imp, a, a_zero, -2), _centred(imp, b, b_zero, -1))
    ratio = elementwise(imp, "div", [elementwise(imp, "mul", [imp.tensor(a_scale), imp.tensor(b_scale)], imp.tensor(a_scale).dtype), imp.tensor(y_scale)], imp.tensor(a_scale).dtype)
    scaled = elementwise(imp, "mul", [product_, convert(imp, ratio, "f64")], "f64")
    out = imp.tensor(y_zero).dtype if y_zero is not None else imp.tensor(a).dtype
    return _quantize(imp, scaled, imp.tensor(y_zero) if y_zero is not None else None, out)


def _centred_conv(imp: OnnxImporter, node: Any, x: Any, x_zero: Any, w: Any, w_zero: Any, attrs: dict) -> Node:
    """The convolution of (x - x_zero) by (w - w_zero, one per output channel), in float64 (exact)."""
    return OPS["Conv"](imp, node, _centred(imp, x, x_zero, 0), _centred(imp, w, w_zero, 0), None, **attrs)


@onnx_op("ConvInteger")
def _conv_integer(imp: OnnxImporter, node: Any, x: Any, w: Any, x_zero_point: Any = None, w_zero_point: Any = None, **attrs: Any) -> Node:
    return convert(imp, _centred_conv(imp, node, x, x_zero_point, w, w_zero_point, attrs), "i32")


@onnx_op("QLinearConv")
def _qlinear_conv(imp: OnnxImporter, node: Any, x: Any, x_scale: Any, x_zero: Any, w: Any, w_scale: Any, w_zero: Any, y_scale: Any, y_zero: Any = None, b: Any = None, **attrs: Any) -> Node:
    """The integer convolution plus the int32 bias, times x_scale * w_scale (per output channel) / y_scale, requantized."""
    acc = _centred_conv(imp, node, x, x_zero, w, w_zero, attrs)
    if b is not None:
        acc = elementwise(imp, "add", [acc, imp.graph.add("broadcast_in_dim", (convert(imp, imp.tensor(b), "f64"), *imp.sizes(acc.shape)), {"dims": (1,)})], "f64")
    ws = _per_axis(imp, convert(imp, imp.tensor(w_scale), "f64"), acc, 1, 0)
    ratio = elementwise(imp, "div", [elementwise(imp, "mul", [ws, convert(imp, imp.tensor(x_scale), "f64")], "f64"), convert(imp, imp.tensor(y_scale), "f64")], "f64")
    out = imp.tensor(y_zero).dtype if y_zero is not None else imp.tensor(x).dtype
    return _quantize(imp, elementwise(imp, "mul", [acc, ratio], "f64"), imp.tensor(y_zero) if y_zero is not None else None, out)
