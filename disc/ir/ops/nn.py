"""Neural-network ops: argreduce, convolution and reduce_window (pooling).

Conventions:

* ``convolution`` is aten.convolution without bias (the frontend adds it):
  NC* layout with 1, 2 or 3 spatial dims; weight ``[O, C/groups, *k]``, or
  ``[C, O/groups, *k]`` when ``transposed``. ``stride``, ``padding`` and
  ``dilation`` have one entry per spatial dim; padding is symmetric.
  ``output_padding`` is ``()`` (all zero) or one entry per spatial dim.
  ``channels_last=true`` puts the channels of x and of the result last
  (``[N, *spatial, C]``, NHWC for 2-D); the weight keeps its layout. The
  frontend always emits channels first; the ``channels_last`` pass switches
  2-D convolutions to it, the layout the CPU and GPU libraries run fastest.
* ``convolution_backward_input(gy, w, *sizes)`` and
  ``convolution_backward_weight(x, gy)`` are the two gradients of a
  (non-transposed) convolution with the same geometry attributes: dL/dx of the
  given ``sizes`` (x's shape: the forward's output size floors, so x's size
  cannot be recovered from gy's) and dL/dw with kernel extents ``kernel``.
* ``reduce_window`` is pooling in XLA's reduce-window form: ``window``,
  ``strides`` and ``dilation`` have one entry per dim of x (1 for dims that
  are not pooled), ``padding`` one ``(low, high)`` pair per dim (``()`` for
  none, dilation ``()`` for all 1). Padding reads as -inf for max (the dtype's
  minimum for integers) and 0 for sum. max_pool is ``kind="max"``; avg_pool is
  ``kind="sum"`` followed by a division the frontend emits. ``kind="argmax"``
  gives max_pool's indices (i64): the row-major position over the dims
  ``index_dims`` of x (increasing, covering every pooled dim) of the window's
  largest element, the first of equal ones; a NaN beats any number and a later
  NaN an earlier one (PyTorch's max-pool rule). Positions in the padding are
  never picked; a window wholly in the padding gives -1.

Output sizes are SymExpr with floor division by the (static) strides, so a
dynamic image size stays one expression, e.g. ``(h - 1)//2 + 1``. The
ceil-mode correction of PyTorch is resolved in closed form, see
``window_output_dim``; no fresh symbol is ever needed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from disc.ir.lazy_torch import torch
from disc.ir.ops.indexing import require_ge
from disc.ir.registry import (
    LIBRARY,
    REDUCTION,
    REQUIRED,
    WINDOW,
    ShapeContext,
    ShapeRuleError,
    fixed_dtype,
    index_value,
    normalize_axis,
    register,
    tensor,
)
from disc.ir.types import FLOAT_DTYPES, Type
from disc.shape.expr import DimLike, SymExpr, as_expr


def _ints(ctx: ShapeContext, name: str, v: Any, n: int, lo: int) -> tuple[int, ...]:
    ctx.check(isinstance(v, tuple) and len(v) == n, f"{name} {v!r} must have {n} entries")
    for i, e in enumerate(v):
        ctx.check(isinstance(e, int) and not isinstance(e, bool), f"{name}[{i}] must be an int, got {e!r}")
        ctx.check(e >= lo, f"{name}[{i}] must be >= {lo}, got {e}")
    return v


# -- argreduce -----------------------------------------------------------------------------
ARG_KINDS = ("argmax", "argmin")


def _argreduce_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    x = tensor(types[0], "argreduce", "operand x")
    ctx.check(attrs["kind"] in ARG_KINDS, f"unknown kind {attrs['kind']!r}; expected one of {ARG_KINDS}")
    ctx.check(x.dtype != "i1", "operand x must not be i1")
    axis = normalize_axis(attrs["axis"], x.rank, "argreduce")
    size = x.shape[axis]
    if isinstance(size, int):
        ctx.check(size >= 1, f"the reduced axis {axis} is empty: there is no first largest or smallest element")
    elif not ctx.constraints.prove_ge(size, 1):
        ctx.constraints.assume(size, ">=", 1, f"argreduce: the reduced axis {axis} must not be empty")
    if attrs["keepdim"]:
        return tuple(1 if i == axis else d for i, d in enumerate(x.shape))
    return tuple(d for i, d in enumerate(x.shape) if i != axis)


@register(
    "argreduce",
    "x",
    attrs={"axis": REQUIRED, "kind": "argmax", "keepdim": False, "last": False},
    dtype=fixed_dtype("i64"),
    shape=_argreduce_rule,
    category=REDUCTION,
)
def argreduce(x: torch.Tensor, *, axis: int, kind: str, keepdim: bool, last: bool) -> torch.Tensor:
    """Index (i64) of the first (``last``: the last) max / min along ``axis``; a NaN is larger and
    smaller than any number. An empty axis is an error, as in torch."""
    fn = torch.argmax if kind == "argmax" else torch.argmin
    if not last:
        return fn(x, dim=axis, keepdim=keepdim)
    return x.shape[axis] - 1 - fn(torch.flip(x, (axis,)), dim=axis, keepdim=keepdim)


# -- convolution ---------------------------------------------------------------------------------
def _conv_dtype(types: Sequence[Type], attrs: Mapping[str, Any]) -> str:
    x, w = tensor(types[0], "convolution", "operand x"), tensor(types[1], "convolution", "operand w")
    if x.dtype != w.dtype:
        raise ShapeRuleError(f"convolution: operand w has dtype {w.dtype}, operand x has {x.dtype}")
    if x.dtype not in FLOAT_DTYPES:
        raise ShapeRuleError(f"convolution: operands must be floating point, got {x.dtype}")
    return x.dtype


def _divisible(ctx: ShapeContext, d: DimLike, k: int, why: str) -> None:
    e = as_expr(d)
    if k == 1 or ctx.constraints.prove_divisible(e, k):
        return
    if e.is_const:
        raise ShapeRuleError(f"{ctx.op}: {why}: {e} is not divisible by {k}")
    ctx.constraints.assume(e, "%", k, f"{ctx.op}: {why}")


def conv_output_dim(
    n: DimLike, k: DimLike, stride: int, padding: int, dilation: int, transposed: bool = False, output_padding: int = 0
) -> SymExpr:
    """One spatial output size of aten.convolution, as a symbolic expression."""
    reach = as_expr(k) * dilation - dilation  # dilation * (k - 1)
    if transposed:
        return (as_expr(n) - 1) * stride - 2 * padding + reach + output_padding + 1
    return (as_expr(n) + 2 * padding - reach - 1) // stride + 1


def _geometry(ctx: ShapeContext, attrs: Mapping[str, Any], k: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
    stride = _ints(ctx, "stride", attrs["stride"], k, 1)
    padding = _ints(ctx, "padding", attrs["padding"], k, 0)
    dilation = _ints(ctx, "dilation", attrs["dilation"], k, 1)
    groups = attrs["groups"]
    ctx.check(isinstance(groups, int) and not isinstance(groups, bool) and groups >= 1, f"groups must be an int >= 1, got {groups!r}")
    return stride, padding, dilation, groups


def channels_first_axes(rank: int, channels_last: bool) -> list[int]:
    """Axis of x (or of the result) holding N, C, then each spatial dim."""
    return [0, rank - 1, *range(1, rank - 1)] if channels_last else list(range(rank))


def _conv_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    x, w = tensor(types[0], "convolution", "operand x"), tensor(types[1], "convolution", "operand w")
    ctx.check(x.rank in (3, 4, 5), f"operand x must be N, C and 1-3 spatial dims (rank 3-5), got rank {x.rank}")
    # The rule reads x channels first; messages name x's own axes.
    axes = channels_first_axes(x.rank, bool(attrs["channels_last"]))
    xs = tuple(x.shape[a] for a in axes)
    if w.rank != x.rank:
        raise ShapeRuleError(f"convolution: operand w has rank {w.rank}, operand x has rank {x.rank}")
    k = x.rank - 2
    stride, padding, dilation, groups = _geometry(ctx, attrs, k)
    out_pad = attrs["output_padding"]
    out_pad = _ints(ctx, "output_padding", out_pad, k, 0) if out_pad != () else (0,) * k
    transposed = bool(attrs["transposed"])
    ctx.check(transposed or not any(out_pad), "output_padding needs transposed=true")
    if transposed:
        for i in range(k):
            ctx.check(
                out_pad[i] < max(stride[i], dilation[i]),
                f"output_padding[{i}]={out_pad[i]} must be smaller than stride[{i}]={stride[i]} or dilation[{i}]={dilation[i]}",
            )
        ctx.equal(xs[1], w.shape[0], f"x dim {axes[1]} (input channels) must equal w dim 0")
        _divisible(ctx, w.shape[0], groups, "w dim 0 (input channels) must be divisible by groups")
        out_channels = as_expr(w.shape[1]) * groups
    else:
        ctx.equal(xs[1], as_expr(w.shape[1]) * groups, f"x dim {axes[1]} (input channels) must equal w dim 1 * groups ({groups})")
        _divisible(ctx, w.shape[0], groups, "w dim 0 (output channels) must be divisible by groups")
        out_channels = w.shape[0]
    out: list[DimLike] = [xs[0], out_channels]
    for i in range(k):
        n, kk = xs[2 + i], w.shape[2 + i]
        require_ge(ctx, n, 1, f"x dim {axes[2 + i]} (spatial) must be >= 1")
        require_ge(ctx, kk, 1, f"w dim {2 + i} (kernel) must be >= 1")
        size = conv_output_dim(n, kk, stride[i], padding[i], dilation[i], transposed, out_pad[i])
        if transposed:
            require_ge(ctx, size, 1, f"output dim {2 + i} must be >= 1")
        else:
            dil_k = as_expr(kk) * dilation[i] - dilation[i] + 1
            require_ge(ctx, as_expr(n) + 2 * padding[i], dil_k, f"padded x dim {axes[2 + i]} must be >= the dilated kernel (w dim {2 + i})")
        out.append(size)
    return (out[0], *out[2:], out[1]) if attrs["channels_last"] else tuple(out)


@register(
    "convolution",
    "x w",
    attrs={
        "stride": REQUIRED,
        "padding": REQUIRED,
        "dilation": REQUIRED,
        "groups": 1,
        "transposed": False,
        "output_padding": (),
        "channels_last": False,
    },
    dtype=_conv_dtype,
    shape=_conv_rule,
    category=LIBRARY,
)
def convolution(
    x: torch.Tensor, w: torch.Tensor, *, stride, padding, dilation, groups, transposed, output_padding, channels_last
) -> torch.Tensor:
    """aten.convolution without bias (N-d, grouped, dilated, optionally transposed)."""
    k = x.dim() - 2
    out_pad = list(output_padding) if output_padding else [0] * k
    if channels_last:
        x = x.permute(channels_first_axes(x.dim(), True))
    y = torch.ops.aten.convolution(x, w, None, list(stride), list(padding), list(dilation), bool(transposed), out_pad, groups)
    # The result's channels go last (dims N, spatial..., C of the channels-first result).
    return y.permute(0, *range(2, y.dim()), 1) if channels_last else y


# -- convolution gradients -------------------------------------------------------------------
def _check_forward(ctx: ShapeContext, xs, ys, kernel, attrs: Mapping[str, Any], names: tuple[str, str]) -> None:
    """``ys`` (channels first) must be the convolution's output over ``xs`` with this kernel."""
    x_name, y_name = names
    stride, padding, dilation, groups = _geometry(ctx, attrs, len(xs) - 2)
    ctx.equal(ys[0], xs[0], f"{y_name} batch must equal {x_name} batch")
    _divisible(ctx, xs[1], groups, f"{x_name} channels must be divisible by groups")
    _divisible(ctx, ys[1], groups, f"{y_name} channels must be divisible by groups")
    for i in range(len(xs) - 2):
        require_ge(ctx, xs[2 + i], 1, f"{x_name} spatial dim {i} must be >= 1")
        want = conv_output_dim(xs[2 + i], kernel[i], stride[i], padding[i], dilation[i])
        ctx.equal(ys[2 + i], want, f"{y_name} spatial dim {i} must be the convolution's output size")


def _grad_dtype(types: Sequence[Type], attrs: Mapping[str, Any]) -> str:
    a, b = tensor(types[0], "convolution gradient"), tensor(types[1], "convolution gradient")
    if a.dtype != b.dtype or a.dtype not in FLOAT_DTYPES:
        raise ShapeRuleError(f"convolution gradient: operands must share a floating-point dtype, got {a.dtype} and {b.dtype}")
    return a.dtype


def _grad_input_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    gy, w = tensor(types[0], ctx.op, "operand gy"), tensor(types[1], ctx.op, "operand w")
    sizes = tuple(index_value(t, ctx.op) for t in types[2:])
    ctx.check(gy.rank in (3, 4, 5) and w.rank == gy.rank and len(sizes) == gy.rank, "gy, w and the sizes must all have rank 3-5")
    axes = channels_first_axes(gy.rank, bool(attrs["channels_last"]))
    xs, ys = [sizes[a] for a in axes], [gy.shape[a] for a in axes]
    groups = _geometry(ctx, attrs, gy.rank - 2)[3]
    ctx.equal(ys[1], w.shape[0], f"gy dim {axes[1]} (channels) must equal w dim 0")
    ctx.equal(xs[1], as_expr(w.shape[1]) * groups, f"size {axes[1]} (input channels) must equal w dim 1 * groups ({groups})")
    _check_forward(ctx, xs, ys, w.shape[2:], attrs, ("x", "gy"))
    return sizes


_GRAD_ATTRS = {"stride": REQUIRED, "padding": REQUIRED, "dilation": REQUIRED, "groups": 1, "channels_last": False}


@register("convolution_backward_input", "gy w *sizes", attrs=_GRAD_ATTRS, dtype=_grad_dtype, shape=_grad_input_rule, category=LIBRARY)
def convolution_backward_input(gy: torch.Tensor, w: torch.Tensor, *sizes: int, stride, padding, dilation, groups, channels_last) -> torch.Tensor:
    """dL/dx of ``convolution(x, w)`` for an x of shape ``sizes``, from dL/dy = ``gy``."""
    rank = gy.dim()
    axes = channels_first_axes(rank, bool(channels_last))
    gy = gy.permute(axes)
    x = gy.new_empty([sizes[a] for a in axes])  # only its shape is read
    gx = torch.ops.aten.convolution_backward(
        gy, x, w, None, list(stride), list(padding), list(dilation), False, [0] * (rank - 2), groups, [True, False, False]
    )[0]
    return gx.permute(0, *range(2, rank), 1) if channels_last else gx


def _grad_weight_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    x, gy = tensor(types[0], ctx.op, "operand x"), tensor(types[1], ctx.op, "operand gy")
    ctx.check(x.rank in (3, 4, 5) and gy.rank == x.rank, "x and gy must have the same rank, 3-5")
    kernel = _ints(ctx, "kernel", attrs["kernel"], x.rank - 2, 1)
    axes = channels_first_axes(x.rank, bool(attrs["channels_last"]))
    xs, ys = [x.shape[a] for a in axes], [gy.shape[a] for a in axes]
    _check_forward(ctx, xs, ys, kernel, attrs, ("x", "gy"))
    return (ys[1], as_expr(xs[1]) // attrs["groups"], *kernel)


@register(
    "convolution_backward_weight", "x gy", attrs={**_GRAD_ATTRS, "kernel": REQUIRED}, dtype=_grad_dtype, shape=_grad_weight_rule, category=LIBRARY
)
def convolution_backward_weight(x: torch.Tensor, gy: torch.Tensor, *, kernel, stride, padding, dilation, groups, channels_last) -> torch.Tensor:
    """dL/dw of ``convolution(x, w)`` (w of kernel extents ``kernel``), from dL/dy = ``gy``."""
    rank = x.dim()
    axes = channels_first_axes(rank, bool(channels_last))
    x, gy = x.permute(axes), gy.permute(axes)
    w = x.new_empty([gy.shape[1], x.shape[1] // groups, *kernel])  # only its shape is read
    return torch.ops.aten.convolution_backward(
        gy, x, w, None, list(stride), list(padding), list(dilation), False, [0] * (rank - 2), groups, [False, True, False]
    )[1]


# -- reduce_window -------------------------------------------------------------------------------
WINDOW_KINDS = ("max", "sum", "argmax")


def window_output_dim(n: DimLike, window: int, stride: int, low: int, high: int, dilation: int, ceil_mode: bool) -> SymExpr:
    """Number of windows along one dim, as a symbolic expression.

    With ``A = n + low + high - eff`` (``eff = dilation*(window-1) + 1``):
    floor mode gives ``A//s + 1``. Ceil mode is ``ceil(A/s) + 1``, minus one
    when the last window would start at or past ``n + low`` (PyTorch's rule
    that the last window starts inside the input or the left padding). The
    correction depends only on the static ``t = high - eff``:

    * ``t <= -s``: never applies: ``ceil(A/s) + 1``;
    * ``t >= 0``: always applies: ``ceil(A/s)``;
    * ``-s < t < 0``: writing ``n + low - 1 = m*s + r``, ``ceil(A/s)`` is
      ``m + [r >= -t]`` and the correction applies exactly when it is ``m + 1``,
      so the result is ``m + 1 == (n + low - 1)//s + 1`` either way.

    So the count is always one floor-division expression and ceil mode needs
    no fresh symbol.
    """
    eff = dilation * (window - 1) + 1
    a = as_expr(n) + (low + high - eff)
    if not ceil_mode:
        return a // stride + 1
    t = high - eff
    if t <= -stride:
        return a.ceildiv(stride) + 1
    if t >= 0:
        return a.ceildiv(stride)
    return (as_expr(n) + (low - 1)) // stride + 1


def _window_attrs(ctx: ShapeContext, rank: int, attrs: Mapping[str, Any]):
    window = _ints(ctx, "window", attrs["window"], rank, 1)
    strides = _ints(ctx, "strides", attrs["strides"], rank, 1)
    dilation = attrs["dilation"]
    dilation = _ints(ctx, "dilation", dilation, rank, 1) if dilation != () else (1,) * rank
    padding = attrs["padding"]
    if padding == ():
        padding = ((0, 0),) * rank
    ctx.check(
        isinstance(padding, tuple) and len(padding) == rank, f"padding {padding!r} must have one (low, high) pair per dim (rank {rank})"
    )
    for i, p in enumerate(padding):
        _ints(ctx, f"padding[{i}]", p, 2, 0)
    return window, strides, tuple(tuple(p) for p in padding), dilation


def _reduce_window_dtype(types: Sequence[Type], attrs: Mapping[str, Any]) -> str:
    dt = tensor(types[0], "reduce_window", "operand x").dtype
    if attrs["kind"] in ("sum", "argmax") and dt == "i1":
        raise ShapeRuleError(f"reduce_window: kind {attrs['kind']} needs a numeric operand, got i1")
    return "i64" if attrs["kind"] == "argmax" else dt


def _reduce_window_rule(ctx: ShapeContext, types: Sequence[Type], attrs: Mapping[str, Any]):
    x = tensor(types[0], "reduce_window", "operand x")
    ctx.check(attrs["kind"] in WINDOW_KINDS, f"unknown kind {attrs['kind']!r}; expected one of {WINDOW_KINDS}")
    window, strides, padding, dilation = _window_attrs(ctx, x.rank, attrs)
    pooled = pooled_dims(window, strides, padding)
    out = []
    for d, n in enumerate(x.shape):
        (lo, hi), w, s, dil = padding[d], window[d], strides[d], dilation[d]
        if d not in pooled:
            out.append(n)
            continue
        size = window_output_dim(n, w, s, lo, hi, dil, bool(attrs["ceil_mode"]))
        require_ge(ctx, size, 0, f"x dim {d} is too small for window {w} (dilation {dil}, padding {lo}/{hi}, stride {s})")
        out.append(size)
    _check_index_dims(ctx, x.rank, attrs, pooled)
    return tuple(out)


def pooled_dims(window: Sequence[int], strides: Sequence[int], padding: Sequence[tuple[int, int]]) -> list[int]:
    """The dims a reduce_window actually pools (the others are read at the output's own index)."""
    return [d for d, (w, s, p) in enumerate(zip(window, strides, padding)) if (w, s, *p) != (1, 1, 0, 0)]


def _check_index_dims(ctx: ShapeContext, rank: int, attrs: Mapping[str, Any], pooled: Sequence[int]) -> None:
    dims = attrs["index_dims"]
    if attrs["kind"] != "argmax":
        ctx.check(dims == (), f"index_dims {dims!r} is only for kind argmax")
        return
    ctx.check(isinstance(dims, tuple) and len(dims) > 0, f"kind argmax needs index_dims, got {dims!r}")
    for i, d in enumerate(dims):
        ctx.check(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < rank, f"index_dims[{i}] {d!r} is not a dim of x (rank {rank})"
        )
    # Increasing, so that walking a window in dim order meets positions in index order:
    # "the first of equal maxima" then means the same in every backend.
    ctx.check(list(dims) == sorted(set(dims)), f"index_dims {dims!r} must be increasing")
    missing = [d for d in pooled if d not in dims]
    ctx.check(not missing, f"index_dims {dims!r} must include every pooled dim; missing {missing}")


def _pad_value(dtype: torch.dtype, kind: str) -> float | int | bool:
    if kind == "sum":
        return 0
    if dtype == torch.bool:
        return False
    if dtype.is_floating_point:
        return float("-inf")
    return torch.iinfo(dtype).min


@register(
    "reduce_window",
    "x",
    attrs={"kind": "max", "window": REQUIRED, "strides": REQUIRED, "padding": (), "dilation": (), "ceil_mode": False, "index_dims": ()},
    dtype=_reduce_window_dtype,
    shape=_reduce_window_rule,
    category=WINDOW,
)
def reduce_window(x: torch.Tensor, *, kind: str, window, strides, padding, dilation, ceil_mode: bool, index_dims=()) -> torch.Tensor:
    """Max / sum / argmax over (dilated, strided) windows of the padded operand, one window size per dim."""
    rank = x.dim()
    dilation = tuple(dilation) if dilation else (1,) * rank
    padding = tuple(padding) if padding else ((0, 0),) * rank
    sizes = [
        int(window_output_dim(n, w, s, lo, hi, dil, ceil_mode).const_value) if (w, s, lo, hi) != (1, 1, 0, 0) else n
        for n, w, s, (lo, hi), dil in zip(x.shape, window, strides, padding, dilation)
    ]
    if any(n <= 0 for n in sizes):
        return x.new_empty(sizes, dtype=torch.int64 if kind == "argmax" else x.dtype)
    # Pad far enough on the high side that every (ceil-mode) window is in bounds.
    spans = [(out - 1) * s + dil * (w - 1) + 1 for out, s, dil, w in zip(sizes, strides, dilation, window)]
    highs = [max(hi, span - n - lo) for span, n, (lo, hi) in zip(spans, x.shape, padding)]
    spec: list[int] = []
    for (lo, _), hi in zip(reversed(padding), reversed(highs)):
        spec += [lo, hi]

    def windows(t: torch.Tensor, fill: Any) -> torch.Tensor:
        t = torch.constant_pad_nd(t, spec, fill)
        for d in range(rank):
            t = t.narrow(d, 0, spans[d])
            eff = dilation[d] * (window[d] - 1) + 1
            t = t.unfold(d, eff, strides[d])[..., :: dilation[d]]  # window elements go last
        return t

    y = windows(x, _pad_value(x.dtype, kind))
    dims = tuple(range(rank, 2 * rank))
    if kind == "argmax":
        return _window_argmax(y.flatten(rank), windows(_flat_positions(x, index_dims), -1).flatten(rank))
    if kind == "max":
        return torch.amax(y, dim=dims) if rank else y
    return torch.sum(y, dim=dims, dtype=x.dtype) if rank else y


def _flat_positions(x: torch.Tensor, index_dims: Sequence[int]) -> torch.Tensor:
    """Each element's row-major position over ``index_dims`` of x, as an i64 tensor of x's shape."""
    pos = torch.zeros(x.shape, dtype=torch.int64, device=x.device)
    for d in index_dims:
        ar = torch.arange(x.shape[d], dtype=torch.int64, device=x.device).reshape([-1 if k == d else 1 for k in range(x.dim())])
        pos = pos * x.shape[d] + ar
    return pos


def _window_argmax(vals: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Per window (last dim, in walk order), the position of its max by max-pool's rule; pos < 0 marks padding."""
    valid = pos >= 0
    nan = torch.isnan(vals) & valid if vals.is_floating_point() else torch.zeros_like(valid)
    k = vals.shape[-1]
    last_nan = (k - 1) - torch.argmax(nan.flip(-1).to(torch.uint8), dim=-1, keepdim=True)
    low = -math.inf if vals.is_floating_point() else torch.iinfo(vals.dtype).min
    masked = torch.where(valid & ~nan, vals, torch.full_like(vals, low))
    top = torch.amax(masked, dim=-1, keepdim=True)
    first_top = torch.argmax((valid & (masked == top)).to(torch.uint8), dim=-1, keepdim=True)
    at = torch.where(nan.any(-1, keepdim=True), last_nan, first_top)
    picked = torch.gather(pos, -1, at).squeeze(-1)
    return torch.where(valid.any(-1), picked, torch.full_like(picked, -1))
