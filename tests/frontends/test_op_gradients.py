"""The gradient of every lowering a backward graph can contain, against eager.

Each case is a small function of tensors that need gradients, run through
``torch.compile(backend="disc", dynamic=True)`` over a stream of shapes whose
first shape has a size-1 dim and the rest odd dims. The forward output and
the gradient of every input must match eager; float64 where the op allows it
(so a wrong formula cannot hide in float32 rounding), float32 elsewhere. A
case compiles one forward and one backward for the whole stream, and disc
runs both itself (no op left to PyTorch) unless the case says which op it
leaves and why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F

import disc

Shape = tuple[int, int]
# (batch, length): starts with size-1 dims, then odd ones.
STREAM: list[Shape] = [(1, 5), (3, 1), (2, 7), (1, 1), (4, 9)]


@dataclass
class Case:
    fn: Callable[..., torch.Tensor]
    inputs: Callable[[int, int, torch.dtype], tuple]  # (batch, length, dtype) -> args; float args get gradients
    dtype: torch.dtype = torch.float64
    left_to_torch: set[str] = field(default_factory=set)  # ops disc still leaves to PyTorch here (listed in docs/models.md)
    # Calls that compile again after a graph traced above size 1, and why (dynamo guards on them).
    recompiles: dict[Shape, str] = field(default_factory=dict)
    stream: list[Shape] = field(default_factory=lambda: list(STREAM))
    # input position -> dims that stay static, as a model's weights and head sizes do
    # (dynamic=True would make every dim of an input tensor a symbol); None: every dim.
    static: dict[int, tuple[int, ...] | None] = field(default_factory=dict)


def _r(dtype: torch.dtype, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype)


def _heads(b: int, n: int, dtype: torch.dtype, heads: int = 4, kv_heads: int = 4, head: int = 8, kv_len: int | None = None) -> tuple:
    m = n if kv_len is None else kv_len
    return _r(dtype, b, heads, n, head), _r(dtype, b, kv_heads, m, head), _r(dtype, b, kv_heads, m, head)


HEADS = {0: (1, 3), 1: (1, 3), 2: (1, 3)}  # q, k, v: [batch, heads, length, head size]
CHANNELS = {0: (1,), 1: None, 2: None}  # an image's channels, a weight, a bias


def _bool_mask(b: int, n: int, m: int) -> torch.Tensor:
    mask = torch.rand(b, 1, n, m) > 0.4
    mask[..., 0] = True  # every query keeps a key
    return mask


def _sdpa(**kw):
    return lambda q, k, v, *mask: F.scaled_dot_product_attention(q, k, v, *mask, **kw)


def _same_padding(x: torch.Tensor) -> torch.Tensor:
    # TF-style "same" padding for a 3-wide, stride-2 window, computed as MobileNetV2's code does:
    # the amount is max(0, 3 - n % 2) (n odd on this stream), and its backward crops by it.
    n = x.shape[-1]
    total = max(3 - 2, 0) if n % 2 == 0 else max(3 - n % 2, 0)
    return F.pad(x, (total // 2, total - total // 2)) * 2


def _patch_merging(x: torch.Tensor) -> torch.Tensor:
    # Swin's: pad the map to even sides, then the four phases of each 2x2 patch side by side.
    h, w = x.shape[1], x.shape[2]
    x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
    return torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2] ** 2], -1)


def _every_third_row(x: torch.Tensor) -> torch.Tensor:
    x = F.pad(x, (0, 0, 0, (-x.shape[1]) % 3))  # rows padded to a multiple of 3
    return x[:, 1::3] * 3 + x[:, 2::3] ** 2


CASES: dict[str, Case] = {
    # Attention: float32 (the fused CPU kernel eager runs has no float64 path for every variant).
    "sdpa": Case(_sdpa(), lambda b, n, d: _heads(b, n, d), torch.float32, static=HEADS),
    "sdpa_causal": Case(_sdpa(is_causal=True), lambda b, n, d: _heads(b, n, d), torch.float32, static=HEADS),
    "sdpa_bool_mask": Case(_sdpa(), lambda b, n, d: (*_heads(b, n, d), _bool_mask(b, n, n)), torch.float32, static=HEADS),
    "sdpa_float_mask": Case(_sdpa(), lambda b, n, d: (*_heads(b, n, d), torch.randn(b, 1, n, n)), torch.float32, static=HEADS),
    "sdpa_cross": Case(_sdpa(), lambda b, n, d: _heads(b, n, d, kv_len=n + 2), torch.float32, static=HEADS),
    "sdpa_gqa": Case(_sdpa(enable_gqa=True), lambda b, n, d: _heads(b, n, d, heads=4, kv_heads=2), torch.float32, static=HEADS),
    "sdpa_scale": Case(_sdpa(scale=0.3), lambda b, n, d: _heads(b, n, d), torch.float32, static=HEADS),
    "sdpa_float64": Case(_sdpa(), lambda b, n, d: _heads(b, n, d), static=HEADS),
    "attention_by_hand": Case(
        lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, -1) @ v, lambda b, n, d: _heads(b, n, d), static=HEADS
    ),
    # Norms.
    "layer_norm": Case(lambda x, w, b: F.layer_norm(x, (6,), w, b), lambda b, n, d: (_r(d, b, n, 6), _r(d, 6), _r(d, 6)), static={0: (2,), 1: None, 2: None}),
    "rms_norm": Case(lambda x, w: F.rms_norm(x, (6,), w, eps=1e-6), lambda b, n, d: (_r(d, b, n, 6), _r(d, 6)), static={0: (2,), 1: None}),
    "group_norm": Case(lambda x, w, b: F.group_norm(x, 2, w, b), lambda b, n, d: (_r(d, b, 4, n, 3), _r(d, 4), _r(d, 4)), static=CHANNELS),
    "batch_norm_train": Case(
        lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
        lambda b, n, d: (_r(d, b + 1, 4, n, 3), _r(d, 4), _r(d, 4)),
        static=CHANNELS,
    ),
    "softmax": Case(lambda x: torch.softmax(x, -1), lambda b, n, d: (_r(d, b, n),)),
    "log_softmax": Case(lambda x: torch.log_softmax(x, 1), lambda b, n, d: (_r(d, b, n, 3),)),
    # Pooling and convolution.
    "max_pool2d": Case(lambda x: F.max_pool2d(x, 2, ceil_mode=True), lambda b, n, d: (_r(d, b, 2, n + 1, 5),)),
    "avg_pool2d": Case(
        lambda x: F.avg_pool2d(x, 2, stride=1, padding=1), lambda b, n, d: (_r(d, b, 2, n + 1, 4),), left_to_torch={"aten.avg_pool2d_backward.default"}
    ),
    "adaptive_avg_pool2d": Case(lambda x: F.adaptive_avg_pool2d(x, 1), lambda b, n, d: (_r(d, b, 3, n, 5),)),
    "conv2d": Case(
        lambda x, w, c: F.conv2d(x, w, c, padding=1), lambda b, n, d: (_r(d, b, 3, n + 2, 5), _r(d, 4, 3, 3, 3), _r(d, 4)), torch.float32, static=CHANNELS
    ),
    "conv2d_stride_groups": Case(
        lambda x, w: F.conv2d(x, w, stride=2, groups=2), lambda b, n, d: (_r(d, b, 4, n + 3, 6), _r(d, 4, 2, 3, 3)), torch.float32, static=CHANNELS
    ),
    "conv1d": Case(lambda x, w: F.conv1d(x, w, stride=2, padding=1), lambda b, n, d: (_r(d, b, 3, n + 4), _r(d, 5, 3, 3)), torch.float32, static=CHANNELS),
    # Embedding, indexing, gather/scatter.
    "embedding": Case(lambda w, i: F.embedding(i, w), lambda b, n, d: (_r(d, 11, 5), torch.randint(0, 11, (b, n))), static={0: None}),
    "embedding_padding_idx": Case(
        lambda w, i: F.embedding(i, w, padding_idx=0), lambda b, n, d: (_r(d, 11, 5), torch.randint(0, 11, (b, n))), static={0: None}
    ),
    "index_select": Case(lambda x, i: x.index_select(1, i), lambda b, n, d: (_r(d, b, n, 3), torch.randint(0, n, (4,)))),
    "gather": Case(lambda x, i: torch.gather(x, 1, i), lambda b, n, d: (_r(d, b, n), torch.randint(0, n, (b, 3)))),
    "take_along_dim": Case(
        lambda x, i: torch.take_along_dim(x, i, 2),
        lambda b, n, d: (_r(d, b, 2, n), torch.randint(0, n, (b, 2, 1))),
        recompiles={(1, 1): "broadcasting the index against x guards on x's length", (4, 9): "the same guard, the other way"},
    ),
    # Two index tensors broadcast together, with repeats and negative indices: a gather at flat
    # positions, and a scatter-add there in the backward.
    "index_two_tensors": Case(
        lambda x, i, j: x[:, i, j] * 2, lambda b, n, d: (_r(d, b, n, 5), torch.randint(-n, n, (3, 1)), torch.randint(-5, 5, (4,)))
    ),
    "advanced_index": Case(lambda x, i: x[:, i], lambda b, n, d: (_r(d, b, n, 3), torch.randint(0, n, (2, 3)))),
    "scatter_add": Case(
        lambda x, s, i: x.scatter_add(1, i, s), lambda b, n, d: (_r(d, b, n), _r(d, b, 2), torch.randint(0, n, (b, 2)))
    ),
    "slice_and_cat": Case(lambda x: torch.cat([x[:, 1:], x[:, :1] * 2], 1), lambda b, n, d: (_r(d, b, n + 1, 2),)),
    # Swin's patch merging: x[:, r::2] of a map whose side is a multiple of the step; the backward is
    # a slice_scatter with a step, written into a (side / step, step) split of the dim.
    "patch_merging": Case(_patch_merging, lambda b, n, d: (_r(d, b, n, n + 2, 3),)),
    "every_third_row": Case(_every_third_row, lambda b, n, d: (_r(d, b, n, 2),)),
    # Losses.
    "cross_entropy": Case(lambda x, t: F.cross_entropy(x, t), lambda b, n, d: (_r(d, b * n, 7), torch.randint(0, 7, (b * n,)))),
    "cross_entropy_ignore": Case(
        lambda x, t: F.cross_entropy(x.transpose(1, 2), t, ignore_index=0, label_smoothing=0.1),
        lambda b, n, d: (_r(d, b, n, 7), torch.randint(0, 7, (b, n))),
    ),
    "nll_loss": Case(lambda x, t: F.nll_loss(torch.log_softmax(x, -1), t), lambda b, n, d: (_r(d, b * n, 5), torch.randint(0, 5, (b * n,)))),
    "mse_loss": Case(lambda x, y: F.mse_loss(x, y), lambda b, n, d: (_r(d, b, n), _r(d, b, n))),
    "smooth_l1_loss": Case(lambda x, y: F.smooth_l1_loss(x, y), lambda b, n, d: (_r(d, b, n), _r(d, b, n))),
    "bce_with_logits": Case(lambda x, y: F.binary_cross_entropy_with_logits(x, y), lambda b, n, d: (_r(d, b, n), torch.rand(b, n, dtype=d))),
    # Pointwise, selection, scans.
    "activations": Case(
        lambda x: F.gelu(x) + F.silu(x) + torch.tanh(x) + F.gelu(x, approximate="tanh") + F.softplus(x) + F.elu(x) + torch.sigmoid(x),
        lambda b, n, d: (_r(d, b, n),),
    ),
    "relu_family": Case(lambda x: F.relu(x) + F.leaky_relu(x, 0.1) + F.hardswish(x) + F.relu6(x) * x, lambda b, n, d: (_r(d, b, n),)),
    "where": Case(lambda x, y: torch.where(x > 0, x * y, y.exp()), lambda b, n, d: (_r(d, b, n), _r(d, b, 1))),
    "masked_fill": Case(lambda x: x.masked_fill(x < -0.5, 0.0) * 3, lambda b, n, d: (_r(d, b, n),)),
    "cumsum": Case(lambda x: torch.cumsum(x, 1) * x, lambda b, n, d: (_r(d, b, n),)),
    "clamp_pow": Case(lambda x: x.clamp(-0.5, 0.7) ** 2 + x.abs().sqrt(), lambda b, n, d: (_r(d, b, n),)),
    "reductions": Case(
        lambda x: x.amax(-1) + x.mean(-1) + x.var(-1) + x.norm(dim=-1) + torch.logsumexp(x, -1),
        lambda b, n, d: (_r(d, b, n + 1),),
    ),
    "broadcast_matmul": Case(lambda x, w, c: x @ w + c, lambda b, n, d: (_r(d, b, n, 4), _r(d, 4, 3), _r(d, 3))),
    "bmm_expand": Case(lambda x, y: torch.matmul(x, y.expand(x.shape[0], -1, -1)), lambda b, n, d: (_r(d, b, n, 4), _r(d, 1, 4, 3))),
    # The backward of an upsampling decomposes into gathers and scatters over two index tensors
    # (run by PyTorch until both lowered).
    "interpolate_bilinear": Case(
        lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
        lambda b, n, d: (_r(d, b, 2, n, 3),),
    ),
    "interpolate_nearest": Case(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), lambda b, n, d: (_r(d, b, 2, n, 3),)),
    "same_padding": Case(_same_padding, lambda b, n, d: (_r(d, b, 2, n + 2),)),
    "pad_reflect": Case(
        lambda x: F.pad(x, (1, 1), mode="reflect"),
        lambda b, n, d: (_r(d, b, 2, n + 2),),
        recompiles={(4, 9): "the reflection's backward guards on the padded length in torch's decomposition"},
    ),
    "unfold_like_patches": Case(
        lambda x: x.unflatten(2, (-1, 2)).transpose(2, 3).flatten(1) * 2,
        lambda b, n, d: (_r(d, b, 3, 2 * n),),
        recompiles={(1, 1): "unflatten's -1 makes dynamo guard that the computed size (x.size(2) // 2) is 1"},
        # The backward takes sizes (x.size(2) // 2, and a quotient of it) whose symbols no input carries.
        left_to_torch={"<whole graph>"},
    ),
}


def _loss(out: torch.Tensor) -> torch.Tensor:
    w = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(3))
    return (out * w).sum()


def _leaves(args: tuple) -> tuple:
    return tuple(a.detach().clone().requires_grad_(a.is_floating_point()) for a in args)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_eager(name: str) -> None:
    case = CASES[name]
    torch._dynamo.reset()
    before = len(disc.reports())
    compiled = torch.compile(case.fn, backend="disc", dynamic=True)
    tol = 1e-10 if case.dtype == torch.float64 else 2e-5
    general_seen, recompiled_at = False, []
    for k, (b, n) in enumerate(case.stream):
        compiled_before = len(disc.reports())
        torch.manual_seed(k)
        args = case.inputs(b, n, case.dtype)
        mine, ref = _leaves(args), _leaves(args)
        for pos, dims in case.static.items():
            if pos >= len(mine):  # a shared layout (CHANNELS) names a bias this case does not take
                continue
            for axis in range(mine[pos].dim()) if dims is None else dims:
                torch._dynamo.mark_static(mine[pos], axis)
        out, want = compiled(*mine), case.fn(*ref)
        torch.testing.assert_close(out, want, rtol=tol, atol=tol, msg=lambda m: f"{name} forward at {(b, n)}: {m}")
        _loss(out).backward()
        _loss(want).backward()
        scale = max((r.grad.abs().max().item() for r in ref if r.grad is not None), default=1.0)
        for pos, (g, r) in enumerate(zip(mine, ref)):
            if r.grad is None:
                continue
            assert g.grad is not None, f"{name}: input {pos} has no gradient at {(b, n)}"
            # Judged against the largest gradient of the case: a gradient that is exactly 0 in
            # theory (softmax's per-row shift) is rounding noise in eager too.
            err = (g.grad - r.grad).abs().max().item() / max(scale, 1e-30)
            assert err <= tol * 10, f"{name}: input {pos} gradient off by {err:.2e} of the gradient scale at {(b, n)}"
        if general_seen and len(disc.reports()) > compiled_before and (b, n) not in case.recompiles:
            recompiled_at.append((b, n))
        general_seen |= min(b, n) > 1
    # Dynamo makes a dim that is 1 at a frame's first trace a constant (docs/internals.md, "Plug-in mode");
    # once a graph was traced at sizes above 1, no size-1 call may compile again.
    assert not recompiled_at, f"{name}: compiled again at {recompiled_at}"
    new = disc.reports()[before:]
    kinds = ["backward" in r.name for r in new]
    assert kinds.count(False) == kinds.count(True), [r.name for r in new]
    left = {op for r in new for op in r.fallbacks}
    assert left <= case.left_to_torch, f"{name}: ops left to PyTorch: {sorted(left - case.left_to_torch)}"
