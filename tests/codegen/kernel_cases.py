"""Small modules and IR programs that exercise every kernel form; shared by the CPU and GPU backend tests."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from disc.ir.graph import Graph
from disc.ir.types import TensorType


def check_against_eager(cm, model: nn.Module, args: tuple, tol: float = 1e-5) -> None:
    """``cm(*args)`` equals eager ``model(*args)``: relative to the largest value for floats, exactly otherwise."""
    with torch.no_grad():
        want = model(*args)
    got = cm(*args)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        g = g.to(w.device)
        if w.is_floating_point():
            assert torch.equal(w.isnan(), g.isnan()) and torch.equal(w.isinf(), g.isinf()) and torch.equal(w[w.isinf()], g[g.isinf()])
            w, g = w[w.isfinite()], g[w.isfinite()]
            if not w.numel():
                continue
            scale = w.abs().max().clamp_min(1e-6)
            assert ((w - g).abs().max() / scale).item() <= tol, (w - g).abs().max()
        else:
            assert torch.equal(w, g)


def check_half_against_eager(cm, model: nn.Module, args: tuple, tol: float) -> None:
    """A 16-bit ``cm(*args)`` against eager in the same dtype, within ``tol`` of the largest value.

    disc rounds once per stored kernel result; eager rounds after every op. Where that makes
    eager itself further than ``tol`` from the float32 result (a row masked with -10000 in f16,
    whose spacing there is 8, loses every score in eager), disc must instead be no further from
    float32 than eager is: never worse than eager, never a free pass.
    """
    import copy

    with torch.no_grad():
        want = model(*args)
        exact = copy.deepcopy(model).float()(*(a.float() if a.is_floating_point() else a for a in args))
    got = cm(*args)
    want, got, exact = ((t if isinstance(t, tuple) else (t,)) for t in (want, got, exact))
    assert len(want) == len(got) == len(exact)
    for w, g, e in zip(want, got, exact):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        if not w.is_floating_point():
            assert torch.equal(w, g.to(w.device))
            continue
        w, g, e = w.double(), g.to(w.device).double(), e.to(w.device).double()
        assert torch.equal(w.isnan(), g.isnan()) and torch.equal(w.isinf(), g.isinf())
        finite = w.isfinite()
        if not finite.any():
            continue
        w, g, e = w[finite], g[finite], e[finite]
        scale = w.abs().max().clamp_min(1e-6)
        off_eager = ((g - w).abs().max() / scale).item()
        eager_off_exact = ((w - e).abs().max() / scale).item()
        if eager_off_exact <= tol:
            assert off_eager <= tol, f"{off_eager:.2e} from eager (eager is {eager_off_exact:.1e} from float32)"
        else:
            assert ((g - e).abs().max() / scale).item() <= eager_off_exact, f"further from float32 than eager ({eager_off_exact:.1e})"


def _masked_scores(b: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    mask = (torch.rand(b, t) > 0.3).float()
    mask[-1] = 0.0 if b > 1 else mask[-1]  # a padding-only row (every score masked), where eager's f16 rounding shows
    return torch.randn(b, 2, t, t), mask


class Elementwise(nn.Module):
    def forward(self, x, y):
        return torch.where(x > 0, torch.exp(-x) * y, torch.tanh(y) - x.sigmoid()).relu() + x.abs().sqrt()


class BiasGelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.b = nn.Parameter(torch.randn(24))

    def forward(self, x):
        return nn.functional.gelu(x + self.b)


class RowSum(nn.Module):
    def forward(self, x):
        return (x * x).sum(-1), x.amax(dim=1)


class Norms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(40)
        self.w = nn.Parameter(torch.randn(40))

    def forward(self, x, r):
        h = self.ln(x + r)
        rms = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        return h, rms


class NormByUnsqueeze(nn.Module):
    """LayerNorm with statistics taken without keepdim and unsqueezed back (one stitch kernel)."""

    def forward(self, x):
        mean = x.mean(-1).unsqueeze(-1)
        var = (x - mean).pow(2).mean(-1).unsqueeze(-1)
        return (x - mean) * torch.rsqrt(var + 1e-5)


class StatisticsThroughUnitDims(nn.Module):
    """Row and column statistics used and returned through unit-dim views: a row kernel writes
    ``s.unsqueeze(-1) * 2`` at its row, a column kernel ``x.amax(0).reshape(1, -1) + 1``."""

    def forward(self, x):
        s = x.sum(-1)
        return x / s.unsqueeze(-1).abs().clamp_min(1.0), s.unsqueeze(-1) * 2, x.amax(0).reshape(1, -1) + 1


class PartsOfAProducer(nn.Module):
    """Slices, a concat and a pad of a fused producer, all in its consumer's kernel (rotate_half)."""

    def forward(self, x, y):
        h = torch.tanh(x) * 2.0
        half = h.shape[-1] // 2
        rotated = torch.cat([-h[..., half:], h[..., :half]], dim=-1)
        return h * y + rotated, nn.functional.pad(torch.sigmoid(x), (1, 2)) + 1.0


class MaskedSoftmax(nn.Module):
    def forward(self, s, mask):
        return torch.softmax(s / 8.0 + (1.0 - mask[:, None, None, :]) * -10000.0, dim=-1)


class Movement(nn.Module):
    def forward(self, x, ids):
        a = torch.cat([x[:, 1:], x[:, :1] * 2], dim=1)
        b = nn.functional.pad(x, (1, 2))[:, :, 1:-2]
        c = torch.index_select(x, 0, ids)
        return a + b, c.transpose(1, 2).contiguous()


class ConcatThree(nn.Module):
    def forward(self, x, y):
        # Three parts: the third's offset is a sum (x's width + y's width).
        return torch.cat([x, y * 2, x - 1], dim=-1), torch.cat([y, x[:, :1], y], dim=1)


class ReshapeByWidth(nn.Module):
    """reshape(-1, 2 * b): the -1 is a run-time quotient of products, (a * b) // (2 * b)."""

    def forward(self, x):
        return x.reshape(-1, x.shape[1] * 2) * 2


class Attention(nn.Module):
    def __init__(self, h: int = 4, d: int = 8) -> None:
        super().__init__()
        self.h, self.d = h, d
        self.qkv = nn.Linear(h * d, 3 * h * d)
        self.o = nn.Linear(h * d, h * d)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split(self.h * self.d, dim=-1)
        heads = [z.view(b, t, self.h, self.d).transpose(1, 2) for z in (q, k, v)]
        p = torch.softmax(heads[0] @ heads[1].transpose(-1, -2) / self.d**0.5, dim=-1)
        return self.o((p @ heads[2]).transpose(1, 2).reshape(b, t, self.h * self.d))


class GroupedQueryAttention(nn.Module):
    """LLaMA's grouped-query attention: each K/V head serves ``h // kv`` query heads (``repeat_kv``)."""

    def __init__(self, h: int = 4, kv: int = 2, d: int = 8) -> None:
        super().__init__()
        self.h, self.kv, self.d = h, kv, d
        self.q = nn.Linear(h * d, h * d)
        self.k_and_v = nn.Linear(h * d, 2 * kv * d)
        self.o = nn.Linear(h * d, h * d)

    def forward(self, x):
        b, t, _ = x.shape
        h, kv, d = self.h, self.kv, self.d
        q = self.q(x).view(b, t, h, d).transpose(1, 2)
        k, v = (z.view(b, t, kv, d).transpose(1, 2) for z in self.k_and_v(x).split(kv * d, dim=-1))
        k, v = (z[:, :, None].expand(b, kv, h // kv, t, d).reshape(b, h, t, d) for z in (k, v))
        p = torch.softmax(q @ k.transpose(-1, -2) / d**0.5, dim=-1)
        return self.o((p @ v).transpose(1, 2).reshape(b, t, h * d))


class RepeatedRows(nn.Module):
    """A row broadcast to every row of a GEMM operand: rows of stride 0 are no matrix, so it is written out."""

    def __init__(self) -> None:
        super().__init__()
        self.row = nn.Parameter(torch.randn(1, 6))
        self.w = nn.Parameter(torch.randn(6, 5))

    def forward(self, y):
        return self.row.expand(y.shape[0], 6) @ self.w + y


class ConvPool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, groups=2)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        y = nn.functional.max_pool2d(y, 3, stride=2, padding=1)
        return self.c2(y).mean((2, 3))


class ConvChain(nn.Module):
    """Convolutions whose library calls compute their epilogues: bias + ReLU, bias alone (a
    grouped convolution), ReLU alone (no bias), bias + ReLU before a max-pool."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.c3 = nn.Conv2d(8, 8, 1, bias=False)
        self.c4 = nn.Conv2d(8, 4, 3, padding=(1, 2), dilation=(1, 2))

    def forward(self, x):
        y = self.c2(torch.relu(self.c1(x)))
        y = torch.relu(self.c4(torch.relu(self.c3(y))))
        return nn.functional.max_pool2d(y, 2, ceil_mode=True)


class PoolWithIndices(nn.Module):
    """Training's max-pool: values, indices and the backward that scatters through them.

    With ``conv``, the pool reads a ReLU'd convolution (NHWC after the layout
    passes, many equal zeros); without, the raw input (give it ties and NaNs).
    """

    def __init__(self, conv: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1) if conv else None

    def forward(self, x):
        y = torch.relu(self.conv(x)) if self.conv is not None else x
        values, indices = nn.functional.max_pool2d(y, 3, stride=2, padding=1, return_indices=True)
        gy = values * 2.0 + 1.0
        gx = torch.ops.aten.max_pool2d_with_indices_backward(gy, y, [3, 3], [2, 2], [1, 1], [1, 1], False, indices)
        return values, indices, gx


def ties_and_nans(*shape: int) -> torch.Tensor:
    """Small integers (so windows hold equal maxima), -inf, and NaNs in a few places."""
    x = torch.randint(-2, 3, shape).float()
    x[x == -2] = -float("inf")
    flat = x.view(-1)
    flat[:: max(1, flat.numel() // 3)] = float("nan")
    return x


MAYBE_BROADCAST = """
func @maybe_broadcast(%x: f32[a, n], %y: f32[c, n]) {
  sym a in [0, inf]
  sym n in [0, inf]
  sym c in [0, inf]
  %0 = dim(%x) {axis=0} : index(a)
  %1 = dim(%x) {axis=1} : index(n)
  %2 = broadcast_in_dim(%y, %0, %1) {dims=[0, 1]} : f32[a, n]
  %3 = mul(%x, %2) : f32[a, n]
  return %3
}
"""


class AttentionSavingForBackward(Attention):
    """What a training forward returns: the result plus values its backward reads, some transposed."""

    def forward(self, x):
        b, t, _ = x.shape
        mean = x.mean(-1, keepdim=True)
        rstd = torch.rsqrt((x - mean).pow(2).mean(-1, keepdim=True) + 1e-5)
        normed = (x - mean) * rstd
        q, k, v = self.qkv(normed).split(self.h * self.d, dim=-1)
        heads = [z.view(b, t, self.h, self.d).transpose(1, 2) for z in (q, k, v)]
        p = torch.softmax(heads[0] @ heads[1].transpose(-1, -2) / self.d**0.5, dim=-1)
        out = self.o((p @ heads[2]).transpose(1, 2).reshape(b, t, self.h * self.d))
        # normed flattened (a reshape written by the norm's row kernel), its row statistics,
        # the probabilities transposed (rows other than the one the softmax computes), and
        # v transposed (written by the loop that also feeds the context GEMM, which runs earlier).
        return out, normed.reshape(b * t, -1), mean, rstd, p.transpose(-1, -2), heads[2].transpose(-1, -2)


# BatchNorm's backward in miniature: a per-channel mean kept as [1, c, 1, 1], then a
# second-level sum over the same dims without keepdim. One kernel; each output is read
# at its own reduction's row index.
MIXED_KEEPDIM_SUMS = """
func @mixed_keepdim_sums(%x: f32[n, c, h, w]) {
  sym n in [0, inf]
  sym c in [0, inf]
  sym h in [0, inf]
  sym w in [0, inf]
  %0 = dim(%x) {axis=0} : index(n)
  %1 = dim(%x) {axis=1} : index(c)
  %2 = dim(%x) {axis=2} : index(h)
  %3 = dim(%x) {axis=3} : index(w)
  %4 = reduce(%x) {dims=[0, 2, 3], keepdim=true, kind="sum"} : f32[1, c, 1, 1]
  %5 = broadcast_in_dim(%4, %0, %1, %2, %3) {dims=[0, 1, 2, 3]} : f32[n, c, h, w]
  %6 = sub(%x, %5) : f32[n, c, h, w]
  %7 = mul(%6, %x) : f32[n, c, h, w]
  %8 = reduce(%7) {dims=[0, 2, 3], keepdim=false, kind="sum"} : f32[c]
  %9 = mul(%8, %8) : f32[c]
  return %4, %9
}
"""

# A strided, padded, grouped convolution and both its gradients (for a gy computed from y).
CONV_GRADIENTS = """
func @conv_gradients(%x: f32[n, 4, h, w], %k: f32[6, 2, 3, 3]) {
  sym n in [0, inf]
  sym h in [1, inf]
  sym w in [1, inf]
  %0 = dim(%x) {axis=0} : index(n)
  %1 = dim(%x) {axis=2} : index(h)
  %2 = dim(%x) {axis=3} : index(w)
  %3 = index_const() {value=4} : index(4)
  %4 = convolution(%x, %k) {channels_last=false, dilation=[1, 1], groups=2, output_padding=[], padding=[1, 1], stride=[2, 2], transposed=false} : f32[n, 6, (h + 1)//2, (w + 1)//2]
  %5 = mul(%4, %4) : f32[n, 6, (h + 1)//2, (w + 1)//2]
  %6 = convolution_backward_input(%5, %k, %0, %3, %1, %2) {channels_last=false, dilation=[1, 1], groups=2, padding=[1, 1], stride=[2, 2]} : f32[n, 4, h, w]
  %7 = convolution_backward_weight(%x, %5) {channels_last=false, dilation=[1, 1], groups=2, kernel=[3, 3], padding=[1, 1], stride=[2, 2]} : f32[6, 2, 3, 3]
  return %6, %7
}
"""


# The same in one spatial dim (wav2vec2's feature encoder): the library calls take 1-d geometry.
CONV1D_GRADIENTS = """
func @conv1d_gradients(%x: f32[n, 4, w], %k: f32[6, 2, 5]) {
  sym n in [0, inf]
  sym w in [1, inf]
  %0 = dim(%x) {axis=0} : index(n)
  %1 = dim(%x) {axis=2} : index(w)
  %2 = index_const() {value=4} : index(4)
  %3 = convolution(%x, %k) {channels_last=false, dilation=[1], groups=2, output_padding=[], padding=[2], stride=[2], transposed=false} : f32[n, 6, (w + 1)//2]
  %4 = mul(%3, %3) : f32[n, 6, (w + 1)//2]
  %5 = convolution_backward_input(%4, %k, %0, %2, %1) {channels_last=false, dilation=[1], groups=2, padding=[2], stride=[2]} : f32[n, 4, w]
  %6 = convolution_backward_weight(%x, %4) {channels_last=false, dilation=[1], groups=2, kernel=[5], padding=[2], stride=[2]} : f32[6, 2, 5]
  return %3, %5, %6
}
"""


class Powers(nn.Module):
    """pow by the exponents PyTorch computes as products, a square root or a reciprocal, and by one it does not."""

    def forward(self, x):
        y = x.abs() + 0.5
        return torch.pow(x, 2.0) + torch.pow(x, 3.0) - x**2, torch.pow(y, 0.5) + y**-1 + y**-2.0, y**2.5


# -- every elementwise op, one at a time, against the reference executor ------------------------
UNARY_F32 = [
    "neg",
    "abs",
    "sign",
    "exp",
    "expm1",
    "log",
    "log1p",
    "log2",
    "log10",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "tanh",
    "sigmoid",
    "sin",
    "cos",
    "erf",
    "tan",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "asinh",
    "acosh",
    "atanh",
    "floor",
    "ceil",
    "round",
    "relu",
    "isnan",
    "isinf",
    "logical_not",
    "gelu",
    "gelu_tanh",
    "silu",
]
BINARY_F32 = [
    "add",
    "sub",
    "mul",
    "div",
    "floor_div",
    "remainder",
    "fmod",
    "pow",
    "maximum",
    "minimum",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "logical_and",
    "logical_or",
    "logical_xor",
]
BINARY_I64 = [
    "add",
    "sub",
    "mul",
    "div",
    "floor_div",
    "remainder",
    "fmod",
    "maximum",
    "minimum",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "eq",
    "lt",
]


def op_graph(op: str, dtype: str, arity: int) -> Graph:
    g = Graph(name=f"op_{op}")
    n = g.constraints.declare("n", lo=0, source="test")
    xs = [g.add_input(f"x{i}", TensorType(dtype, (n,))) for i in range(arity)]
    g.outputs = [g.add(op, xs)]
    return g


def special_f32(n: int, gen: torch.Generator, op: str = "") -> torch.Tensor:
    """Random values and the special ones (signed zeros, tiny, inf, NaN), mostly in ``op``'s domain."""
    x = torch.randn(n, generator=gen) * 3
    x[:8] = torch.tensor([0.0, -0.0, 1e-7, -1e-7, 0.5, -2.5, float("inf"), float("nan")])[: min(8, n)]
    if op in ("asin", "acos", "atanh"):  # defined on [-1, 1]: most values inside, some outside (NaN)
        x = x / 4
        x[8:12] = torch.tensor([1.0, -1.0, 0.9999, -0.99999])[: max(0, min(4, n - 8))]
    if op == "acosh":  # defined from 1 up
        x = torch.where(x.isnan(), x, x.abs() + 1)
        x[8:11] = torch.tensor([1.0, 1.0000001, 0.5])[: max(0, min(3, n - 8))]
    if op in ("sinh", "cosh", "asinh"):
        x[8:12] = torch.tensor([-90.0, 100.0, 1e20, -3e30])[: max(0, min(4, n - 8))]  # overflow, and asinh's large branch
        # (not 88.7 < |x| < 89.4, where sinh and cosh are finite but torch's vectorised float forms give inf)
    return x


def floor_div_edge_cases() -> tuple[torch.Tensor, torch.Tensor]:
    """Quotients that round to an integer the exact one lies just below (floor(a / b) is off by one
    there), signed zeros, zero divisors and non-finite values."""
    a = torch.tensor(
        [3.323848247528076, -3.323848247528076, 1.0, -1.0, 0.5, -0.0, 0.0, 7.0, 1.0, -1.0, 0.0, float("inf"), float("nan"), 5.0]
    )
    b = torch.tensor(
        [-0.012220029719173908, 0.012220029719173908, 0.1, 0.1, -3.0, 2.0, -2.0, 0.0, float("inf"), float("inf"), 0.0, 2.0, 1.0, -1.25]
    )
    return a, b


def check_floor_div(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``got`` is torch's floor division of a by b: the same NaNs, values and zero signs."""
    want = torch.floor_divide(a, b)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~want.isnan()], want[~want.isnan()])
    assert torch.equal(torch.signbit(got[~want.isnan()]), torch.signbit(want[~want.isnan()]))


# 16-bit floats against eager in the same dtype: the backends compute in f32 and round once where
# a value is stored (eager rounds after every op), so the two differ by a few of the dtype's
# steps: 2^-8 for bf16's 8-bit significand, 2^-11 for f16's, relative to the output's largest value.
HALF_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 3e-3}
_BXS = {0: "b", 1: "s"}
HALF_CASES = {
    "elementwise": (Elementwise, lambda b, t: (torch.randn(b, t), torch.randn(b, t)), {"x": _BXS, "y": _BXS}),
    "bias_gelu": (BiasGelu, lambda b, t: (torch.randn(b, t, 24),), {"x": _BXS}),
    "row_reductions": (RowSum, lambda b, t: (torch.randn(b, t),), {"x": _BXS}),
    "layer_and_rms_norm": (Norms, lambda b, t: (torch.randn(b, t, 40), torch.randn(b, t, 40)), {"x": _BXS, "r": _BXS}),
    "masked_softmax": (MaskedSoftmax, _masked_scores, {"s": {0: "b", 2: "s", 3: "s"}, "mask": _BXS}),
    "attention_with_gemms": (Attention, lambda b, t: (torch.randn(b, t, 32),), {"x": _BXS}),
    "rotate_half_and_pad": (PartsOfAProducer, lambda b, t: (torch.randn(b, 2 * t), torch.randn(b, 2 * t)), {"x": _BXS, "y": _BXS}),
}


def half_case(case: str, dtype: torch.dtype) -> tuple[nn.Module, Callable[[int, int], tuple], dict]:
    """A HALF_CASES model in ``dtype``, its inputs at (batch, length) in ``dtype``, its dynamic dims."""
    model_type, inputs, dynamic = HALF_CASES[case]
    return model_type().to(dtype).eval(), lambda b, t: tuple(x.to(dtype) for x in inputs(b, t)), dynamic


HALF_POINTS = [(1, 1), (2, 5), (3, 33)]


class Scale(nn.Module):
    # One op: a GPU contracts x * a + b into one fused multiply-add (one rounding where eager has
    # two), which would make a single f32 result differ before the 16-bit rounding under test.
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1.7
