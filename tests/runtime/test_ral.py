"""The CPU RAL (ral_cpu.cc) against torch: strided batched GEMM, conv2d, errors, threads.

Every test runs on both builds: oneDNN (skipped where it is not installed) and the builtin
fallbacks (always available).
"""

import contextlib
import ctypes
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from disc.codegen.cpu import toolchain
from disc.errors import CompileError, RuntimeFailure
from disc.runtime import ral as ral_mod
from disc.runtime.ral import Conv2dArgs, Ctx, GemmArgs, RalTable, load_ral

VARIANTS = [
    pytest.param("dnnl", marks=pytest.mark.skipif(not toolchain.have_dnnl(), reason="oneDNN not installed")),
    "builtin",
]


@pytest.fixture(scope="module", params=VARIANTS)
def ral(request):
    return load_ral(request.param)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if ref.numel() == 0:
        return 0.0
    return float((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1.0))


def ref_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a.double(), b.double())


def test_library_name(ral):
    if ral.path.name.startswith("ral_cpu_builtin"):
        assert ral.gemm_library == "builtin"
    else:
        assert ral.gemm_library.startswith("oneDNN 3.")
    assert ral.table == ctypes.cast(ctypes.pointer(ral.functions), ctypes.c_void_p).value


def test_ctypes_layout_matches_the_header():
    # Offsets and sizes as the C compiler sees them, against the ctypes mirrors.
    structs = {"disc_ral_ctx": Ctx, "disc_gemm_args": GemmArgs, "disc_conv2d_args": Conv2dArgs, "disc_ral": RalTable}
    lines = ["#include <stddef.h>", '#include "ral.h"', 'extern "C" long long disc_layout(int i) {', "  const long long v[] = {"]
    expected = []
    for cname, py in structs.items():
        lines.append(f"    (long long)sizeof({cname}),")
        expected.append(ctypes.sizeof(py))
        for field, *_ in py._fields_:
            lines.append(f"    (long long)offsetof({cname}, {field}),")
            expected.append(getattr(py, field).offset)
    lines += ["  };", "  return v[i];", "}"]
    lib = ctypes.CDLL(str(toolchain.build("\n".join(lines), "ral_layout").path))
    lib.disc_layout.restype = ctypes.c_longlong
    assert [lib.disc_layout(i) for i in range(len(expected))] == expected


def _operand(rows: int, cols: int, how: str) -> torch.Tensor:
    """A rows x cols view with the requested strides."""
    if how == "n":
        return torch.randn(rows, cols)
    if how == "t":
        return torch.randn(cols, rows).t()
    if how == "gap":  # no unit stride: every other column of a wider buffer
        return torch.randn(rows, 2 * cols + 1)[:, : 2 * cols : 2]
    if how == "row0":  # stride 0 along rows (one row repeated)
        return torch.randn(1, cols).expand(rows, cols)
    if how == "col0":
        return torch.randn(rows, 1).expand(rows, cols)
    raise AssertionError(how)


@pytest.mark.parametrize("m", [0, 1, 2, 17])
@pytest.mark.parametrize("n", [0, 1, 3, 33])
@pytest.mark.parametrize("k", [0, 1, 5, 64])
def test_gemm_small_and_degenerate(ral, m, n, k):
    for ha in ("n", "t"):
        for hb in ("n", "t"):
            a, b = _operand(m, k, ha), _operand(k, n, hb)
            assert rel_err(ral.gemm(a, b), ref_mm(a, b)) <= 1e-4, (ha, hb)


@pytest.mark.parametrize("ha", ["n", "t", "gap", "row0", "col0"])
@pytest.mark.parametrize("hb", ["n", "t", "gap", "row0", "col0"])
def test_gemm_strides(ral, ha, hb):
    a, b = _operand(37, 300, ha), _operand(300, 45, hb)  # k > one depth block of the builtin
    assert rel_err(ral.gemm(a, b), ref_mm(a, b)) <= 1e-4


@pytest.mark.parametrize("mnk", [(200, 600, 70), (1, 700, 513), (300, 1, 40), (96, 64, 1)])
def test_gemm_larger(ral, mnk):
    m, n, k = mnk
    a, b = torch.randn(m, k), torch.randn(k, n)
    assert rel_err(ral.gemm(a, b), ref_mm(a, b)) <= 1e-4


def test_gemm_degenerate_strides_are_ignored(ral):
    # Strides of size-1 dims are arbitrary (here 0 and huge); oneDNN would reject them as ld.
    a = torch.randn(1, 8).as_strided((1, 8), (0, 1))
    b = torch.randn(8, 1).as_strided((8, 1), (1, 12345))
    out = torch.randn(1, 1).as_strided((1, 1), (0, 7))
    ral.gemm(a, b, out)
    assert rel_err(out, ref_mm(a, b)) <= 1e-4
    a = torch.randn(5, 1).as_strided((5, 1), (1, 0))  # k == 1 with column stride 0
    b = torch.randn(1, 6).as_strided((1, 6), (0, 1))
    assert rel_err(ral.gemm(a, b), ref_mm(a, b)) <= 1e-4


def test_gemm_alpha_beta(ral):
    a, b = torch.randn(9, 20).t(), torch.randn(9, 11)  # a: 20 x 9 transposed view
    c0 = torch.randn(20, 11)
    out = c0.clone()
    ral.gemm(a, b, out, beta=1.0)
    assert rel_err(out, ref_mm(a, b) + c0.double()) <= 1e-4
    out = c0.clone()
    ral.gemm(a, b, out, alpha=0.5, beta=-2.0)
    assert rel_err(out, 0.5 * ref_mm(a, b) - 2 * c0.double()) <= 1e-4
    out = torch.full((20, 11), float("nan"))
    ral.gemm(a, b, out, beta=0.0)  # beta == 0 overwrites, NaNs included
    assert rel_err(out, ref_mm(a, b)) <= 1e-4
    out = c0.clone()
    ral.gemm(torch.randn(20, 0), torch.randn(0, 11), out, beta=3.0)  # k == 0: C = beta * C
    assert torch.allclose(out, 3 * c0)


@pytest.mark.parametrize("bsh", [(2, 3, 13, 8), (1, 12, 16, 64)])
def test_gemm_attention_views(ral, bsh):
    B, h, S, D = bsh
    qkv = torch.randn(B, S, 3 * h * D)
    q, k, v = (t.view(B, S, h, D).transpose(1, 2) for t in qkv.split(h * D, dim=-1))  # [B, h, S, D] strided
    scores = ral.gemm(q, k.transpose(-1, -2), alpha=D**-0.5)
    assert rel_err(scores, ref_mm(q, k.transpose(-1, -2)) * D**-0.5) <= 1e-4
    p = torch.softmax(scores, dim=-1)
    ctx_buf = torch.zeros(B, S, h * D)
    out = ctx_buf.view(B, S, h, D).transpose(1, 2)  # written in place into the [B, S, h*D] layout
    ral.gemm(p, v, out)
    assert rel_err(ctx_buf, ref_mm(p, v).transpose(1, 2).reshape(B, S, h * D)) <= 1e-4


@pytest.mark.parametrize("rows, width_x, width_dy", [(128, 256, 1024), (300, 1024, 256), (64, 512, 512), (97, 256, 768)])
def test_gemm_weight_gradient_layouts(ral, rows, width_x, width_dy):
    """dW = dY^T @ X: both operands hold k along their rows; with row strides that are multiples
    of 256 floats the oneDNN build copies them into padded rows first (slow in dnnl_sgemm)."""
    x, dy = torch.randn(rows, width_x), torch.randn(rows, width_dy)
    assert rel_err(ral.gemm(dy.t(), x), ref_mm(dy.t(), x)) <= 1e-4
    # narrower views of the same buffers (row strides stay 256-multiples), accumulated into a
    # strided output: the copy takes only the viewed columns, beta and alpha still apply
    a, b = dy[:, 3 : width_dy - 5].t(), x[:, : width_x - 7]
    c0 = torch.randn(a.shape[0], b.shape[1] + 9)
    out = c0.clone()
    ral.gemm(a, b, out[:, : b.shape[1]], alpha=0.5, beta=1.0)
    assert rel_err(out[:, : b.shape[1]], 0.5 * ref_mm(a, b) + c0[:, : b.shape[1]].double()) <= 1e-4
    assert torch.equal(out[:, b.shape[1] :], c0[:, b.shape[1] :])


def test_gemm_batch_broadcast(ral):
    a, b = torch.randn(4, 7, 10, 6), torch.randn(6, 5)  # shared B: folded into one taller GEMM
    assert rel_err(ral.gemm(a, b), ref_mm(a, b)) <= 1e-4
    a, b = torch.randn(2, 1, 3, 4), torch.randn(5, 4, 6)  # batch dims broadcast both ways
    assert rel_err(ral.gemm(a, b), ref_mm(a, b)) <= 1e-4
    a, b = torch.randn(64, 8, 16), torch.randn(64, 16, 8).transpose(-1, -2).contiguous().transpose(-1, -2)
    assert rel_err(ral.gemm(a, b), ref_mm(a, b)) <= 1e-4  # many small GEMMs: parallel over the batch
    a, b = torch.randn(3, 0, 4), torch.randn(3, 4, 2)
    assert ral.gemm(a, b).shape == (3, 0, 2)
    assert ral.gemm(torch.randn(0, 2, 4), torch.randn(4, 3)).shape == (0, 2, 3)


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (1, 16, 64), (7, 5, 3), (9, 17, 64), (16, 64, 16), (33, 33, 64), (48, 64, 48)])
def test_batches_of_tiny_gemms(ral, m, n, k):
    """Attention's per-head products at a few tokens (Q @ K^T with K^T read along its columns,
    P @ V with V's rows strided in a wider buffer) are summed by the RAL's own loop; the library
    gives the same products when it is turned off."""
    heads = 4
    qkv = torch.randn(heads, max(m, n, k), 3 * 64)  # a fused projection's output, viewed per head
    q = qkv[:, :m, :k]
    key_t = qkv[:, :n, 64 : 64 + k].transpose(-1, -2)  # [heads, k, n]: unit row stride
    p = torch.randn(heads, m, k).transpose(-1, -2).contiguous().transpose(-1, -2)  # column-major A
    v = qkv[:, :k, 128 : 128 + n]
    calls = ral.cache_entries()["tiny_gemm_calls"]
    for a, b in ((q, key_t), (p, v)):
        c0 = torch.randn(heads, m, n + 3)[..., :n]
        out = c0.clone()
        ral.gemm(a, b, out, alpha=0.125, beta=-0.5)
        assert rel_err(out, 0.125 * ref_mm(a, b) - 0.5 * c0.double()) <= 1e-5
        nan_c = torch.full((heads, m, n), float("nan"))
        assert rel_err(ral.gemm(a, b, nan_c), ref_mm(a, b)) <= 1e-5  # beta 0 overwrites what C held
        previous = ral.set_tiny_gemm(False)
        try:
            assert rel_err(ral.gemm(a, b), ref_mm(a, b)) <= 1e-5
        finally:
            ral.set_tiny_gemm(previous)
    assert ral.cache_entries()["tiny_gemm_calls"] == calls + 4


def test_large_batched_gemms_keep_the_library(ral):
    a, b = torch.randn(4, 96, 64), torch.randn(4, 64, 96)  # 96 * 96 * 64 multiply-adds a head: too many
    calls = ral.cache_entries()["tiny_gemm_calls"]
    assert rel_err(ral.gemm(a, b), ref_mm(a, b)) <= 1e-5
    assert ral.cache_entries()["tiny_gemm_calls"] == calls


def test_gemm_errors_are_reported(ral):
    a, b = torch.randn(2, 3), torch.randn(3, 2)
    out = torch.empty(2, 2)
    args = GemmArgs(m=2, n=2, k=3, batch_rank=0, alpha=1.0, beta=0.0)
    args.a, args.a_rs, args.a_cs = a.data_ptr(), 3, 1
    args.b, args.b_rs, args.b_cs = b.data_ptr(), 2, 1
    args.c, args.c_rs = out.data_ptr(), 0  # overlapping rows of C
    with pytest.raises(RuntimeFailure, match="C rows overlap"):
        ral.call_gemm(args)
    args.c_rs, args.batch_rank = 2, 7
    with pytest.raises(RuntimeFailure, match="batch_rank"):
        ral.call_gemm(args)


def _pad4(p):
    if isinstance(p, int):
        return (p, p, p, p)
    return (p[0], p[0], p[1], p[1]) if len(p) == 2 else tuple(p)


# n, ci, h, w, co, (kh, kw), stride, padding (int | (h, w) | (top, bottom, left, right)), dilation, groups
CONV_CASES = [
    (2, 3, 11, 13, 8, (3, 3), 1, 1, 1, 1),
    (1, 4, 9, 9, 6, (3, 3), 2, 0, 1, 1),
    (2, 8, 10, 7, 8, (3, 3), 1, 1, 1, 8),  # depthwise
    (1, 8, 12, 12, 12, (3, 5), (2, 1), (1, 2), (2, 1), 4),
    (3, 16, 5, 6, 32, (1, 1), 1, 0, 1, 1),
    (1, 16, 9, 9, 24, (1, 1), 2, 0, 1, 1),  # strided 1x1 (ResNet downsample)
    (1, 4, 1, 1, 5, (1, 1), 1, 0, 1, 1),  # 1x1 spatial
    (1, 3, 1, 8, 4, (3, 3), 1, 1, 1, 1),  # H == 1 with padding
    (2, 3, 15, 15, 16, (7, 7), 2, 3, 1, 1),  # ResNet stem
    (1, 4, 8, 9, 4, (3, 3), 1, (0, 2, 1, 0), 1, 1),  # asymmetric padding
    (1, 4, 8, 8, 6, (3, 3), 2, (1, 0, 0, 1), 2, 2),  # asymmetric + dilation + groups
    (1, 32, 14, 14, 32, (3, 3), 1, 2, 2, 32),  # dilated depthwise
]


@pytest.mark.parametrize("case", CONV_CASES, ids=range(len(CONV_CASES)))
def test_conv2d(ral, case):
    n, ci, h, w, co, (kh, kw), stride, padding, dilation, groups = case
    x, wt = torch.randn(n, ci, h, w), torch.randn(co, ci // groups, kh, kw)
    top, bottom, left, right = _pad4(padding)
    ref = F.conv2d(F.pad(x.double(), (left, right, top, bottom)), wt.double(), None, stride, 0, dilation, groups)
    for constant in (False, True):
        out = ral.conv2d(x, wt, stride, padding, dilation, groups, weight_is_constant=constant)
        assert out.shape == ref.shape
        assert rel_err(out, ref) <= 1e-4
    # NHWC in, NHWC out (what compiled programs pass)
    out = ral.conv2d(x.permute(0, 2, 3, 1), wt, stride, padding, dilation, groups, weight_is_constant=True, channels_last=True)
    assert out.shape == ref.permute(0, 2, 3, 1).shape
    assert rel_err(out, ref.permute(0, 2, 3, 1)) <= 1e-4


@pytest.mark.parametrize("case", CONV_CASES, ids=range(len(CONV_CASES)))
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_conv2d_gradients(ral, case, channels_last):
    n, ci, h, w, co, (kh, kw), stride, padding, dilation, groups = case
    top, bottom, left, right = _pad4(padding)
    if (top, left) != (bottom, right):
        pytest.skip("autograd's reference needs symmetric padding")
    x = torch.randn(n, ci, h, w, dtype=torch.float64, requires_grad=True)
    wt = torch.randn(co, ci // groups, kh, kw, dtype=torch.float64, requires_grad=True)
    y = F.conv2d(x, wt, None, stride, (top, left), dilation, groups)
    gy = torch.randn_like(y)
    y.backward(gy)
    to_nhwc = (lambda t: t.permute(0, 2, 3, 1)) if channels_last else (lambda t: t)
    gx, gw = ral.conv2d_gradients(to_nhwc(x.detach().float()), wt.detach().float(), to_nhwc(gy.float()), stride, padding, dilation, groups, channels_last=channels_last)
    assert rel_err(gx, to_nhwc(x.grad)) <= 1e-4
    assert rel_err(gw, wt.grad) <= 1e-4


def test_conv2d_gradients_of_empty_problems(ral):
    gx, gw = ral.conv2d_gradients(torch.randn(0, 3, 5, 5), torch.randn(4, 3, 3, 3), torch.randn(0, 4, 3, 3))
    assert gx.shape == (0, 3, 5, 5) and gw.shape == (4, 3, 3, 3) and not gw.any()
    with pytest.raises(ValueError, match="gy has shape"):
        ral.conv2d_gradients(torch.randn(1, 3, 5, 5), torch.randn(4, 3, 3, 3), torch.randn(1, 4, 5, 5))


def test_conv2d_constant_weight_cache(ral):
    x, wt = torch.randn(2, 16, 10, 10), torch.randn(32, 16, 3, 3)
    before = ral.cache_entries()["packed_weights"]
    first = ral.conv2d(x, wt, 1, 1, weight_is_constant=True)
    after_first = ral.cache_entries()["packed_weights"]
    second = ral.conv2d(x, wt, 1, 1, weight_is_constant=True)
    assert ral.cache_entries()["packed_weights"] == after_first  # a hit: nothing new packed
    assert after_first - before in (0, 1)  # 1 when oneDNN wants a blocked weight format
    assert torch.equal(first, second)
    assert rel_err(first, F.conv2d(x.double(), wt.double(), None, 1, 1)) <= 1e-4
    ral.conv2d(torch.randn(1, 16, 12, 9), wt, 1, 1, weight_is_constant=True)  # another input shape
    assert ral.cache_entries()["packed_weights"] - after_first <= 1  # shares the copy when the layout matches
    wt.mul_(-2.0)  # breaks the constant contract; the sampled-values guard repacks
    third = ral.conv2d(x, wt, 1, 1, weight_is_constant=True)
    assert rel_err(third, F.conv2d(x.double(), wt.double(), None, 1, 1)) <= 1e-4


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("bias, relu", [(True, True), (True, False), (False, True)], ids=["bias+relu", "bias", "relu"])
def test_conv2d_epilogue(ral, channels_last, bias, relu):
    for shape, wshape, groups in [((2, 5, 9, 7), (6, 5, 3, 3), 1), ((1, 4, 1, 1), (4, 2, 3, 3), 2), ((3, 3, 16, 13), (8, 3, 1, 1), 1)]:
        x, wt = torch.randn(shape), torch.randn(wshape)
        b = torch.randn(wshape[0]) if bias else None
        want = F.conv2d(x.double(), wt.double(), b.double() if bias else None, 1, 1, 1, groups)
        want = want.relu() if relu else want
        if channels_last:
            x, want = x.permute(0, 2, 3, 1).contiguous(), want.permute(0, 2, 3, 1)
        got = ral.conv2d(x, wt, 1, 1, 1, groups, channels_last=channels_last, bias=b, relu=relu, weight_is_constant=True)
        assert rel_err(got, want) <= 1e-4, (shape, wshape)
        if relu:
            assert (got >= 0).all()
    # No input channels: the convolution is 0 and the epilogue still runs.
    got = ral.conv2d(torch.randn(1, 0, 4, 4), torch.randn(3, 0, 3, 3), 1, 1, bias=torch.tensor([-1.0, 0.5, 2.0]), relu=relu)
    assert torch.equal(got[0, :, 0, 0], torch.tensor([0.0 if relu else -1.0, 0.5, 2.0]))
    with pytest.raises(ValueError, match="bias must be a contiguous vector of 3"):
        ral.conv2d(torch.randn(1, 2, 4, 4), torch.randn(3, 2, 3, 3), bias=torch.randn(4))


def test_conv2d_empty_and_errors(ral):
    assert ral.conv2d(torch.randn(0, 3, 5, 5), torch.randn(4, 3, 3, 3)).shape == (0, 4, 3, 3)
    out = ral.conv2d(torch.randn(2, 0, 5, 5), torch.randn(4, 0, 3, 3))
    assert out.shape == (2, 4, 3, 3) and not out.any()
    x, wt = torch.randn(1, 3, 5, 5), torch.randn(4, 3, 3, 3)
    y = torch.empty(1, 4, 9, 9)
    args = Conv2dArgs(n=1, ci=3, h=5, w=5, co=4, kh=3, kw=3, oh=9, ow=9, groups=1)  # wrong output extent
    args.stride[:], args.dilation[:] = (1, 1), (1, 1)
    args.input, args.weight, args.output = x.data_ptr(), wt.data_ptr(), y.data_ptr()
    with pytest.raises(RuntimeFailure, match="output extent"):
        ral.call_conv2d(args)
    args.oh, args.ow, args.groups = 3, 3, 2
    with pytest.raises(RuntimeFailure, match="groups"):
        ral.call_conv2d(args)


def test_concurrent_calls(ral, run_in_threads):
    # Four threads, each with its own shapes, mixing conv2d (shared primitive and weight caches)
    # and gemm; ctypes releases the GIL, so the calls really overlap.
    errors: list[str] = []

    def worker(tid: int) -> None:
        torch.manual_seed(tid)
        wt = torch.randn(8 + 4 * tid, 6, 3, 3)
        for it in range(6):
            x = torch.randn(1 + it % 2, 6, 9 + tid, 11)
            out = ral.conv2d(x, wt, 1 + tid % 2, 1, weight_is_constant=True)
            ref = F.conv2d(x.double(), wt.double(), None, 1 + tid % 2, 1)
            if rel_err(out, ref) > 1e-4:
                errors.append(f"conv thread {tid} iter {it}")
            a, b = torch.randn(3, 20 + tid, 30 + it), torch.randn(30 + it, 40 - tid).t().contiguous().t()
            if rel_err(ral.gemm(a, b), ref_mm(a, b)) > 1e-4:
                errors.append(f"gemm thread {tid} iter {it}")

    run_in_threads(worker, 4)
    assert errors == []


def test_without_dnnl_the_builtin_is_selected(monkeypatch):
    monkeypatch.setenv("DISC_NO_DNNL", "1")
    assert not toolchain.have_dnnl()
    assert load_ral().gemm_library == "builtin"
    with pytest.raises(CompileError, match="oneDNN"):
        load_ral("dnnl")
    assert ral_mod.build_ral("auto").path.name == "ral_cpu_builtin.so"


needs_dnnl = pytest.mark.skipif(not toolchain.have_dnnl(), reason="oneDNN not installed")


@needs_dnnl
def test_gemm_routine_is_chosen_by_shape():
    # A weight stored [n, k] with k >= 2n and at least 16 rows goes to the matmul primitive;
    # fewer rows, a [k, n] weight or k < 2n stay on dnnl_sgemm (no plan is created for them).
    ral = load_ral("dnnl")
    cases = [((16, 64, 32), "t", True), ((33, 3 * 64 + 5, 64), "t", True), ((15, 64, 32), "t", False),
             ((64, 64, 32), "n", False), ((64, 64, 48), "t", False), ((4096, 512, 256), "t", True),
             ((4097, 512, 256), "t", False)]  # m * n <= 2^20
    for (m, k, n), hb, matmul in cases:
        a, b = torch.randn(m, k), _operand(k, n, hb)
        before = ral.cache_entries()["matmul_plans"]
        assert rel_err(ral.gemm(a, b), ref_mm(a, b)) <= 1e-4, (m, k, n, hb)
        assert (ral.cache_entries()["matmul_plans"] > before) == matmul, (m, k, n, hb)
        before = ral.cache_entries()["matmul_plans"]
        ral.gemm(torch.randn(m, k), b)  # the same shape again reuses its plan
        assert ral.cache_entries()["matmul_plans"] == before


@needs_dnnl
def test_matmul_plans_are_kept_least_recently_used_first_out():
    # A decoder meets a new m every step: plans stay bounded, and the recent ones are hits.
    ral = load_ral("dnnl")
    b = _operand(96, 32, "t")  # k = 96: a shape no other test uses
    first = ral.cache_entries()["matmul_plans_built"]
    for m in range(16, 16 + 300):
        a = torch.randn(m, 96)
        assert rel_err(ral.gemm(a, b), ref_mm(a, b)) <= 1e-4, m
    after = ral.cache_entries()
    assert after["matmul_plans_built"] - first == 300
    assert after["matmul_plans"] == 256  # the capacity, not every m seen
    ral.gemm(torch.randn(16 + 299, 96), b)  # the most recent: still there
    assert ral.cache_entries()["matmul_plans_built"] == after["matmul_plans_built"]
    a = torch.randn(16, 96)  # the oldest: dropped, built again, and still right
    assert rel_err(ral.gemm(a, b), ref_mm(a, b)) <= 1e-4
    assert ral.cache_entries()["matmul_plans_built"] == after["matmul_plans_built"] + 1
    assert ral.cache_entries()["matmul_plans"] == 256


_FORCED_MATMUL = r"""
import torch
from disc.runtime.ral import load_ral
ral = load_ral("dnnl")
def op(r, c, how):
    return {"n": lambda: torch.randn(r, c), "t": lambda: torch.randn(c, r).t(),
            "gap": lambda: torch.randn(r, 2 * c + 1)[:, : 2 * c : 2]}[how]()
worst = 0.0
for m, n, k in [(1, 1, 1), (1, 7, 5), (17, 1, 64), (2, 33, 1), (37, 45, 300), (200, 600, 70)]:
    for ha in ("n", "t", "gap"):
        for hb in ("n", "t", "gap"):
            a, b = op(m, k, ha), op(k, n, hb)
            out = torch.randn(m, 2 * n + 3)[:, :n]  # C with a row stride wider than n
            ral.gemm(a, b, out)
            ref = a.double() @ b.double()
            worst = max(worst, float((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1.0)))
x = torch.randn(2, 3, 13, 8)
y = torch.randn(2, 3, 8, 13)
worst = max(worst, float((ral.gemm(x, y).double() - x.double() @ y.double()).abs().max()))
print(worst, ral.cache_entries()["matmul_plans"])
"""


@needs_dnnl
def test_gemm_forced_through_the_matmul_primitive():
    # DISC_RAL_GEMM=matmul sends every GEMM the primitive can take (no packing, alpha 1, beta 0)
    # through it: degenerate extents, transposed and gapped operands, a strided C, batches.
    import os
    import subprocess
    import sys

    env = {**os.environ, "DISC_RAL_GEMM": "matmul"}
    out = subprocess.run([sys.executable, "-c", _FORCED_MATMUL], env=env, capture_output=True, text=True, check=True).stdout
    worst, plans = out.split()
    assert float(worst) <= 1e-4
    assert int(plans) > 10


class _TwoConvs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(16, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 32, 3, padding=1)

    def forward(self, x):
        return self.c2(torch.relu(self.c1(x)))


@needs_dnnl
def test_packed_weights_go_with_the_last_program_that_reads_them():
    import gc

    import disc

    ral = load_ral()
    model, x = _TwoConvs().eval(), torch.randn(1, 16, 20, 20)
    start = ral.cache_entries()["packed_weights"]
    with torch.no_grad():
        first = disc.compile(model, (x,), dynamic={"x": {2: "h", 3: "w"}})
        second = disc.compile(model, (x,), dynamic={"x": {2: "h", 3: "w"}})  # the same weights
        want = model(x)
        torch.testing.assert_close(first(x), want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(second(x), want, rtol=1e-4, atol=1e-4)
    packed = ral.cache_entries()["packed_weights"] - start
    if packed == 0:
        pytest.skip("oneDNN takes these weights as they are on this CPU: nothing is packed")
    assert packed == 2  # one packed copy per conv weight, shared by both programs
    del first
    gc.collect()
    assert ral.cache_entries()["packed_weights"] - start == packed  # the second still reads them
    with torch.no_grad():
        torch.testing.assert_close(second(x), want, rtol=1e-4, atol=1e-4)
    del second
    gc.collect()
    assert ral.cache_entries()["packed_weights"] == start


@needs_dnnl
def test_a_weight_packed_in_two_layouts_serves_each_shape_its_own():
    # oneDNN 3.x's AVX2 brgemm convolution blocks the output channels by 16 or 24 depending on
    # the spatial size (64 -> 64 channels: 24 at 32x32, 16 at 56x56 on a 2-core AVX2 EPYC), and
    # one constant weight is then packed once per blocking. Each shape must read the copy in its
    # own plan's layout, also when the shapes alternate.
    import disc

    ral = load_ral()
    conv = nn.Conv2d(64, 64, 3, padding=1).eval()
    start = ral.cache_entries()["packed_weights"]
    with torch.no_grad(), winograd(ral, 0):  # oneDNN's kernels, not the RAL's Winograd one
        compiled = disc.compile(conv, (torch.randn(1, 64, 32, 32),), dynamic={"input": {2: "h", 3: "w"}})
        for hw in (32, 56, 32, 56, 17):
            x = torch.randn(1, 64, hw, hw)
            torch.testing.assert_close(compiled(x), conv(x), rtol=1e-4, atol=1e-4)
    packed = ral.cache_entries()["packed_weights"] - start
    assert 1 <= packed <= 3  # one copy per layout oneDNN asked for (2 here), not one per call (5)


STEMS = [  # (x NHWC, w OIHW, stride, padding): 3-channel image stems, and one later layer
    ((2, 61, 47, 3), (64, 3, 3, 3), 2, 1),  # the detector's
    ((1, 64, 64, 3), (64, 3, 7, 7), 2, 3),  # ResNet's
    ((1, 1, 1, 3), (8, 3, 3, 3), 1, 1),  # a 1x1 image
    ((2, 14, 14, 64), (64, 64, 3, 3), 1, 1),
]


@needs_dnnl
@pytest.mark.parametrize("x_shape, w_shape, stride, padding", STEMS, ids=["3x3/2", "7x7/2", "1x1-image", "64ch"])
def test_a_channels_last_convolution_runs_on_nhwc_without_reorders(x_shape, w_shape, stride, padding):
    # Left to choose ("any"), oneDNN runs a 3-channel stem on blocked nChw8c: a reorder of the
    # image before it and of the whole output after it, each call (0.6 ms of the detector's 6 ms).
    # Its kernel is as fast on the program's own NHWC, so that is what the RAL asks for first.
    ral = load_ral("dnnl")
    x, w = torch.randn(x_shape), torch.randn(w_shape)
    args, out = ral_mod.conv2d_args(x, w, stride, padding, weight_is_constant=True, channels_last=True)
    plan = ral.conv_plan(args)
    assert plan is not None and not plan.startswith("ref"), plan
    reordered = plan.split("reorders: ")[1].split(",")
    assert "src" not in reordered and "dst" not in reordered, plan
    ral.call_conv2d(args)
    ref = F.conv2d(x.permute(0, 3, 1, 2).double(), w.double(), None, stride, padding).permute(0, 2, 3, 1)
    assert rel_err(out, ref) <= 1e-4


@contextlib.contextmanager
def winograd(ral, mode: int):
    """The RAL's Winograd setting (0 never, 1 whenever it can run, 2 where it wins) for a block."""
    previous = ral.set_winograd(mode)
    try:
        yield
    finally:
        ral.set_winograd(previous)


def has_winograd() -> bool:
    if not toolchain.have_dnnl():
        return False
    ral = load_ral("dnnl")
    with winograd(ral, 1):
        return ral.set_winograd(1) == 1  # a RAL without the kernel (no AVX-512) keeps 0


needs_winograd = pytest.mark.skipif(not has_winograd(), reason="the RAL's Winograd kernel needs oneDNN's build on AVX-512")

WINOGRAD_CASES = [  # (n, ci, co, h, w, padding (top, bottom, left, right))
    (1, 1, 1, 1, 1, (1, 1, 1, 1)),  # one pixel: every input of its tile but the centre is padding
    (1, 16, 16, 2, 3, (1, 1, 1, 1)),
    (2, 17, 33, 5, 7, (1, 1, 1, 1)),  # odd sides: the last tiles hang over the edge
    (3, 32, 70, 9, 11, (1, 1, 1, 1)),  # a partial last panel of output channels (70 = 64 + 6)
    (1, 64, 64, 3, 3, (0, 0, 0, 0)),  # a 1x1 output from an unpadded 3x3 input
    (2, 24, 8, 6, 1, (0, 2, 1, 1)),  # uneven padding, a one-pixel-wide input
    (1, 130, 20, 4, 5, (1, 1, 1, 1)),  # input channels past two vectors (a scalar tail of 2)
    (2, 64, 128, 12, 10, (1, 1, 1, 1)),  # more tiles than one block: shared out over the threads
    (1, 512, 512, 7, 7, (1, 1, 1, 1)),  # ResNet-18's last layer: the threads share the panels
]


@needs_winograd
@pytest.mark.parametrize("n, ci, co, h, w, padding", WINOGRAD_CASES)
@pytest.mark.parametrize("bias, relu", [(True, True), (False, False)], ids=["bias+relu", "plain"])
def test_winograd_convolution_matches_float64(n, ci, co, h, w, padding, bias, relu):
    ral = load_ral("dnnl")
    x, wt = torch.randn(n, h, w, ci), torch.randn(co, ci, 3, 3) / (3 * ci**0.5)
    b = torch.randn(co) if bias else None
    top, bottom, left, right = padding
    ref = F.conv2d(F.pad(x.permute(0, 3, 1, 2).double(), (left, right, top, bottom)), wt.double(), b.double() if bias else None)
    ref = (ref.relu() if relu else ref).permute(0, 2, 3, 1)
    outs = {}
    for mode in (1, 0):  # Winograd, then oneDNN's direct kernel on the same problem
        args, out = ral_mod.conv2d_args(x, wt, 1, padding, weight_is_constant=True, channels_last=True, bias=b, relu=relu)
        out.fill_(float("nan"))
        before = ral.cache_entries()["winograd_calls"]
        with winograd(ral, mode):
            ral.call_conv2d(args)
        assert ral.cache_entries()["winograd_calls"] - before == mode
        outs[mode] = out
    # The transforms only add and halve: the error stays that of the direct sum (measured: 0.3-1.5x it).
    assert rel_err(outs[1], ref) <= max(3 * rel_err(outs[0], ref), 1e-6)
    assert rel_err(outs[1], ref) <= 1e-5


@needs_winograd
def test_winograd_outputs_are_non_finite_exactly_where_the_direct_sums_are():
    # The transforms' zero coefficients match the 3x3 windows, so a NaN or an infinity reaches the
    # outputs whose windows hold it and no other (an infinity may come out as NaN: inf - inf).
    ral = load_ral("dnnl")
    x, wt = torch.randn(2, 7, 6, 64), torch.randn(64, 64, 3, 3)
    x[0, 2, 3, 5] = float("nan")
    x[0, 5, 0, 7] = float("inf")
    x[1, 6, 5, 0] = float("-inf")
    ref = F.conv2d(x.permute(0, 3, 1, 2).double(), wt.double(), None, 1, 1).permute(0, 2, 3, 1)
    args, out = ral_mod.conv2d_args(x, wt, 1, 1, weight_is_constant=True, channels_last=True)
    with winograd(ral, 1):
        ral.call_conv2d(args)
    assert torch.equal(out.isfinite(), ref.isfinite())
    finite = ref.isfinite()
    assert rel_err(out[finite], ref[finite]) <= 1e-5


@needs_winograd
def test_the_default_takes_winograd_where_it_wins():
    ral = load_ral("dnnl")

    def runs_winograd(x_shape, w_shape, stride=1, constant=True, channels_last=True):
        x, wt = torch.randn(x_shape), torch.randn(w_shape)
        args, _ = ral_mod.conv2d_args(x, wt, stride, 1, weight_is_constant=constant, channels_last=channels_last)
        before = ral.cache_entries()["winograd_calls"]
        with winograd(ral, 2):
            ral.call_conv2d(args)
            plan = ral.conv_plan(args)
        ran = ral.cache_entries()["winograd_calls"] - before == 1
        assert ran == plan.startswith("winograd"), plan  # the diagnostics say what runs
        return ran

    assert runs_winograd((1, 56, 56, 64), (64, 64, 3, 3))  # ResNet-18's layer 1
    assert runs_winograd((2, 9, 7, 512), (512, 512, 3, 3))  # its layer 4 at 2x288x224
    assert not runs_winograd((1, 4, 4, 512), (512, 512, 3, 3))  # 4 tiles: the filters cost more than they save
    assert not runs_winograd((1, 64, 64, 16), (16, 16, 3, 3))  # few channels: the transforms outweigh the products
    assert not runs_winograd((1, 56, 56, 64), (64, 64, 3, 3), stride=2)
    assert not runs_winograd((1, 56, 56, 64), (64, 64, 3, 3), constant=False)  # training: weights change every step
    assert not runs_winograd((1, 64, 56, 56), (64, 64, 3, 3), channels_last=False)
    assert not runs_winograd((1, 56, 56, 64), (64, 64, 5, 5))
    with winograd(ral, 0):
        assert ral.set_winograd(0) == 0


@needs_winograd
def test_winograd_filters_are_transformed_once_and_again_when_the_weight_changes():
    ral = load_ral("dnnl")
    x, wt = torch.randn(1, 8, 8, 64), torch.randn(64, 64, 3, 3)
    ral_mod.forget_packed_copies([wt])  # copies of an earlier tensor that had this address
    start = ral.cache_entries()["packed_weights"]
    with winograd(ral, 1):
        first = ral.conv2d(x, wt, 1, 1, weight_is_constant=True, channels_last=True)
        assert ral.cache_entries()["packed_weights"] == start + 1
        ral.conv2d(torch.randn(2, 5, 9, 64), wt, 1, 1, weight_is_constant=True, channels_last=True)  # another shape: same copy
        assert ral.cache_entries()["packed_weights"] == start + 1
        wt.mul_(-2.0)  # breaks the constant contract; the sampled-values guard transforms them again
        second = ral.conv2d(x, wt, 1, 1, weight_is_constant=True, channels_last=True)
        assert torch.allclose(second, -2.0 * first, rtol=1e-5, atol=1e-5)
        ral_mod.forget_packed_copies([wt])
        assert ral.cache_entries()["packed_weights"] == start


@needs_dnnl
def test_a_library_built_without_an_rpath_to_onednn_loads_after_preload_dnnl(tmp_path):
    # What a saved ral.so meets on a machine whose Python environment is elsewhere: its rpath
    # names a folder that does not exist there. Built here with no rpath at all.
    root = toolchain.dnnl_root()
    if root is None:
        pytest.skip("oneDNN comes from the system paths here: nothing to preload")
    source = '#include "oneapi/dnnl/dnnl.h"\nextern "C" int disc_dnnl_major() { return dnnl_version()->major; }\n'
    built = toolchain.build(source, "no_rpath", flags=[f"-I{root / 'include'}"], libs=[f"-L{root / 'lib'}", "-ldnnl"])
    code = (
        "import ctypes, sys\n"
        "from disc.runtime.ral import preload_dnnl\n"
        "try:\n"
        "    ctypes.CDLL(sys.argv[1])\n"
        "    print('loaded without preload')\n"
        "except OSError:\n"
        "    assert preload_dnnl()\n"
        "    print('major', ctypes.CDLL(sys.argv[1]).disc_dnnl_major())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    proc = subprocess.run([sys.executable, "-c", code, str(built.path)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    if proc.stdout.strip() == "loaded without preload":
        pytest.skip("the system's loader finds libdnnl.so.3 by itself here")
    assert proc.stdout.strip() == "major 3"


# -- constant GEMM weights packed once ---------------------------------------------------------


@needs_dnnl
@pytest.mark.parametrize("k, n, how", [(256, 96, "t"), (100, 37, "t"), (64, 200, "n"), (2048, 33, "t")])
def test_a_constant_weight_is_packed_once_and_serves_every_m(k, n, how):
    ral = load_ral("dnnl")
    w = _operand(k, n, how)  # "t": a Linear's [n, k] weight read as its transpose
    start = ral.cache_entries()["packed_gemm_bytes"]
    grew = None
    for m in (300, 1, 17, 64, 3):  # the first call packs; the rest read that copy (or B as stored when tiny)
        a = torch.randn(m, k)
        args, out = ral_mod.gemm_args(a, w, b_is_constant=True)
        ral.call_gemm(args)
        assert rel_err(out, ref_mm(a, w)) <= 1e-4, m
        held = ral.cache_entries()["packed_gemm_bytes"] - start
        grew = held if grew is None else grew
        assert held == grew, m  # no second copy for another m
    assert grew >= k * n * 4  # at least the weight itself (oneDNN pads its blocks)


@needs_dnnl
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 11, 16, 17, 64, 65, 97])
@pytest.mark.parametrize("k, n, how", [(256, 256, "t"), (100, 1000, "t"), (1000, 70, "n"), (33, 2049, "t")])
def test_few_rows_on_a_packed_weight_run_the_panel_kernel(m, k, n, how):
    # Up to panel_gemm_rows rows, the RAL's own kernel reads oneDNN's packed panels: every row
    # remainder of its 6-row tiles, a partial last panel (n % 64), a depth that is not a multiple
    # of 16, A and C with row strides wider than their rows. More rows go to oneDNN.
    ral = load_ral("dnnl")
    rows = ral.cache_entries()["panel_gemm_rows"]
    if rows == 0:
        pytest.skip("no panel kernel on this CPU (it needs AVX-512)")
    w = _operand(k, n, how)
    a = torch.randn(m, k + 9)[:, :k]
    out = torch.full((m, n + 5), float("nan"))[:, :n]
    args, _ = ral_mod.gemm_args(a, w, out=out, b_is_constant=True)
    before = ral.cache_entries()["panel_gemm_calls"]
    ral.call_gemm(args)
    ran = ral.cache_entries()["panel_gemm_calls"] - before
    assert rel_err(out, ref_mm(a, w)) <= 1e-5, (m, k, n, how)
    assert ran == (1 if m <= rows else 0), (m, rows)
    previous = ral.set_small_m_rows(0)  # off: oneDNN's matmul reads the same packed copy
    try:
        out.fill_(float("nan"))
        ral.call_gemm(args)
        assert ral.cache_entries()["panel_gemm_calls"] - before == ran
        assert rel_err(out, ref_mm(a, w)) <= 1e-5, (m, k, n, how)
    finally:
        assert ral.set_small_m_rows(previous) == 0


@needs_dnnl
@pytest.mark.parametrize("m, k, n", [(3, 5, 7), (1, 64, 64), (15, 64, 64), (1, 1, 1), (0, 8, 8)])
def test_a_tiny_gemm_reads_its_constant_b_as_stored(m, k, n):
    # Under 2^16 multiply-adds the matmul primitive's per-call setup costs more than packing saves.
    ral = load_ral("dnnl")
    a, w = torch.randn(m, k), _operand(k, n, "t")
    start = ral.cache_entries()["packed_gemm_bytes"]
    args, out = ral_mod.gemm_args(a, w, b_is_constant=True)
    ral.call_gemm(args)
    assert rel_err(out, ref_mm(a, w)) <= 1e-4
    assert ral.cache_entries()["packed_gemm_bytes"] == start


@needs_dnnl
def test_a_gemm_on_a_non_constant_b_packs_nothing():
    ral = load_ral("dnnl")
    a, w = torch.randn(40, 72), _operand(72, 24, "t")
    start = ral.cache_entries()["packed_gemm_bytes"]
    assert rel_err(ral.gemm(a, w), ref_mm(a, w)) <= 1e-4
    assert ral.cache_entries()["packed_gemm_bytes"] == start


@needs_dnnl
def test_packed_gemm_weights_stay_within_the_budget():
    ral = load_ral("dnnl")
    previous = ral.set_packed_gemm_mb(0)
    try:
        start = ral.cache_entries()["packed_gemm_bytes"]
        a, w = torch.randn(32, 128), _operand(128, 64, "t")
        args, out = ral_mod.gemm_args(a, w, b_is_constant=True)
        ral.call_gemm(args)  # no room: B is read as stored, and the result is the same
        assert rel_err(out, ref_mm(a, w)) <= 1e-4
        assert ral.cache_entries()["packed_gemm_bytes"] == start
        ral.set_packed_gemm_mb((start + 128 * 64 * 4) / 2**20)  # room for exactly this weight
        ral.call_gemm(args)
        assert rel_err(out, ref_mm(a, w)) <= 1e-4
        assert ral.cache_entries()["packed_gemm_bytes"] == start + 128 * 64 * 4
        other = _operand(128, 64, "t")  # a second weight no longer fits
        args2, out2 = ral_mod.gemm_args(a, other, b_is_constant=True)
        ral.call_gemm(args2)
        assert rel_err(out2, ref_mm(a, other)) <= 1e-4
        assert ral.cache_entries()["packed_gemm_bytes"] == start + 128 * 64 * 4
    finally:
        ral.set_packed_gemm_mb(previous)


@needs_dnnl
@pytest.mark.parametrize(("setting", "budget"), [(None, "inf"), ("64", "64.0"), ("0", "0.0"), ("-3", "0.0"), ("1e30", "inf")])
def test_every_constant_gemm_weight_is_packed_unless_a_cap_is_set(setting: str | None, budget: str):
    # A fresh process: the budget is read from the environment once per process.
    env = {k: v for k, v in os.environ.items() if k != "DISC_RAL_PACKED_GEMM_MB"}
    if setting is not None:
        env["DISC_RAL_PACKED_GEMM_MB"] = setting
    code = "from disc.runtime.ral import load_ral; r = load_ral('dnnl'); print(r.set_packed_gemm_mb(1.0), r.set_packed_gemm_mb(float('inf')), r.set_packed_gemm_mb(0))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [budget, "1.0", "inf"]


@needs_dnnl
def test_a_packed_weight_changed_in_place_is_packed_again():
    # Breaking the constant contract: the sampled-values guard notices and repacks.
    ral = load_ral("dnnl")
    a, w = torch.randn(40, 96), torch.randn(80, 96)
    start = ral.cache_entries()["packed_gemm_bytes"]
    args, out = ral_mod.gemm_args(a, w.t(), b_is_constant=True)
    ral.call_gemm(args)
    held = ral.cache_entries()["packed_gemm_bytes"]
    assert held > start
    w.mul_(-3.0)
    ral.call_gemm(args)
    assert rel_err(out, ref_mm(a, w.t())) <= 1e-4
    assert ral.cache_entries()["packed_gemm_bytes"] == held  # the new copy replaced the old


class _TwoLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(48, 160)
        self.down = nn.Linear(160, 48)

    def forward(self, x):
        h = self.up(x)
        return self.down(torch.relu(h)) + (h @ h.transpose(-1, -2)).sum(-1, keepdim=True)


@needs_dnnl
def test_a_program_packs_its_linear_weights_and_frees_them_with_itself():
    import gc

    import disc

    ral = load_ral()
    model = _TwoLinears().eval()
    start = ral.cache_entries()["packed_gemm_bytes"]
    with torch.no_grad():
        cm = disc.compile(model, (torch.randn(2, 5, 48),), dynamic={"x": {0: "b", 1: "s"}})
        for shape in [(1, 1, 48), (2, 5, 48), (3, 17, 48), (1, 64, 48)]:
            x = torch.randn(*shape)
            torch.testing.assert_close(cm(x), model(x), rtol=1e-4, atol=1e-4)
    source = cm.executor.native.source.text
    assert source.count("g.b_is_constant = 1;") == 2  # the two weights, not the activations' product
    with_program = ral.cache_entries()["packed_gemm_bytes"]
    assert with_program - start >= (48 * 160 * 2) * 4
    del cm
    gc.collect()
    # Its two copies go with it (and so would an earlier test's stale copy at one of those addresses).
    assert with_program - ral.cache_entries()["packed_gemm_bytes"] >= (48 * 160 * 2) * 4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("ha", ["n", "t", "gap", "row0", "col0"])
@pytest.mark.parametrize("hb", ["n", "t", "gap", "col0"])
def test_16_bit_gemm_accumulates_in_f32_and_rounds_once(ral, dtype, ha, hb):
    # oneDNN's matmul where it describes the strides, a plain loop elsewhere (a stride 0 along a
    # longer dim) and without oneDNN: both accumulate the exact products in f32 and round the
    # result once, which the same products in float64 rounded to the dtype bound.
    a, b = _operand(37, 300, ha).to(dtype), _operand(300, 45, hb).to(dtype)
    exact = ref_mm(a.float(), b.float())
    got = ral.gemm(a, b)
    assert got.dtype == dtype
    step = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    assert rel_err(got, exact) <= 2 * step


@needs_dnnl
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("m", [1, 7, 66])
def test_a_16_bit_constant_weight_is_packed_once_and_again_when_changed(dtype, m):
    # A bf16/f16 weight (autocast's narrowed copy, a 16-bit model) packed into the layout oneDNN's
    # kernel reads, counted with float32's packed weights; a weight changed in place is repacked.
    ral = load_ral("dnnl")
    a, w = torch.randn(m, 256).to(dtype), torch.randn(384, 256).to(dtype)  # a Linear's [out, in] weight
    args, out = ral_mod.gemm_args(a, w.t(), b_is_constant=True)
    # An earlier case's copy at this address would be replaced, not added to: drop it first, so
    # that the bytes say whether this weight was packed.
    ral.forget_constants([w])
    start = ral.cache_entries()["packed_gemm_bytes"]
    ral.call_gemm(args)
    step = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    assert out.dtype == dtype and rel_err(out, ref_mm(a.float(), w.float().t())) <= 2 * step
    if ral.cache_entries()["packed_gemm_bytes"] == start:
        pytest.skip("this CPU's oneDNN has no packed-weight kernel for this 16-bit type")
    held = ral.cache_entries()["packed_gemm_bytes"]
    w.mul_(-3.0)
    ral.call_gemm(args)
    assert rel_err(out, ref_mm(a.float(), w.float().t())) <= 2 * step
    assert ral.cache_entries()["packed_gemm_bytes"] == held  # the new copy replaced the old


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_16_bit_gemm_batches_and_degenerate_extents(ral, dtype):
    for m, n, k in [(0, 3, 4), (1, 1, 1), (1, 7, 0), (5, 1, 9), (1, 33, 64)]:
        a, b = torch.randn(3, m, k).to(dtype), torch.randn(3, k, n).to(dtype)
        got = ral.gemm(a, b)
        assert got.shape == (3, m, n) and rel_err(got, ref_mm(a.float(), b.float())) <= 2**-7
    q, kt = torch.randn(2, 4, 9, 16).to(dtype), torch.randn(2, 4, 16, 9).to(dtype).transpose(-1, -2).contiguous().transpose(-1, -2)
    assert rel_err(ral.gemm(q, kt), ref_mm(q.float(), kt.float())) <= 2**-7
    with pytest.raises(RuntimeError, match="alpha = 1 and beta = 0"):
        ral.gemm(q, kt, alpha=2.0)
