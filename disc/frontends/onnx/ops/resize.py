"""Resize/Upsample: nearest, linear and cubic, every coordinate mode."""

from __future__ import annotations

from typing import Any

import numpy as np

from disc.frontends.arrays import NeedsValue
from disc.frontends.arrays import known as _known
from disc.frontends.onnx.importer import OnnxImporter
from disc.frontends.onnx.ops import onnx_op
from disc.frontends.onnx.ops.common import known_dim
from disc.ir.builder import (
    LoweringError,
    convert,
    elementwise,
    scalar,
    select,
)
from disc.ir.graph import Node
from disc.ir.registry import normalize_axis
from disc.ir.types import FLOAT_DTYPES
from disc.shape.expr import DimLike, as_expr

_RESIZE_MODES = {"nearest", "linear", "cubic"}
_COORDINATE_MODES = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"}
_NEAREST_MODES = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}


def _resized_dim(node: Any, size: DimLike, scale: float) -> DimLike:
    """floor(size * scale), as ONNX computes an output size from a scale."""
    n = known_dim(size)
    if n is not None:
        return int(scale * n)
    if float(scale).is_integer():
        return as_expr(size) * int(scale)
    if (1.0 / scale).is_integer():
        return as_expr(size) // int(1.0 / scale)
    raise LoweringError(f"{node.op_type}: scale {scale} of a dim ({size}) not known when the model is compiled (only whole multiples and 1/k scales stay symbolic)")


@onnx_op("Resize", "Upsample")
def _resize(
    imp: OnnxImporter, node: Any, x: Any, roi: Any = None, scales: Any = None, sizes: Any = None, mode: str = "nearest", coordinate_transformation_mode: str = "half_pixel",
    nearest_mode: str = "round_prefer_floor", cubic_coeff_a: float = -0.75, exclude_outside: int = 0, extrapolation_value: float = 0.0, antialias: int = 0,
    axes: Any = None, keep_aspect_ratio_policy: str = "stretch",
) -> Node:
    """Resize as one pass per resized axis, innermost first (ONNX's reference recursion): each
    output position's source coordinate (a float64 vector over the axis), then the nearest
    source element, or 2 (linear) or 4 (cubic) neighbours clamped to the edge, gathered and
    weighted. tf_crop_and_resize puts ``extrapolation_value`` where the coordinate leaves the input."""
    if node.op_type == "Upsample":  # (opset 9: Upsample(X, scales), asymmetric coordinates)
        roi, scales, coordinate_transformation_mode = None, roi, "asymmetric"
        mode = {"bilinear": "linear"}.get(mode, mode)
    for what, value, allowed in (("mode", mode, _RESIZE_MODES), ("coordinate_transformation_mode", coordinate_transformation_mode, _COORDINATE_MODES), ("nearest_mode", nearest_mode, _NEAREST_MODES)):
        if value not in allowed:
            raise LoweringError(f"Resize {what}={value!r} (ONNX allows {', '.join(sorted(allowed))})")
    if imp.opset < 11 and node.op_type == "Resize":
        coordinate_transformation_mode = "asymmetric"  # opset 10's Resize(X, scales)
        scales, roi = roi, None
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    chosen = [normalize_axis(a, rank, "Resize") for a in axes] if axes is not None else list(range(rank))
    if mode != "nearest" and x.dtype not in FLOAT_DTYPES:
        raise LoweringError(f"Resize mode {mode!r} on {x.dtype} data (disc interpolates floats)")

    def known_floats(v: Any, what: str) -> list[float] | None:
        if v is None:
            return None
        k = _known(v)
        if k is None and isinstance(v, Node) and v.op == "input":
            raise NeedsValue(f"Resize's {what}", v.name)
        if k is None:
            raise LoweringError(f"Resize's {what} must be known when the model is compiled (a constant), not computed at run time")
        return [float(f) for f in np.asarray(k, np.float64).reshape(-1)] or None

    scale_list, size_list = known_floats(scales, "scales"), known_floats(sizes, "sizes")
    if (scale_list is None) == (size_list is None):
        raise LoweringError("Resize takes exactly one of scales and sizes")
    ins = [x.shape[a] for a in chosen]
    if size_list is not None:
        outs: list[DimLike] = [int(v) for v in size_list]
        if keep_aspect_ratio_policy == "stretch":
            ratios: list[Any] = [None] * len(chosen)  # out / in, computed where the dims are known
        else:
            known_in = [known_dim(d) for d in ins]
            if None in known_in:
                raise LoweringError(f"Resize keep_aspect_ratio_policy={keep_aspect_ratio_policy!r} on dims {ins} not known when the model is compiled")
            picks = [o / i for o, i in zip(outs, known_in)]
            one = min(picks) if keep_aspect_ratio_policy == "not_larger" else max(picks)
            ratios = [one] * len(chosen)
            outs = [int(np.floor(one * i + 0.5)) for i in known_in]
    else:
        ratios = list(scale_list)
        outs = [_resized_dim(node, d, r) for d, r in zip(ins, ratios)]
    if len(outs) != len(chosen):
        raise LoweringError(f"Resize: {len(outs)} scales or sizes for {len(chosen)} axes")
    roi_list = known_floats(roi, "roi") if coordinate_transformation_mode == "tf_crop_and_resize" else None
    if antialias and mode != "nearest" and any(r is None or r < 1 for r in ratios):
        raise LoweringError("Resize with antialias when downsampling")

    out = x
    for j in reversed(range(len(chosen))):
        a, n_in, n_out, ratio = chosen[j], ins[j], outs[j], ratios[j]
        crop = (roi_list[j], roi_list[j + len(chosen)]) if roi_list is not None else None
        if crop is None and ratio in (None, 1.0) and imp.graph.constraints.prove_equal(n_in, n_out):
            continue  # the identity on this axis, in every coordinate mode but cropping
        out = _resize_axis(imp, out, a, n_in, n_out, ratio, mode, coordinate_transformation_mode, nearest_mode, cubic_coeff_a, bool(exclude_outside), extrapolation_value, crop)
    return out


def _resize_axis(imp: OnnxImporter, x: Node, axis: int, n_in: DimLike, n_out: DimLike, ratio: float | None, mode: str, coords: str, nearest_mode: str, a: float, exclude_outside: bool, extrapolation: float, crop: tuple[float, float] | None) -> Node:
    def f64(v: Any) -> Node:
        return convert(imp, imp.graph.add("index_to_tensor", (imp.index(v),), {"dtype": "i64"}), "f64") if not isinstance(v, float) else scalar(imp, v, "f64")

    def op(name: str, *xs: Any) -> Node:
        return elementwise(imp, name, list(xs), "f64")

    o = convert(imp, imp.graph.add("iota", (imp.index(n_out),), {"dtype": "i64"}), "f64")
    size_in, size_out = f64(n_in), f64(n_out)
    scale = scalar(imp, ratio, "f64") if ratio is not None else op("div", size_out, size_in)
    width = op("mul", scale, size_in)  # the output width as a float (not the integer size)
    centre = op("sub", op("div", op("add", o, 0.5), scale), 0.5)
    if coords == "half_pixel":
        pos = centre
    elif coords == "half_pixel_symmetric":
        half = op("div", size_in, 2.0)
        pos = op("add", op("mul", half, op("sub", 1.0, op("div", size_out, width))), centre)
    elif coords == "pytorch_half_pixel":
        pos = select(imp, op("eq", width, 1.0), -0.5, centre, "f64")
    elif coords == "asymmetric":
        pos = op("div", o, scale)
    elif coords == "align_corners":
        pos = select(imp, op("eq", width, 1.0), 0.0, op("div", op("mul", o, op("sub", size_in, 1.0)), op("sub", width, 1.0)), "f64")
    else:
        start, end = crop
        span = op("sub", size_in, 1.0)
        single = op("add", op("mul", (end - start) / 2, span), op("mul", start, span))
        spread = op("add", op("div", op("mul", op("mul", o, end - start), span), op("sub", width, 1.0)), op("mul", start, span))
        pos = select(imp, op("eq", width, 1.0), single, spread, "f64")

    last = imp.graph.add("index_to_tensor", (imp.index(as_expr(n_in) - 1),), {"dtype": "i64"})

    def clamped(index: Node) -> Node:
        return elementwise(imp, "minimum", [elementwise(imp, "maximum", [index, 0], "i64"), last], "i64")

    def along(v: Node, like: Node) -> Node:
        return imp.graph.add("broadcast_in_dim", (v, *imp.sizes(like.shape)), {"dims": (axis,)})

    floor = imp.graph.add("floor", (pos,))
    if mode == "nearest":
        # An integral coordinate picks itself; otherwise the rounding nearest_mode names.
        rounded = {"round_prefer_floor": lambda: imp.graph.add("ceil", (op("sub", pos, 0.5),)), "round_prefer_ceil": lambda: imp.graph.add("floor", (op("add", pos, 0.5),)), "floor": lambda: floor, "ceil": lambda: imp.graph.add("ceil", (pos,))}[nearest_mode]()
        rounded = select(imp, op("eq", pos, floor), pos, rounded, "f64")
        out = imp.graph.add("index_select", (x, clamped(convert(imp, rounded, "i64"))), {"axis": axis})
    else:
        r = op("sub", pos, floor)
        base = convert(imp, floor, "i64")
        if mode == "linear":
            offsets, weights = [0, 1], [op("sub", 1.0, r), r]
        else:
            def cubic(t: Node) -> Node:  # Keys' kernel at distance t (|t| <= 2)
                near = op("add", op("mul", op("mul", op("sub", op("mul", t, a + 2), a + 3), t), t), 1.0)
                far = op("sub", op("mul", op("add", op("mul", op("sub", op("mul", t, a), 5 * a), t), 8 * a), t), 4 * a)
                return select(imp, op("le", t, 1.0), near, far, "f64")

            offsets = [-1, 0, 1, 2]
            weights = [cubic(op("add", r, 1.0)), cubic(r), cubic(op("sub", 1.0, r)), cubic(op("sub", 2.0, r))]
        indices = [elementwise(imp, "add", [base, k], "i64") for k in offsets]
        if exclude_outside:
            inside = [convert(imp, elementwise(imp, "logical_and", [elementwise(imp, "ge", [i, 0], "i64"), elementwise(imp, "le", [i, last], "i64")], "i1"), "f64") for i in indices]
            weights = [op("mul", w, m) for w, m in zip(weights, inside)]
            total = weights[0]
            for w in weights[1:]:
                total = op("add", total, w)
            weights = [op("div", w, total) for w in weights]
        out = None
        for i, w in zip(indices, weights):
            tap = imp.graph.add("index_select", (x, clamped(i)), {"axis": axis})
            term = elementwise(imp, "mul", [tap, along(convert(imp, w, x.dtype), tap)], x.dtype)
            out = term if out is None else elementwise(imp, "add", [out, term], x.dtype)
    if crop is not None:
        outside = elementwise(imp, "logical_or", [op("lt", pos, 0.0), op("gt", pos, op("sub", size_in, 1.0))], "i1")
        out = select(imp, along(outside, out), extrapolation, out, out.dtype)
    return out
