"""Resize/Upsample: nearest, linear and cubic, every coordinate mode."""

from __future__ import annotations

import functools
import itertools
from typing import Any

import numpy as np

from disc.frontends.arrays import NeedsValue
from disc.frontends.arrays import known as _known
from disc.frontends.onnx.importer import OnnxImporter, ShapeValue
from disc.frontends.onnx.ops import onnx_op
from disc.frontends.onnx.ops.common import known_dim
from disc.ir.builder import (
    LoweringError,
    arithmetic,
    convert,
    dim_value,
    elementwise,
    reshape,
    scalar,
    select,
)
from disc.ir.graph import Node
from disc.ir.registry import normalize_axis
from disc.ir.types import FLOAT_DTYPES
from disc.shape.expr import DimLike, as_expr, product

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

    # Sizes computed from the input's dims (torch.export's interpolate to a feature map's side)
    # stay symbolic: each axis's scale is then out / in, computed when the program runs.
    size_dims = list(sizes.dims) if isinstance(sizes, ShapeValue) and _known(sizes) is None else None
    scale_list = known_floats(scales, "scales")
    size_list = known_floats(sizes, "sizes") if size_dims is None else None
    if (scale_list is None) == (size_list is None and size_dims is None):
        raise LoweringError("Resize takes exactly one of scales and sizes")
    ins = [x.shape[a] for a in chosen]
    if size_dims is not None and keep_aspect_ratio_policy != "stretch":
        raise LoweringError(f"Resize keep_aspect_ratio_policy={keep_aspect_ratio_policy!r} with sizes {size_dims} not known when the model is compiled")
    if scale_list is None:  # sizes given
        outs: list[DimLike] = size_dims if size_dims is not None else [int(v) for v in size_list or []]
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
    if antialias and mode != "nearest":  # the filter widens with the downsampling: its scale must be known
        for j, (r, n_in, n_out) in enumerate(zip(ratios, ins, outs)):
            if r is None:
                known_in = known_dim(n_in)
                if known_in is None or not isinstance(n_out, int):
                    raise LoweringError(f"Resize with antialias to sizes {outs} of dims {ins} not known when the model is compiled (the filter's width depends on the scale)")
                ratios[j] = n_out / known_in

    out = x
    for j in reversed(range(len(chosen))):
        a, n_in, n_out, ratio = chosen[j], ins[j], outs[j], ratios[j]
        crop = (roi_list[j], roi_list[j + len(chosen)]) if roi_list is not None else None
        if crop is None and ratio in (None, 1.0) and imp.graph.constraints.prove_equal(n_in, n_out):
            continue  # the identity on this axis, in every coordinate mode but cropping
        wide = bool(antialias) and mode != "nearest" and ratio is not None and ratio < 1
        out = _resize_axis(imp, out, a, n_in, n_out, ratio, mode, coordinate_transformation_mode, nearest_mode, cubic_coeff_a, bool(exclude_outside), extrapolation_value, crop, wide)
    return out


def _resize_axis(
    imp: OnnxImporter, x: Node, axis: int, n_in: DimLike, n_out: DimLike, ratio: float | None, mode: str, coords: str, nearest_mode: str, a: float, exclude_outside: bool,
    extrapolation: float, crop: tuple[float, float] | None, antialias: bool = False,
) -> Node:
    def f64(v: Any) -> Node:
        return scalar(imp, v, "f64") if isinstance(v, float) else dim_value(imp, v, "f64")

    op = arithmetic(imp, "f64")

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

    last = dim_value(imp, as_expr(n_in) - 1)

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
        if antialias:
            indices, weights = _antialias_taps(imp, pos, floor, float(ratio), mode, a)  # type: ignore[arg-type]
        else:
            r = op("sub", pos, floor)
            if mode == "linear":
                offsets, weights = [0, 1], [op("sub", 1.0, r), r]
            else:
                offsets = [-1, 0, 1, 2]
                weights = [_keys_cubic(imp, op("add", r, 1.0), a), _keys_cubic(imp, r, a), _keys_cubic(imp, op("sub", 1.0, r), a), _keys_cubic(imp, op("sub", 2.0, r), a)]
            base = convert(imp, floor, "i64")
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


def _antialias_taps(imp: OnnxImporter, pos: Node, floor: Node, scale: float, mode: str, a: float) -> tuple[list[Node], list[Node]]:
    """Downsampling by ``scale`` < 1 with antialias: the linear (triangle) or cubic kernel
    stretched by 1/scale, so each output averages n = 2 - 2 * start inputs (start = floor(-1/scale)
    + 1, or -2/scale for cubic), weights normalised to sum to 1. The taps are the n inputs nearest
    the source coordinate, ties to the lower index, as ONNX's reference takes them."""

    op = arithmetic(imp, "f64")

    start = int(np.floor((-1.0 if mode == "linear" else -2.0) / scale) + 1)
    n = 2 - 2 * start
    # The kernel's phase: pos's fraction, or 1 at an integer (the pixel on the left, as the reference).
    phase = select(imp, op("eq", pos, floor), 1.0, op("sub", pos, floor), "f64")
    raw = []
    for i in range(start, start + n):
        t = op("abs", op("mul", op("sub", float(i), phase), scale))
        if mode == "linear":
            raw.append(op("maximum", op("sub", 1.0, t), 0.0))
        else:
            raw.append(select(imp, op("lt", t, 2.0), _keys_cubic(imp, t, a), 0.0, "f64"))
    total = functools.reduce(lambda u, v: op("add", u, v), raw)
    weights = [op("div", w, total) for w in raw]
    pad = (n + 1) // 2
    shifted = op("add", pos, float(pad))
    p = imp.graph.add("floor", (shifted,))
    frac = op("sub", shifted, p)
    if n % 2 == 0:  # window centres at half-integers: at an integer, the lower one
        offset = select(imp, op("eq", frac, 0.0), float(-(n // 2)), float(-(n // 2) + 1), "f64")
    else:
        offset = select(imp, op("le", frac, 0.5), float(-((n - 1) // 2)), float(-((n - 1) // 2) + 1), "f64")
    first = convert(imp, op("sub", op("add", p, offset), float(pad)), "i64")
    return [elementwise(imp, "add", [first, k], "i64") for k in range(n)], weights


_GRID_MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic", "cubic": "cubic"}


@onnx_op("GridSample")
def _grid_sample(imp: OnnxImporter, node: Any, x: Any, grid: Any, mode: str = "linear", padding_mode: str = "zeros", align_corners: int = 0) -> Node:
    """Samples of ``x`` [N, C, D1..Dk] at the normalised points of ``grid`` [N, O1..Ok, k]
    (their last index runs over the spatial dims in reverse: x, y, z). Each point's coordinates
    are denormalised, fixed up where they leave the image (border: clamped; reflection:
    reflected), and the taps of the mode (nearest 1, linear 2, cubic 4 per dim) gathered from
    the flattened image; a tap outside reads 0, the border pixel or its reflection."""
    data, points = imp.tensor(x), imp.tensor(grid)
    if _GRID_MODES.get(mode) is None or padding_mode not in ("zeros", "border", "reflection"):
        raise LoweringError(f"GridSample mode {mode!r} / padding_mode {padding_mode!r}")
    mode = _GRID_MODES[mode]
    k = data.tensor_type.rank - 2
    if k < 1 or points.tensor_type.rank != k + 2 or points.shape[-1] != k or data.dtype not in FLOAT_DTYPES:
        raise LoweringError(f"GridSample of a {data.tensor_type} image at {points.tensor_type} points")
    n, c, dims = data.shape[0], data.shape[1], list(data.shape[2:])
    out_dims = list(points.shape[1:-1])
    flat_out = product(out_dims)

    def op(name: str, *xs: Any, dtype: str = "f64") -> Node:
        return elementwise(imp, name, list(xs), dtype)

    def size_f64(d: DimLike) -> Node:
        return dim_value(imp, d, "f64")

    def reflect(v: Node, lo: Node, hi: Node) -> Node:
        # Reflect off the nearer border until inside: an even number of bounces lands at the near
        # border plus the remainder, an odd one at the far border minus it.
        span = op("sub", hi, lo)
        below = op("lt", v, lo, dtype="f64")
        dist = select(imp, below, op("sub", lo, v), op("sub", v, hi), "f64")
        bounces = imp.graph.add("floor", (op("div", dist, span),))
        rest = op("sub", dist, op("mul", bounces, span))
        odd = op("eq", op("sub", bounces, op("mul", imp.graph.add("floor", (op("div", bounces, 2.0),)), 2.0)), 1.0)
        near, far = select(imp, below, lo, hi, "f64"), select(imp, below, hi, lo, "f64")
        toward_near = select(imp, below, 1.0, -1.0, "f64")
        inside = op("add", select(imp, odd, far, near, "f64"), op("mul", select(imp, odd, op("neg", toward_near), toward_near, "f64"), rest))
        inside = select(imp, op("eq", span, 0.0), lo, inside, "f64")  # a one-pixel image with aligned corners
        return select(imp, outside(v, lo, hi), inside, v, "f64")

    def outside(v: Node, lo: Node, hi: Node) -> Node:
        return op("logical_or", op("lt", v, lo), op("gt", v, hi), dtype="f64")

    # Per spatial dim: the coordinate of every output point ([N, O]) and its valid range.
    coords, borders = [], []
    for axis, d in enumerate(dims):
        column = imp.graph.add("slice", (points, imp.index(k - 1 - axis), imp.index(k - axis)), {"axis": k + 1, "step": 1})
        g = convert(imp, reshape(imp, column, [n, flat_out]), "f64")
        size = size_f64(d)
        if align_corners:
            v = op("mul", op("div", op("add", g, 1.0), 2.0), op("sub", size, 1.0))
            lo, hi = scalar(imp, 0.0, "f64"), op("sub", size, 1.0)
        else:
            v = op("div", op("sub", op("mul", op("add", g, 1.0), size), 1.0), 2.0)
            lo, hi = scalar(imp, -0.5, "f64"), op("sub", size, 0.5)
        if mode == "nearest":
            v = imp.graph.add("round", (v,))
        if padding_mode == "border":  # only a point outside moves: with unaligned corners one in [-0.5, 0) stays
            v = select(imp, outside(v, lo, hi), op("minimum", op("maximum", v, 0.0), op("sub", size, 1.0)), v, "f64")
        elif padding_mode == "reflection":
            v = reflect(v, lo, hi)
        coords.append(v)
        borders.append((lo, hi, size))

    def tap_index(i: Node, axis: int) -> tuple[Node, Node | None]:
        """The pixel index a tap reads along ``axis`` (f64 in, i64 out) and, for zero padding,
        whether it is inside."""
        lo, hi, size = borders[axis]
        last = op("sub", size, 1.0)
        if padding_mode == "zeros":
            inside = op("logical_and", op("ge", i, 0.0), op("le", i, last), dtype="f64")
            return convert(imp, op("minimum", op("maximum", i, 0.0), last), "i64"), inside
        if padding_mode == "reflection":
            i = op("maximum", imp.graph.add("floor", (reflect(i, lo, hi),)), 0.0)  # int() of a value >= -0.5
        return convert(imp, op("minimum", op("maximum", i, 0.0), last), "i64"), None

    if mode == "nearest":  # one tap, the coordinate truncated as C's int() does
        taps = [[(_trunc(imp, v), None)] for v in coords]
    else:
        taps = []
        for v in coords:
            floor = imp.graph.add("floor", (v,))
            t = op("sub", v, floor)
            if mode == "linear":
                offsets, weights = [0.0, 1.0], [op("sub", 1.0, t), t]
            else:
                offsets, weights = [-1.0, 0.0, 1.0, 2.0], [_keys_cubic(imp, op("add", t, 1.0)), _keys_cubic(imp, t), _keys_cubic(imp, op("sub", 1.0, t)), _keys_cubic(imp, op("sub", 2.0, t))]
            taps.append([(op("add", floor, o), w) for o, w in zip(offsets, weights)])

    image = reshape(imp, data, [n, c, product(dims)])
    total: Node | None = None
    for combo in itertools.product(*taps):
        flat: Node | None = None
        weight: Node | None = None
        valid: Node | None = None
        for axis, (i, w) in enumerate(combo):
            index, inside = tap_index(i, axis)
            stride = product(dims[axis + 1 :])
            term = elementwise(imp, "mul", [index, dim_value(imp, stride)], "i64")
            flat = term if flat is None else elementwise(imp, "add", [flat, term], "i64")
            weight = w if weight is None else (weight if w is None else op("mul", weight, w))
            valid = inside if valid is None else (valid if inside is None else op("logical_and", valid, inside, dtype="f64"))
        assert flat is not None
        index3 = imp.graph.add("broadcast_in_dim", (flat, *imp.sizes([n, c, flat_out])), {"dims": (0, 2)})
        pixels = imp.graph.add("gather", (image, index3), {"axis": 2})
        factor = weight
        if valid is not None:
            mask = convert(imp, valid, "f64")
            factor = mask if factor is None else op("mul", factor, mask)
        if factor is not None:
            pixels = elementwise(imp, "mul", [pixels, imp.graph.add("broadcast_in_dim", (convert(imp, factor, data.dtype), *imp.sizes([n, c, flat_out])), {"dims": (0, 2)})], data.dtype)
        total = pixels if total is None else elementwise(imp, "add", [total, pixels], data.dtype)
    assert total is not None
    return reshape(imp, total, [n, c, *out_dims])


def _trunc(imp: OnnxImporter, v: Node) -> Node:
    """Toward zero, as C's int() of a float."""
    floor, ceil = imp.graph.add("floor", (v,)), imp.graph.add("ceil", (v,))
    return select(imp, elementwise(imp, "lt", [v, 0.0], "f64"), ceil, floor, "f64")


def _keys_cubic(imp: OnnxImporter, t: Node, a: float = -0.75) -> Node:
    """Keys' cubic convolution kernel at distance ``t`` (0 <= t <= 2)."""

    op = arithmetic(imp, "f64")

    near = op("add", op("mul", op("mul", op("sub", op("mul", t, a + 2), a + 3), t), t), 1.0)
    far = op("sub", op("mul", op("add", op("mul", op("sub", op("mul", t, a), 5 * a), t), 8 * a), t), 4 * a)
    return select(imp, op("le", t, 1.0), near, far, "f64")


@onnx_op("RoiAlign")
def _roi_align(
    imp: OnnxImporter, node: Any, x: Any, rois: Any, batch_indices: Any, coordinate_transformation_mode: str = "half_pixel", mode: str = "avg",
    output_height: int = 1, output_width: int = 1, sampling_ratio: int = 0, spatial_scale: float = 1.0,
) -> Node:
    """Each region's [output_height, output_width] bins, each the average (or max) of a fixed
    sampling_ratio x sampling_ratio grid of bilinear samples of its image, as ONNX's reference
    computes them: sample positions in float64, a sample more than one pixel outside the image
    counts as 0, one inside the last pixel row or column reads that row or column."""
    if mode not in ("avg", "max") or coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise LoweringError(f"RoiAlign: mode {mode!r} and coordinate_transformation_mode {coordinate_transformation_mode!r}; ONNX takes avg/max and half_pixel/output_half_pixel")
    if sampling_ratio <= 0:
        raise LoweringError("RoiAlign with an adaptive sampling grid (sampling_ratio 0: a grid per region's size, which disc's fixed shapes cannot hold); give sampling_ratio > 0")
    data, boxes = imp.tensor(x), convert(imp, imp.tensor(rois), "f64")
    n, channels, height, width = data.shape
    regions = boxes.shape[0]
    half_pixel = coordinate_transformation_mode == "half_pixel"
    grid = int(sampling_ratio)

    def corner(k: int) -> Node:
        picked = imp.graph.add("slice", (boxes, imp.index(k), imp.index(k + 1)), {"axis": 1, "step": 1})
        return elementwise(imp, "sub", [elementwise(imp, "mul", [picked, float(spatial_scale)], "f64"), 0.5 if half_pixel else 0.0], "f64")  # [R, 1]

    def samples(start: Node, end: Node, bins: int, size: DimLike) -> tuple[list[Node], list[Node], Node]:
        """Along one axis: the low and high pixel of each sample ([R, bins * grid], i64), their
        weights, and whether the sample lies within a pixel of the image."""
        extent = elementwise(imp, "sub", [end, start], "f64")
        if not half_pixel:
            extent = elementwise(imp, "maximum", [extent, 1.0], "f64")
        step = elementwise(imp, "div", [extent, float(bins)], "f64")
        index = np.arange(bins * grid)
        whole, part = (imp.graph.add_constant(v.astype(np.float64)) for v in (index // grid, index % grid + 0.5))
        at = elementwise(imp, "add", [elementwise(imp, "add", [start, elementwise(imp, "mul", [step, whole], "f64")], "f64"), elementwise(imp, "div", [elementwise(imp, "mul", [step, part], "f64"), float(grid)], "f64")], "f64")
        limit = convert(imp, imp.shape_tensor([size]), "f64")
        inside = elementwise(imp, "logical_and", [elementwise(imp, "ge", [at, -1.0], "f64"), elementwise(imp, "le", [at, limit], "f64")], "i1")
        at = elementwise(imp, "maximum", [at, 0.0], "f64")
        last = elementwise(imp, "sub", [limit, 1.0], "f64")
        low = imp.graph.add("floor", (at,))
        edge = elementwise(imp, "ge", [low, last], "f64")
        low = select(imp, edge, last, low, "f64")
        at = select(imp, edge, low, at, "f64")
        high = select(imp, edge, low, elementwise(imp, "add", [low, 1.0], "f64"), "f64")
        frac = elementwise(imp, "sub", [at, low], "f64")
        return [convert(imp, low, "i64"), convert(imp, high, "i64")], [elementwise(imp, "sub", [1.0, frac], "f64"), frac], inside

    y_at, y_w, y_in = samples(corner(1), corner(3), int(output_height), height)
    x_at, x_w, x_in = samples(corner(0), corner(2), int(output_width), width)
    py, px = int(output_height) * grid, int(output_width) * grid
    spots = [regions, py, px]

    def outer(a: Node, b: Node, op: str, dtype: str) -> Node:  # [R, py] op [R, px] -> [R, py, px]
        wide_a = imp.graph.add("broadcast_in_dim", (a, *imp.sizes(spots)), {"dims": (0, 1)})
        wide_b = imp.graph.add("broadcast_in_dim", (b, *imp.sizes(spots)), {"dims": (0, 2)})
        return elementwise(imp, op, [wide_a, wide_b], dtype)

    inside = outer(y_in, x_in, "logical_and", "i1")
    images = imp.graph.add("index_select", (reshape(imp, data, [n, channels, as_expr(height) * width]), convert(imp, imp.tensor(batch_indices), "i64")), {"axis": 0})
    width_t = imp.shape_tensor([width])
    taps = []
    for (yi, wy), (xi, wx) in itertools.product(zip(y_at, y_w), zip(x_at, x_w)):
        flat = outer(elementwise(imp, "mul", [yi, width_t], "i64"), xi, "add", "i64")
        weight = select(imp, inside, outer(wy, wx, "mul", "f64"), 0.0, "f64")
        flat = select(imp, inside, flat, 0, "i64")
        index = imp.graph.add("broadcast_in_dim", (reshape(imp, flat, [regions, py * px]), *imp.sizes([regions, channels, py * px])), {"dims": (0, 2)})
        value = convert(imp, imp.graph.add("gather", (images, index), {"axis": 2}), "f64")
        taps.append(elementwise(imp, "mul", [value, imp.graph.add("broadcast_in_dim", (reshape(imp, weight, [regions, py * px]), *imp.sizes([regions, channels, py * px])), {"dims": (0, 2)})], "f64"))
    if mode == "avg":
        per_sample = functools.reduce(lambda a, b: elementwise(imp, "add", [a, b], "f64"), taps)
    else:
        per_sample = functools.reduce(lambda a, b: elementwise(imp, "maximum", [a, b], "f64"), taps)
    bins = reshape(imp, per_sample, [regions, channels, int(output_height), grid, int(output_width), grid])
    if mode == "avg":
        out = elementwise(imp, "div", [imp.graph.add("reduce", (bins,), {"dims": (3, 5), "kind": "sum", "keepdim": False}), float(grid * grid)], "f64")
    else:
        out = imp.graph.add("reduce", (bins,), {"dims": (3, 5), "kind": "max", "keepdim": False})
    return convert(imp, out, data.dtype)
