"""Convolution, transposed convolution and pooling (explicit and SAME padding)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from disc.frontends.arrays import known_ints, same_padding
from disc.frontends.onnx.importer import OnnxImporter
from disc.frontends.onnx.ops import onnx_op
from disc.frontends.onnx.ops.common import known_dim
from disc.ir.builder import (
    LoweringError,
    arithmetic,
    batched_matmul,
    convert,
    elementwise,
    mean,
    positions,
    reduce,
    reshape,
    select,
)
from disc.ir.graph import Node
from disc.ir.types import numpy_dtype
from disc.shape.expr import DimLike, as_expr


# -- convolution -----------------------------------------------------------------------------------------
def _explicit_pads(imp: OnnxImporter, node: Any, spatial: Sequence[DimLike], kernel: Sequence[int], strides: Any, dilations: Any, pads: Any, auto_pad: str) -> list[int]:
    """The begin and end pads (ONNX's ``pads`` layout) that ``auto_pad`` asks for: SAME's odd pad
    at the end (SAME_UPPER) or the beginning (SAME_LOWER); with a stride > 1 the dim must be known."""
    n = len(kernel)
    if auto_pad in ("NOTSET", "VALID"):
        return list(pads) if pads is not None and auto_pad == "NOTSET" else [0] * (2 * n)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise LoweringError(f"{node.op_type} with auto_pad={auto_pad!r} (ONNX allows NOTSET, VALID, SAME_UPPER, SAME_LOWER)")
    strides, dilations = list(strides or [1] * n), list(dilations or [1] * n)
    low, high = [], []
    for i in range(n):
        amounts = same_padding(spatial[i], kernel[i], strides[i], dilations[i])
        if amounts is None:
            raise LoweringError(f"{node.op_type} with auto_pad={auto_pad} and stride {strides[i]} on spatial dim {i} ({spatial[i]}), which is not known when the model is compiled")
        small, large = amounts
        low.append(small if auto_pad == "SAME_UPPER" else large)
        high.append(large if auto_pad == "SAME_UPPER" else small)
    return low + high


def _with_bias(imp: OnnxImporter, out: Node, b: Any) -> Node:
    """``out`` [N, C, ...] plus the per-channel bias ``b`` (none: ``out`` itself)."""
    if b is None:
        return out
    return imp.graph.add("add", (out, imp.graph.add("broadcast_in_dim", (imp.tensor(b), *imp.sizes(out.shape)), {"dims": (1,)})))


@onnx_op("Conv")
def _conv(imp: OnnxImporter, node: Any, x: Any, w: Any, b: Any = None, dilations: Any = None, group: int = 1, kernel_shape: Any = None, pads: Any = None, strides: Any = None, auto_pad: str = "NOTSET") -> Node:
    x, w = imp.tensor(x), imp.tensor(w)
    n = w.tensor_type.rank - 2
    kernel = [known_dim(d) for d in w.shape[2:]]
    if None in kernel:
        raise LoweringError(f"Conv with a kernel of run-time size {w.shape[2:]}")
    pads = _explicit_pads(imp, node, x.shape[2:], kernel, strides, dilations, pads, auto_pad)
    if pads[:n] != pads[n:]:  # the convolution pads symmetrically: the uneven part goes in a pad first
        extra_low = [max(lo - hi, 0) for lo, hi in zip(pads[:n], pads[n:])]
        extra_high = [max(hi - lo, 0) for lo, hi in zip(pads[:n], pads[n:])]
        x = imp.graph.add("pad", (x,), {"low": (0, 0, *extra_low), "high": (0, 0, *extra_high), "value": 0.0})
        pads = [min(lo, hi) for lo, hi in zip(pads[:n], pads[n:])] * 2
    out = imp.graph.add(
        "convolution",
        (x, w),
        {
            "stride": tuple(strides or [1] * n),
            "padding": tuple(pads[:n]),
            "dilation": tuple(dilations or [1] * n),
            "groups": int(group),
            "transposed": False,
            "output_padding": tuple([0] * n),
        },
    )
    return _with_bias(imp, out, b)


@onnx_op("CausalConvWithState")
def _causal_conv_with_state(imp: OnnxImporter, node: Any, x: Any, w: Any, b: Any = None, past_state: Any = None, activation: str = "none") -> list[Node]:
    """A depthwise convolution over [past state (zeros if absent), input] along the length, with
    no padding, so output position t sees inputs t-k+1..t; then SiLU if asked. The present state
    is the last k-1 positions of that concatenation (the next call's past)."""
    if activation not in ("none", "silu", "swish"):
        raise LoweringError(f"CausalConvWithState: activation {activation!r}; ONNX takes 'none', 'silu' or 'swish'")
    x, w = imp.tensor(x), imp.tensor(w)
    if x.tensor_type.rank != 3 or w.tensor_type.rank != 3:
        raise LoweringError(f"CausalConvWithState: input and weight must be rank 3 (batch, channels, length), got ranks {x.tensor_type.rank} and {w.tensor_type.rank}")
    k, channels = known_dim(w.shape[2]), known_dim(w.shape[0])
    if k is None or channels is None:
        raise LoweringError(f"CausalConvWithState with a weight of run-time shape {w.shape}")
    if past_state is None:
        zero = imp.graph.add_constant(np.array(0, numpy_dtype(x.dtype)))
        past = imp.graph.add("broadcast_in_dim", (zero, *imp.sizes([x.shape[0], x.shape[1], k - 1])), {"dims": ()})
    else:
        past = imp.tensor(past_state)
    padded = imp.graph.add("concat", (past, x), {"axis": 2})
    conv_attrs = {"stride": (1,), "padding": (0,), "dilation": (1,), "groups": channels, "transposed": False, "output_padding": (0,)}
    out = imp.graph.add("convolution", (padded, w), conv_attrs)
    out = _with_bias(imp, out, b)
    if activation != "none":
        out = imp.graph.add("silu", (out,))
    length = padded.shape[2]
    present = imp.graph.add("slice", (padded, imp.index(as_expr(length) - (k - 1)), imp.index(length)), {"axis": 2, "step": 1})
    return [out, present]


@onnx_op("Col2Im")
def _col2im(imp: OnnxImporter, node: Any, x: Any, image_shape: Any, block_shape: Any, dilations: Any = None, pads: Any = None, strides: Any = None) -> Node:
    """[N, C*K, L] columns (K = the block's size, L = the blocks' count) summed back into [N, C,
    *image]: a transposed convolution with groups=C whose kernel puts column channel c*K + k at
    block position k (one-hot), then the padding cut off."""
    data = imp.tensor(x)
    image, block = known_ints(image_shape, "Col2Im's image_shape"), known_ints(block_shape, "Col2Im's block_shape")
    n, size = len(block), int(np.prod(block))
    dil, stride = list(dilations or [1] * n), list(strides or [1] * n)
    pads = list(pads or [0] * (2 * n))
    padded = [image[i] + pads[i] + pads[n + i] for i in range(n)]
    blocks = [(padded[i] - dil[i] * (block[i] - 1) - 1) // stride[i] + 1 for i in range(n)]
    columns = known_dim(data.shape[1])
    if data.tensor_type.rank != 3 or columns is None or columns % size or min(blocks) < 1:
        raise LoweringError(f"Col2Im: input {data.shape} is not [N, C*{size}, L] with a known C, or no {block} block fits the padded image {padded}")
    channels = columns // size
    imp.graph.constraints.assume_equal(data.shape[2], int(np.prod(blocks)), f"Col2Im: input dim 2 must be the number of blocks ({' * '.join(map(str, blocks))})")
    grid = reshape(imp, data, [data.shape[0], columns, *blocks])
    one_hot = np.zeros((columns, 1, size), numpy_dtype(data.dtype))
    one_hot[np.arange(columns), 0, np.arange(columns) % size] = 1
    attrs = {"stride": tuple(stride), "padding": (0,) * n, "dilation": tuple(dil), "groups": channels, "transposed": True, "output_padding": (0,) * n}
    out = imp.graph.add("convolution", (grid, imp.graph.add_constant(one_hot.reshape(columns, 1, *block))), attrs)
    for i in range(n):  # blocks may stop short of the padded image's end: zeros there, then the pads cut off
        short = padded[i] - ((blocks[i] - 1) * stride[i] + dil[i] * (block[i] - 1) + 1)
        if short:
            high = [0] * (n + 2)
            high[2 + i] = short
            out = imp.graph.add("pad", (out,), {"low": (0,) * (n + 2), "high": tuple(high), "value": 0.0})
        if pads[i] or pads[n + i]:
            out = imp.graph.add("slice", (out, imp.index(pads[i]), imp.index(pads[i] + image[i])), {"axis": 2 + i, "step": 1})
    return out


@onnx_op("ConvTranspose")
def _conv_transpose(
    imp: OnnxImporter, node: Any, x: Any, w: Any, b: Any = None, auto_pad: str = "NOTSET", dilations: Any = None, group: int = 1, kernel_shape: Any = None,
    output_padding: Any = None, output_shape: Any = None, pads: Any = None, strides: Any = None,
) -> Node:
    """The transposed convolution at its full size, (in - 1) * stride + extent, then cut to ONNX's
    output: ``pads`` removed from each end, the end extended by ``output_padding``. SAME pads
    make out = in * stride (the odd one at the end for SAME_UPPER). An ``output_shape`` given with
    explicit pads keeps the full result's start and cuts or extends its end, as ONNX's reference."""
    x, w = imp.tensor(x), imp.tensor(w)
    n = w.tensor_type.rank - 2
    kernel = [known_dim(d) for d in w.shape[2:]]
    if None in kernel:
        raise LoweringError(f"ConvTranspose with a kernel of run-time size {w.shape[2:]}")
    strides, dilations = list(strides or [1] * n), list(dilations or [1] * n)
    extra = list(output_padding or [0] * n)[:n]
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    fit = None
    if pads is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        low, high = [], []
        for i in range(n):
            if output_shape is not None:
                size = known_dim(x.shape[2 + i])
                if size is None:
                    raise LoweringError(f"ConvTranspose with output_shape and auto_pad={auto_pad} on spatial dim {i} ({x.shape[2 + i]}), which is not known when the model is compiled")
                total = strides[i] * (size - 1) + extra[i] + extents[i] - int(output_shape[i])
            else:  # out = in * stride: the total does not depend on in
                total = extra[i] + extents[i] - strides[i]
            small = total // 2
            low.append(small if auto_pad == "SAME_UPPER" else total - small)
            high.append(total - low[-1])
    elif auto_pad in ("NOTSET", "VALID"):
        pads = list(pads) if pads is not None and auto_pad == "NOTSET" else [0] * (2 * n)
        low, high = pads[:n], pads[n:]
        fit = [int(v) for v in output_shape] if output_shape is not None else None
    else:
        raise LoweringError(f"ConvTranspose with auto_pad={auto_pad!r} (ONNX allows NOTSET, VALID, SAME_UPPER, SAME_LOWER)")
    # The op itself trims ``both`` from each end; output_padding re-extends the end into the full
    # result (zeros only past its end), so the end's trim is the pad less output_padding.
    both = [max(min(lo, hi - e), 0) for lo, hi, e in zip(low, high, extra)]
    attrs = {"stride": tuple(strides), "padding": tuple(both), "dilation": tuple(dilations), "groups": int(group), "transposed": True, "output_padding": (0,) * n}
    out = imp.graph.add("convolution", (x, w), attrs)
    for i in range(n):
        axis = 2 + i
        size = as_expr(out.shape[axis])
        lo = low[i] - both[i]  # > 0: cut from the start; < 0: zeros added there
        if fit is None:
            hi = high[i] - both[i] - extra[i]  # the same at the end
        else:
            cut = known_dim(size - lo - fit[i])
            if cut is None:
                raise LoweringError(f"ConvTranspose with output_shape on spatial dim {i}, whose input size ({x.shape[axis]}) is not known when the model is compiled")
            hi = cut
        if lo > 0 or hi > 0:
            start, stop = max(lo, 0), size - max(hi, 0)
            out = imp.graph.add("slice", (out, imp.index(start), imp.index(stop)), {"axis": axis, "step": 1})
        if lo < 0 or hi < 0:
            low_pad, high_pad = [0] * (n + 2), [0] * (n + 2)
            low_pad[axis], high_pad[axis] = max(-lo, 0), max(-hi, 0)
            out = imp.graph.add("pad", (out,), {"low": tuple(low_pad), "high": tuple(high_pad), "value": 0.0})
    return _with_bias(imp, out, b)


# -- pooling ---------------------------------------------------------------------------------------------
def _pool_attrs(imp: OnnxImporter, node: Any, x: Node, kernel_shape: Sequence[int], strides: Any, pads: Any, dilations: Any, auto_pad: str) -> dict:
    n = len(kernel_shape)
    rank = x.tensor_type.rank
    lead = rank - n
    pads = _explicit_pads(imp, node, x.shape[lead:], kernel_shape, strides, dilations, pads, auto_pad)
    return {
        "window": (1,) * lead + tuple(kernel_shape),
        "strides": (1,) * lead + tuple(strides or [1] * n),
        "padding": ((0, 0),) * lead + tuple((pads[i], pads[i + n]) for i in range(n)),
        "dilation": (1,) * lead + tuple(dilations or [1] * n),
    }


@onnx_op("MaxPool")
def _max_pool(imp: OnnxImporter, node: Any, x: Any, kernel_shape: Sequence[int] = (), strides: Any = None, pads: Any = None, dilations: Any = None, ceil_mode: int = 0, auto_pad: str = "NOTSET", storage_order: int = 0) -> Node:
    if len(node.output) > 1 and node.output[1]:
        raise LoweringError("MaxPool's Indices output")
    x = imp.tensor(x)
    attrs = _pool_attrs(imp, node, x, kernel_shape, strides, pads, dilations, auto_pad)
    return imp.graph.add("reduce_window", (x,), {"kind": "max", "ceil_mode": bool(ceil_mode), **attrs})


@onnx_op("AveragePool")
def _avg_pool(imp: OnnxImporter, node: Any, x: Any, kernel_shape: Sequence[int] = (), strides: Any = None, pads: Any = None, dilations: Any = None, ceil_mode: int = 0, auto_pad: str = "NOTSET", count_include_pad: int = 0) -> Node:
    x = imp.tensor(x)
    attrs = _pool_attrs(imp, node, x, kernel_shape, strides, pads, dilations, auto_pad)
    total = imp.graph.add("reduce_window", (x,), {"kind": "sum", "ceil_mode": bool(ceil_mode), **attrs})
    padded = any(p != (0, 0) for p in attrs["padding"])
    if (count_include_pad or not padded) and not ceil_mode:
        return elementwise(imp, "div", [total, float(np.prod(kernel_shape))], x.dtype)
    # The window's count of real elements (or of real and padding ones, not of those past the
    # end that ceil_mode adds): the same window sum over ones.
    ones = imp.graph.add("broadcast_in_dim", (imp.graph.add_constant(np.array(1.0, numpy_dtype(x.dtype))), *imp.sizes(x.shape)), {"dims": ()})
    if count_include_pad:  # ones over the padding too; with ceil_mode, the overhang past it adds nothing
        ones = imp.graph.add("pad", (ones,), {"low": tuple(p[0] for p in attrs["padding"]), "high": tuple(p[1] for p in attrs["padding"]), "value": 1.0})
        counted = {**attrs, "padding": ((0, 0),) * len(attrs["padding"])}
        count = imp.graph.add("reduce_window", (ones,), {"kind": "sum", "ceil_mode": bool(ceil_mode), **counted})
        # Windows start at the same places; ceil_mode's rule that a last window must start before
        # the end padding sees that padding as data here, so there may be extra windows at the end.
        for axis, (have, want) in enumerate(zip(count.shape, total.shape)):
            if not imp.graph.constraints.prove_equal(have, want):
                count = imp.graph.add("slice", (count, imp.index(0), imp.index(want)), {"axis": axis, "step": 1})
    else:
        count = imp.graph.add("reduce_window", (ones,), {"kind": "sum", "ceil_mode": bool(ceil_mode), **attrs})
    if not imp.graph.constraints.prove_same_shape(total.shape, count.shape):
        raise LoweringError(f"AveragePool: window counts of shape {count.shape} for sums of shape {total.shape}")
    return elementwise(imp, "div", [total, count], x.dtype)


@onnx_op("LpPool")
def _lp_pool(imp: OnnxImporter, node: Any, x: Any, kernel_shape: Sequence[int] = (), p: int = 2, strides: Any = None, pads: Any = None, dilations: Any = None, ceil_mode: int = 0, auto_pad: str = "NOTSET") -> Node:
    """(sum of |x|^p over the window)^(1/p); padding adds zeros, which add nothing."""
    x = imp.tensor(x)
    attrs = _pool_attrs(imp, node, x, kernel_shape, strides, pads, dilations, auto_pad)
    powered = elementwise(imp, "mul", [x, x], x.dtype) if p == 2 else elementwise(imp, "pow", [imp.graph.add("abs", (x,)), float(p)], x.dtype)
    total = imp.graph.add("reduce_window", (powered,), {"kind": "sum", "ceil_mode": bool(ceil_mode), **attrs})
    return imp.graph.add("sqrt", (total,)) if p == 2 else elementwise(imp, "pow", [total, 1.0 / p], x.dtype)


@onnx_op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(imp: OnnxImporter, node: Any, x: Any) -> Node:
    x = imp.tensor(x)
    axes = list(range(2, x.tensor_type.rank))
    return mean(imp, x, axes, True) if node.op_type == "GlobalAveragePool" else reduce(imp, x, axes, "max", True)


@onnx_op("LRN")
def _lrn(imp: OnnxImporter, node: Any, x: Any, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> Node:
    x = imp.tensor(x)
    rank = x.tensor_type.rank
    lo = (size - 1) // 2
    window = {
        "window": (1, size) + (1,) * (rank - 2),
        "strides": (1,) * rank,
        "padding": ((0, 0), (lo, size - 1 - lo)) + ((0, 0),) * (rank - 2),
        "dilation": (1,) * rank,
    }
    squares = imp.graph.add("reduce_window", (elementwise(imp, "mul", [x, x], x.dtype),), {"kind": "sum", "ceil_mode": False, **window})
    base = elementwise(imp, "add", [elementwise(imp, "mul", [squares, alpha / size], x.dtype), bias], x.dtype)
    return elementwise(imp, "div", [x, elementwise(imp, "pow", [base, beta], x.dtype)], x.dtype)


@onnx_op("DeformConv")
def _deform_conv(
    imp: OnnxImporter, node: Any, x: Any, w: Any, offset: Any, b: Any = None, mask: Any = None, dilations: Any = None, group: int = 1, kernel_shape: Any = None,
    offset_group: int = 1, pads: Any = None, strides: Any = None,
) -> Node:
    """2-D deformable convolution: each kernel tap reads the input bilinearly at its regular
    position plus a learned offset (zero outside the image), scaled by the mask; the sampled
    columns [N, C * kh * kw, oh * ow] then meet the weights in one batched GEMM per group."""
    data, weight, shift = imp.tensor(x), imp.tensor(w), imp.tensor(offset)
    if data.tensor_type.rank != 4:
        raise LoweringError(f"DeformConv of a rank-{data.tensor_type.rank} input (disc takes the 2-D case, [N, C, H, W])")
    kh, kw = (known_dim(d) for d in weight.shape[2:])
    channels, out_channels = known_dim(data.shape[1]), known_dim(weight.shape[0])
    if None in (kh, kw, channels, out_channels) or channels % group or out_channels % group or channels % offset_group:
        raise LoweringError(f"DeformConv: kernel {weight.shape[2:]}, channels {data.shape[1]} -> {weight.shape[0]} must be known and divisible by group={group} and offset_group={offset_group}")
    n, _, height, width = data.shape
    oh, ow = shift.shape[2], shift.shape[3]
    taps, spots = kh * kw, as_expr(oh) * ow
    (sh, sw), (dh, dw) = list(strides or [1, 1]), list(dilations or [1, 1])
    top, left = list(pads or [0, 0, 0, 0])[:2]

    op = arithmetic(imp, "f64")

    offsets = convert(imp, reshape(imp, shift, [n, offset_group, taps, 2, spots]), "f64")

    def coordinate(axis: int, stride: int, dilation: int, start: int, kernel_step: np.ndarray) -> Node:
        """Sample positions along one image axis: [N, offset groups, taps, oh * ow]."""
        along = imp.graph.add("slice", (offsets, imp.index(axis), imp.index(axis + 1)), {"axis": 3, "step": 1})
        grid = [n, offset_group, taps, spots]
        out_pos = convert(imp, positions(imp, [oh, ow], axis), "f64")
        base = imp.graph.add("broadcast_in_dim", (reshape(imp, op("add", op("mul", out_pos, float(stride)), float(-start)), [spots]), *imp.sizes(grid)), {"dims": (3,)})
        kernel = imp.graph.add("broadcast_in_dim", (imp.graph.add_constant(kernel_step * float(dilation)), *imp.sizes(grid)), {"dims": (2,)})
        return op("add", op("add", base, kernel), reshape(imp, along, grid))

    ky, kx = np.divmod(np.arange(taps), kw)
    ys, xs = coordinate(0, sh, dh, top, ky.astype(np.float64)), coordinate(1, sw, dw, left, kx.astype(np.float64))
    y0, x0 = imp.graph.add("floor", (ys,)), imp.graph.add("floor", (xs,))
    fy, fx = op("sub", ys, y0), op("sub", xs, x0)
    per_group = channels // offset_group
    images = reshape(imp, data, [n, offset_group, per_group, as_expr(height) * width])
    limit_h, limit_w = convert(imp, imp.shape_tensor([height]), "f64"), convert(imp, imp.shape_tensor([width]), "f64")
    sampled = None
    for cy, wy in ((y0, op("sub", 1.0, fy)), (op("add", y0, 1.0), fy)):
        for cx, wx in ((x0, op("sub", 1.0, fx)), (op("add", x0, 1.0), fx)):
            inside = elementwise(imp, "logical_and", [elementwise(imp, "logical_and", [op("ge", cy, 0.0), op("lt", cy, limit_h)], "i1"), elementwise(imp, "logical_and", [op("ge", cx, 0.0), op("lt", cx, limit_w)], "i1")], "i1")
            flat = select(imp, inside, convert(imp, op("add", op("mul", cy, limit_w), cx), "i64"), 0, "i64")
            weight_here = select(imp, inside, op("mul", wy, wx), 0.0, "f64")  # [N, og, taps, P]
            index = imp.graph.add("broadcast_in_dim", (reshape(imp, flat, [n, offset_group, as_expr(spots) * taps]), *imp.sizes([n, offset_group, per_group, as_expr(spots) * taps])), {"dims": (0, 1, 3)})
            value = convert(imp, imp.graph.add("gather", (images, index), {"axis": 3}), "f64")
            spread = imp.graph.add("broadcast_in_dim", (reshape(imp, weight_here, [n, offset_group, as_expr(spots) * taps]), *imp.sizes([n, offset_group, per_group, as_expr(spots) * taps])), {"dims": (0, 1, 3)})
            term = op("mul", value, spread)
            sampled = term if sampled is None else op("add", sampled, term)
    if mask is not None:
        scale = convert(imp, reshape(imp, imp.tensor(mask), [n, offset_group, as_expr(spots) * taps]), "f64")
        sampled = op("mul", sampled, imp.graph.add("broadcast_in_dim", (scale, *imp.sizes([n, offset_group, per_group, as_expr(spots) * taps])), {"dims": (0, 1, 3)}))
    # (channel, tap) rows, spots columns; the GEMM in the data's type, as a convolution's
    columns = convert(imp, reshape(imp, sampled, [n, group, (channels // group) * taps, spots]), data.dtype)
    kernels = imp.graph.add("broadcast_in_dim", (reshape(imp, weight, [group, out_channels // group, (channels // group) * taps]), *imp.sizes([n, group, out_channels // group, (channels // group) * taps])), {"dims": (1, 2, 3)})
    return _with_bias(imp, reshape(imp, batched_matmul(imp, kernels, columns), [n, out_channels, oh, ow]), b)
