"""disc imports ``torch.export``'s program as it is, lowering composite ops (linear, layer_norm,
conv2d, batch_norm, ...) itself instead of running torch's decomposition pass.

Each model is compiled once and compared with eager at several shapes, 1-sized
and odd dims included; the report must say the decomposition pass was skipped.
Programs disc cannot take as they are (mutations, an op without a lowering, a
lowering that refuses) go through the decomposition pass, still correct.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import disc


class Encoder(nn.Module):
    """linear (2-D and 3-D inputs, with and without bias), chunk, masked_fill, layer_norm,
    softmax with a dtype, log_softmax, dropout, .T, to(dtype)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(12, 36)
        self.out = nn.Linear(12, 12, bias=False)
        self.norm = nn.LayerNorm(12)
        self.bare_norm = nn.LayerNorm(12, elementwise_affine=False)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(12, 3)

    def forward(self, x, mask):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = (q @ k.transpose(-1, -2)).masked_fill(mask[:, None, :] == 0, -1e4)
        attn = torch.softmax(scores, dim=-1, dtype=torch.float64).to(torch.float32)
        h = self.norm(x + self.drop(self.out(attn @ v)))
        pooled = torch.log_softmax(self.bare_norm(h).mean(dim=1), dim=-1)
        return self.head(pooled).T, h


class ConvNet(nn.Module):
    """conv2d (stride, padding, groups), batch_norm in eval mode, max_pool2d, flatten, conv1d."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=4, bias=False)
        self.line = nn.Conv1d(8, 4, 1)
        for buf in (self.bn.running_mean, self.bn.running_var):
            buf.uniform_(0.5, 1.5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = nn.functional.max_pool2d(self.grouped(y), 3, stride=2, padding=1)
        z = self.line(torch.flatten(y, 2))
        return torch.flatten(z, 1), y.new_ones(y.shape[0], 2) + torch.zeros(y.shape[0], 1)


def _check(model, make, dynamic, sizes):
    model.eval()
    cm = disc.compile(model, make(*sizes[0]), dynamic=dynamic)
    assert cm.report.decomposed_because is None
    assert "lowered as exported" in cm.report.text()
    assert not cm.report.fallbacks
    for size in sizes:
        args = make(*size)
        with torch.no_grad():
            torch.testing.assert_close(cm(*args), model(*args), rtol=1e-4, atol=1e-5)
    return cm


def test_transformer_block_lowers_without_decomposition():
    torch.manual_seed(0)

    def make(b, s):
        mask = torch.ones(b, s, dtype=torch.int64)
        mask[:, s // 2 + 1 :] = 0
        return torch.randn(b, s, 12), mask

    cm = _check(Encoder(), make, {"x": {0: "b", 1: "s"}, "mask": {0: "b", 1: "s"}}, [(2, 5), (1, 1), (3, 7), (1, 16)])
    assert sum(n.op == "dot_general" for n in cm.graph.nodes) == 5


def test_convnet_lowers_without_decomposition():
    torch.manual_seed(0)
    dynamic = {"x": {0: "n", 2: "h", 3: "w"}}
    cm = _check(ConvNet(), lambda n, h, w: (torch.randn(n, 3, h, w),), dynamic, [(2, 16, 20), (1, 1, 1), (3, 9, 7), (1, 33, 5)])
    assert sum(n.op == "convolution" for n in cm.graph.nodes) == 3


class Casts(nn.Module):
    """Every spelling of ``Tensor.to`` that casts: dtype, dtype with a device and layout
    (GPT-2's Conv1D path), device then dtype, another tensor's type."""

    def forward(self, x, ids):
        a = x.to(torch.float64) * 2
        b = ids.to(dtype=torch.float32, device=x.device) + x
        c = x.to(x.device, torch.float64, non_blocking=False) - a
        return a, b.to(ids) + ids, c.type_as(x)


def test_every_spelling_of_a_cast_lowers_without_decomposition():
    torch.manual_seed(0)

    def make(b, s):
        return torch.randn(b, s), torch.randint(-3, 9, (b, s))

    _check(Casts(), make, {"x": {0: "b", 1: "s"}, "ids": {0: "b", 1: "s"}}, [(2, 5), (1, 1), (3, 7)])


class PositionOps(nn.Module):
    """The ops T5's position buckets, Llama's rotary table and ViT's attention use:
    torch.min/max of two tensors, & | ^ on bool and int tensors, outer, unbind."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(4, 12)
        self.register_buffer("inv_freq", torch.tensor([1.0, 0.5, 0.25]))

    def forward(self, x, ids):
        q, k, v = self.qkv(x).unflatten(-1, (3, 4)).permute(2, 0, 1, 3).unbind(0)
        capped = torch.min(ids, torch.full_like(ids, 5)) + torch.max(ids, torch.ones_like(ids))
        near = (ids > 2) & (ids < 7) | (ids == 0) ^ (ids % 2 == 1)
        bits = (ids & 6) | (ids ^ 3)
        angles = torch.outer(torch.arange(x.shape[1], dtype=torch.float32), self.inv_freq)
        return q * k.sigmoid() + v, capped * near + bits, angles.cos()


def test_position_ops_lower_without_decomposition():
    torch.manual_seed(0)

    def make(b, s):
        return torch.randn(b, s, 4), torch.randint(0, 10, (b, s))

    _check(PositionOps(), make, {"x": {0: "b", 1: "s"}, "ids": {0: "b", 1: "s"}}, [(2, 6), (1, 1), (3, 7), (1, 13)])


class ShiftedWindows(nn.Module):
    """Swin's moves: pad each side up to a multiple of the window, roll by half a window both
    ways (shifts larger than small dims wrap), crop back."""

    def forward(self, x):
        h, w = x.shape[1], x.shape[2]
        padded = nn.functional.pad(x, (0, 0, 0, (4 - w % 4) % 4, 0, (4 - h % 4) % 4), value=0.5)
        shifted = torch.roll(padded, shifts=(-2, 3), dims=(1, 2))
        back = torch.roll(shifted * 2.0, shifts=(2, -3), dims=(1, 2))
        return back[:, :h, :w, :] + torch.roll(x, 5, 2)


def test_pad_and_roll_lower_without_decomposition():
    torch.manual_seed(0)

    def make(h, w):
        return (torch.randn(2, h, w, 3),)

    _check(ShiftedWindows(), make, {"x": {1: "h", 2: "w"}}, [(1, 1), (5, 7), (4, 8), (2, 3), (9, 1)])


class Attention(nn.Module):
    """F.scaled_dot_product_attention over 2 heads; queries from x, keys and values from y."""

    def __init__(self, variant: str) -> None:
        super().__init__()
        self.variant = variant
        self.q = nn.Linear(8, 8)
        self.kv = nn.Linear(8, 16)

    def forward(self, x, y, keep):
        q = self.q(x).unflatten(-1, (2, 4)).transpose(1, 2)
        k, v = (t.unflatten(-1, (2, 4)).transpose(1, 2) for t in self.kv(y).chunk(2, dim=-1))
        mask = None
        if self.variant == "bool-mask":
            mask = keep[:, None, None, :] > 0
        elif self.variant == "float-mask":
            mask = (keep[:, None, None, :] - 1.0) * 1e4 + torch.arange(2.0)[:, None, None]
        scale = 0.3 if self.variant == "scale" else None
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.variant == "causal", scale=scale)
        return out.transpose(1, 2).flatten(2)


@pytest.mark.parametrize("variant", ["plain", "causal", "bool-mask", "float-mask", "scale"])
def test_scaled_dot_product_attention_lowers_without_decomposition(variant):
    """Queries and keys of different dynamic lengths, 1 included; a bool mask that hides every
    key of one image gives that image 0, as eager does."""
    torch.manual_seed(0)

    def make(b, s, t):
        keep = torch.randint(0, 2, (b, t))
        keep[0] = 0
        return torch.randn(b, s, 8), torch.randn(b, t, 8), keep

    dynamic = {"x": {0: "b", 1: "s"}, "y": {0: "b", 1: "t"}, "keep": {0: "b", 1: "t"}}
    _check(Attention(variant), make, dynamic, [(2, 5, 7), (1, 1, 1), (3, 4, 1), (1, 9, 6)])


class MaskSelect(nn.Module):
    """A boolean-mask index: its count is data-dependent, and torch asserts it >= 0."""

    def forward(self, x):
        kept = x.flatten()[x.flatten() > 0]
        return kept * 2 + kept.shape[0], torch.tanh(x).sum(dim=1)


class SortFirst(nn.Module):
    def forward(self, x):
        values = torch.sort(x, dim=-1).values  # core ATen, with no lowering: a fallback
        return values * 2 + torch.tanh(x).sum(dim=1, keepdim=True)


def test_a_core_op_that_falls_back_does_not_send_the_program_to_decomposition():
    """Decomposing leaves core ATen ops as they are, so it cannot help them."""
    torch.manual_seed(0)
    cm = disc.compile(SortFirst(), (torch.randn(4, 6),), dynamic={"x": {0: "n", 1: "m"}})
    assert cm.report.decomposed_because is None
    assert cm.report.fallbacks == {"aten.sort.default": 1}
    for shape in [(4, 6), (1, 1), (3, 7), (1, 9)]:
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(cm(x), SortFirst()(x))


def test_a_boolean_mask_selection_and_its_count_are_compiled():
    """x[x > 0] gathers at the mask's nonzero positions; the count u0 is used as data too (the
    SymInt of torch's runtime assert lowers rather than falls back)."""
    torch.manual_seed(0)
    cm = disc.compile(MaskSelect(), (torch.randn(4, 6),), dynamic={"x": {0: "n", 1: "m"}})
    assert cm.report.fallbacks == {} and cm.report.decomposed_because is None
    assert [n.op for n in cm.graph.nodes].count("nonzero") == 1
    for shape in [(4, 6), (1, 1), (3, 7), (1, 9), (2, 5)]:
        x = torch.randn(shape)
        x[0, 0] = -1.0  # (1, 1): nothing kept
        with torch.no_grad():
            want = MaskSelect()(x)
            got = cm(x)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w)


class MaskRows(nn.Module):
    def forward(self, x):
        return torch.tanh(x[x[:, 0] > 0]) + 1  # a 1-D mask over dim 0


class MaskColumns(nn.Module):
    def forward(self, x):
        return x[:, x[0] > 0].sum(dim=0) * 2  # a mask over dim 1: the count is the middle dim


class MaskGrid(nn.Module):
    def forward(self, x):
        keep = x.sum(dim=-1) > 0  # [b, n] over [b, n, c]: two dims become one
        return torch.cat([x[keep], x[keep].amax(dim=-1, keepdim=True)], dim=-1)


@pytest.mark.parametrize("model, rank", [(MaskRows(), 2), (MaskColumns(), 2), (MaskGrid(), 3)], ids=["rows", "columns", "grid"])
def test_boolean_mask_selections_against_eager(model, rank):
    torch.manual_seed(0)
    shapes = {2: [(5, 7), (1, 1), (3, 1), (1, 6), (8, 33)], 3: [(2, 5, 4), (1, 1, 1), (3, 1, 7), (4, 9, 2)]}[rank]
    cm = disc.compile(model, (torch.randn(*shapes[0]),), dynamic={"x": {k: "abc"[k] for k in range(rank)}})
    assert cm.report.fallbacks == {}
    assert cm.report.backend.name == "native-cpu", cm.report.backend.reason  # the nonzero runs in the host flow
    for k, shape in enumerate(shapes):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(k))
        if k == 1:
            x = -x.abs()  # nothing kept
        with torch.no_grad():
            want, got = model(x), cm(x)
        assert got.shape == want.shape, (shape, got.shape, want.shape)
        torch.testing.assert_close(got, want)


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return x * 2


class InPlace(nn.Module):
    def forward(self, x):
        y = x * 2
        y.relu_()
        return y + 1


class Refused(nn.Module):
    def forward(self, x):
        return nn.functional.adaptive_avg_pool2d(x.unsqueeze(1), 2) * 2  # only 1x1 outputs lower


@pytest.mark.parametrize(
    "model, why",
    [
        (InPlace(), "relu_.default mutates its input"),
        (Refused(), "adaptive_avg_pool2d.default fell back to PyTorch"),
    ],
    ids=["in-place-op", "lowering-refuses"],
)
def test_programs_disc_cannot_take_as_they_are_are_decomposed(model, why):
    cm = disc.compile(model, (torch.randn(5, 4),), dynamic={"x": {0: "n"}})
    assert why in (cm.report.decomposed_because or "")
    assert "decomposed to core ATen" in cm.report.text()
    for n in (1, 3, 8):
        x = torch.randn(n, 4)
        with torch.no_grad():
            torch.testing.assert_close(cm(x), model(x))


def test_a_forward_writing_a_buffer_is_refused_with_the_buffer_named():
    with pytest.raises(disc.CompileError, match=r"Counter.forward writes buffer 'calls' in place.*backend='disc'"):
        disc.compile(Counter(), (torch.randn(5, 4),), dynamic={"x": {0: "n"}})
    train_norm = nn.Sequential(nn.BatchNorm1d(4)).train()
    with pytest.raises(disc.CompileError, match=r"writes buffer '0.num_batches_tracked', buffer '0.running_mean'"):
        disc.compile(train_norm, (torch.randn(5, 4),), dynamic={"input": {0: "n"}})


class Norms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.gn = nn.GroupNorm(2, 4)

    def forward(self, x):
        return self.ln(x), self.gn(x.reshape(x.shape[0], 4, 2))


def test_a_norm_whose_squared_deviations_overflow_is_nan_not_a_finite_zero():
    """Issue 48: rows of ~1e20 made the variance inf, rstd 0 and every output a finite, wrong 0;
    eager gives NaN there. Rows that fit are still normalised right, beside them in one call."""
    torch.manual_seed(0)
    m = Norms()
    cm = disc.compile(m, (torch.randn(3, 8),), dynamic={"x": {0: "n"}})
    for rows in (1, 2, 5):
        x = torch.randn(rows, 8)
        x[0] *= 1e20  # the first row overflows, the others are ordinary
        for got, want in zip(cm(x), m(x)):
            assert got[0].isnan().all(), got
            torch.testing.assert_close(got[1:], want[1:], rtol=1e-5, atol=1e-5)
        assert m(x)[0][0].isnan().all()  # eager's LayerNorm; its GroupNorm gives NaN or 0 by the values
