"""Reduction schedules chosen by row length, and the vectorisable exp, against PyTorch eager.

Each schedule (row-cached, split-row, the recomputing general one) is forced by
the shape and checked through the profiling build's per-version counters, so a
schedule that silently never runs fails here.
"""

from __future__ import annotations

import pytest
import torch
from kernel_cases import StatisticsThroughUnitDims
from torch import nn

import disc
from disc.codegen.cpu.kernel import ROW_CACHE_MAX, SPLIT_ROW_MIN
from disc.codegen.cpu.program import KernelCall
from disc.runtime.native import NativeExecutor, build_native


class MaskedSoftmaxAndRowStats(nn.Module):
    def forward(self, x, mask):
        scores = x / 8.0 + mask
        return torch.softmax(scores, dim=-1), x.amax(-1), (x * x).sum(-1)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # split-row runs when rows < threads: make that reachable on any machine
    yield
    torch.set_num_threads(before)


def _profiled(model: nn.Module, args: tuple, dynamic: dict) -> NativeExecutor:
    cm = disc.compile(model, args, dynamic=dynamic, backend="reference")
    return NativeExecutor(cm.graph, build_native(cm.graph, profile=True))


def _softmax_hits(ex: NativeExecutor) -> dict[str, int]:
    rows = [p for p, c in zip(ex.step_profile(), ex.native.source.calls) if isinstance(c, KernelCall) and "exp" in [n.op for n in c.step.group.nodes]]
    assert len(rows) == 1
    return rows[0]["calls"]


@pytest.mark.parametrize(
    "rows,cols,version",
    [
        (6, 50, "row-cached"),
        (1, 1, "row-cached"),
        (3, ROW_CACHE_MAX, "row-cached"),
        (3, ROW_CACHE_MAX + 1, "general"),  # too long to cache, and 3 rows keep 2 threads busy
        (1, SPLIT_ROW_MIN + 7, "split-row"),
    ],
)
def test_each_row_schedule_runs_and_matches_eager(two_threads, rows, cols, version):
    m = MaskedSoftmaxAndRowStats()
    ex = _profiled(m, (torch.randn(2, 5), torch.zeros(1, 5)), {"x": {0: "r", 1: "n"}, "mask": {1: "n"}})
    labels = [c.kernel.versions for c in ex.native.source.calls if isinstance(c, KernelCall) and "exp" in [n.op for n in c.step.group.nodes]]
    assert labels == [["row-cached", "split-row", "general"]]
    x = torch.randn(rows, cols) * 4
    mask = torch.where(torch.rand(1, cols) > 0.3, 0.0, torch.finfo(torch.float32).min)  # masked lanes underflow exp
    mask[0, 0] = 0.0
    before = _softmax_hits(ex)  # the counters live in the loaded library, shared by every test using it
    got = ex.run([x, mask])
    want = m(x, mask)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    hits = {k: v - before[k] for k, v in _softmax_hits(ex).items()}
    assert hits[version] == 1 and sum(hits.values()) == 1, hits


@pytest.mark.parametrize("rows,cols", [(1, 1), (6, 50), (3, ROW_CACHE_MAX + 1), (1, SPLIT_ROW_MIN + 7)])
def test_statistics_read_and_written_through_unit_dims_in_every_schedule(two_threads, rows, cols):
    """``s.unsqueeze(-1)`` is the row's own sum: one row kernel uses and writes it in each row
    schedule (cached, general, split), and a column kernel writes ``amax(0).reshape(1, -1)``."""
    m = StatisticsThroughUnitDims()
    ex = _profiled(m, (torch.randn(4, 6),), {"x": {0: "r", 1: "c"}})
    kinds = [c.step.kind for c in ex.native.source.calls if isinstance(c, KernelCall)]
    assert len(kinds) == 2, kinds  # the row kernel and the column kernel
    x = torch.randn(rows, cols)
    # Against float64: a float32 row sum of 8193 values is off by up to ~1e-6 of the row's sum
    # of magnitudes in any summation order (eager's own float32 sum differed from ours by 1.6e-4).
    tol = 1e-6 * float(x.abs().sum(-1).max()) + 1e-6
    for got, want in zip(ex.run([x]), m(x.double())):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=tol)


@pytest.mark.parametrize("rows,cols", [(4, 33), (3, ROW_CACHE_MAX + 3), (1, SPLIT_ROW_MIN + 1)])
def test_nan_propagates_through_every_schedule(two_threads, rows, cols):
    m = MaskedSoftmaxAndRowStats()
    ex = _profiled(m, (torch.randn(2, 5), torch.zeros(1, 5)), {"x": {0: "r", 1: "n"}, "mask": {1: "n"}})
    x = torch.randn(rows, cols)
    x[0, cols // 2] = float("nan")
    got = ex.run([x, torch.zeros(1, cols)])
    want = m(x, torch.zeros(1, cols))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert torch.isnan(got[1][0]) and torch.isnan(got[0][0]).all()


class LayerNormRow(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(n)

    def forward(self, x, r):
        return self.ln(x + r)


def test_layernorm_with_a_static_row_has_only_the_cached_version():
    m = LayerNormRow(48).eval()
    args = (torch.randn(2, 3, 48), torch.randn(2, 3, 48))
    ex = _profiled(m, args, {"x": {0: "b", 1: "s"}, "r": {0: "b", 1: "s"}})
    (kernel,) = [c.kernel for c in ex.native.source.calls if isinstance(c, KernelCall)]
    assert kernel.versions == ["row-cached"] and kernel.conditions == ["true"]
    # x + r is cached for the variance and output passes; (x - mean)^2 feeds only its own sum: not cached.
    assert "alignas(64) float row0[48];" in kernel.text and "row1" not in kernel.text
    for shape in [(1, 1, 48), (3, 7, 48)]:
        x, r = torch.randn(*shape), torch.randn(*shape)
        (got,) = ex.run([x, r])
        torch.testing.assert_close(got, m(x, r), rtol=1e-5, atol=1e-5)


class Unary(nn.Module):
    def forward(self, x):
        return torch.exp(x), torch.sigmoid(x), nn.functional.silu(x)


def test_exp_sigmoid_silu_match_torch_over_the_whole_float_range():
    m = Unary()
    cm = disc.compile(m, (torch.randn(8),), dynamic={"x": {0: "n"}}, backend="native")
    specials = torch.tensor([float("-inf"), float("inf"), float("nan"), -1e30, 1e30, 0.0, -0.0, -87.5, -100.0, -103.9, 88.7, 89.0])
    for x in [torch.linspace(-110, 95, 200_001), specials, torch.randn(1), torch.randn(37) * 30]:
        for g, w in zip(cm(x), m(x)):
            # Within 3 ulp where normal; subnormal results within one subnormal step.
            torch.testing.assert_close(g, w, rtol=4e-7, atol=2e-45, equal_nan=True)


class GeluBackwardAndBiasGrad(nn.Module):
    """A GELU backward with its bias gradient: a full-size output and column reductions of one space."""

    def forward(self, g, x):
        d = g * (0.5 * (1 + torch.erf(x * 0.7071067811865476)) + x * torch.exp(-0.5 * x * x) * 0.3989422804014327)
        return d, d.sum(0, keepdim=True), x.amax((0, 1)), (d * x).sum((0, 1))


def _column_kernels(ex: NativeExecutor) -> list[KernelCall]:
    return [c for c in ex.native.source.calls if isinstance(c, KernelCall) and "column" in c.kernel.versions]


def _calls_of(ex: NativeExecutor, call: KernelCall) -> dict[str, int]:
    """How often each speculation version of ``call`` has run so far (a profiling build's counters)."""
    return next(p["calls"] for p, c in zip(ex.step_profile(), ex.native.source.calls) if c is call)


@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 1, 7), (3, 5, 1), (2, 3, 17), (37, 50, 64), (3, 1, 257)])
def test_column_reductions_run_in_memory_order_and_match_eager(two_threads, shape):
    m = GeluBackwardAndBiasGrad()
    dyn = {"g": {0: "b", 1: "s", 2: "h"}, "x": {0: "b", 1: "s", 2: "h"}}
    ex = _profiled(m, (torch.randn(2, 3, 4), torch.randn(2, 3, 4)), dyn)
    column = _column_kernels(ex)
    assert column, [c.kernel.versions for c in ex.native.source.calls if isinstance(c, KernelCall)]
    for call in column:
        # Rows outer, the kept elements inner and contiguous: no load strided by the row length.
        assert "r * cols + j" in call.kernel.text and "j * " not in call.kernel.text
    torch.manual_seed(sum(shape))  # the same values whichever tests ran before (sums of 1850 terms cancel)
    g, x = torch.randn(*shape), torch.randn(*shape) * 2
    x.view(-1)[-1] = float("nan") if shape[-1] > 1 else x.view(-1)[-1]

    def hits() -> list[dict[str, int]]:  # the counters live in the loaded library, shared across tests
        return [p["calls"] for p, c in zip(ex.step_profile(), ex.native.source.calls) if c in column]

    before = hits()
    got = ex.run([g, x])
    want = m(g, x)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.reshape(b.shape), b, rtol=1e-4, atol=1e-5, equal_nan=True)
    ran = [{k: v - b[k] for k, v in h.items()} for h, b in zip(hits(), before)]
    assert all(r.get("column", 0) + r.get("no-broadcast", 0) == 1 and sum(r.values()) == 1 for r in ran), ran


class ChannelsLastBatchNorm(nn.Module):
    """Training BatchNorm on NHWC data: per-channel mean, then variance around it, both over the leading dims."""

    def forward(self, x, w):
        mean = x.mean((0, 1, 2), keepdim=True)
        centred = x - mean
        var = (centred * centred).mean((0, 1, 2), keepdim=True)
        y = torch.relu(centred * torch.rsqrt(var + 1e-5) * w)
        return y, mean.reshape(-1) * 0.1, var.reshape(-1)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 1, 1, 5), (2, 3, 1, 7), (4, 9, 11, 32), (8, 24, 26, 33)])
def test_values_read_per_element_after_column_reductions_take_one_walk_per_level(two_threads, shape):
    """The variance reads the mean per element and the output reads both: three walks, all in memory order."""
    m = ChannelsLastBatchNorm()
    dyn = {"x": {0: "n", 1: "h", 2: "w", 3: "c"}, "w": {0: "c"}}
    ex = _profiled(m, (torch.randn(2, 3, 4, 5), torch.randn(5)), dyn)
    (call,) = _column_kernels(ex)
    text = call.kernel.text
    assert text.count("for (int64_t r = rows * t / nt;") == 3 and "j * " not in text
    x, w = torch.randn(*shape) * 3 + 1, torch.randn(shape[-1])
    before = _calls_of(ex, call)
    for got, want in zip(ex.run([x, w]), m(x, w)):
        torch.testing.assert_close(got.reshape(want.shape), want, rtol=1e-4, atol=1e-5)
    ran = {k: v - before[k] for k, v in _calls_of(ex, call).items()}
    assert sum(ran.values()) == 1 and ran.get("column", 0) + ran.get("no-broadcast", 0) == 1, ran


class SpatialMeanNHWC(nn.Module):
    """A squeeze-excite gate on NHWC data: the spatial mean reduces h and w, between the kept batch and channel."""

    def forward(self, x, w):
        y = nn.functional.hardswish(x * w + 0.5)
        gate = torch.sigmoid(y.mean((1, 2)))
        return y, gate, y.amax((1, 2), keepdim=True)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 1, 1, 6), (2, 3, 1, 7), (3, 9, 11, 32), (2, 48, 48, 33)])
def test_reductions_between_kept_dims_walk_rows_in_memory_order_per_outer_index(two_threads, shape):
    """The column schedule runs once per batch index: each image's rows in memory order, the channels
    contiguous inside (the row schedule read each channel's values at a stride of c floats)."""
    m = SpatialMeanNHWC()
    dyn = {"x": {0: "n", 1: "h", 2: "w", 3: "c"}, "w": {0: "c"}}
    ex = _profiled(m, (torch.randn(2, 3, 4, 5), torch.randn(5)), dyn)
    (call,) = _column_kernels(ex)
    text = call.kernel.text
    assert "for (int64_t o = 0; o < s.n; ++o) {" in text and "(o * rows + r) * cols + j" in text and "j * " not in text
    x, w = torch.randn(*shape) * 3, torch.randn(shape[-1])
    before = _calls_of(ex, call)
    for got, want in zip(ex.run([x, w]), m(x, w)):
        torch.testing.assert_close(got.reshape(want.shape), want, rtol=1e-4, atol=1e-5)
    ran = {k: v - before[k] for k, v in _calls_of(ex, call).items()}
    assert sum(ran.values()) == 1 and ran.get("column", 0) + ran.get("no-broadcast", 0) == 1, ran


class ChannelsFirstBatchNorm(nn.Module):
    """Training BatchNorm on NCHW data (reduced dims 0, 2, 3 around the kept channel) and a spatial mean."""

    def forward(self, x, w):
        mean = x.mean((0, 2, 3), keepdim=True)
        centred = x - mean
        var = (centred * centred).mean((0, 2, 3), keepdim=True)
        y = torch.relu(centred * torch.rsqrt(var + 1e-5) * w[:, None, None])
        return y, var.reshape(-1), x.mean((2, 3))


def _simd_loop_bodies(text: str) -> list[list[str]]:
    """The lines of every loop that follows an ``omp simd`` pragma."""
    lines, bodies = text.splitlines(), []
    for i, line in enumerate(lines):
        if "omp simd" in line and "parallel" not in line:
            depth = len(line) - len(line.lstrip())
            body = []
            for follow in lines[i + 2 :]:
                if len(follow) - len(follow.lstrip()) <= depth:
                    break
                body.append(follow)
            bodies.append(body)
    return bodies


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 5, 7), (3, 4, 1, 9), (1, 2, 64, 64), (8, 5, 40, 50)])
def test_rows_over_several_reduced_dims_are_walked_by_nested_loops(two_threads, shape):
    """Each reduced dim gets its own loop, so no element pays integer divisions to find its position."""
    m = ChannelsFirstBatchNorm()
    dyn = {"x": {0: "n", 1: "c", 2: "h", 3: "w"}, "w": {0: "c"}}
    ex = _profiled(m, (torch.randn(2, 3, 4, 5), torch.randn(3)), dyn)
    rows = [c for c in ex.native.source.calls if isinstance(c, KernelCall) and any(n.op == "reduce" for n in c.step.group.nodes)]
    assert rows
    for call in rows:
        for body in _simd_loop_bodies(call.kernel.text):
            index_math = [ln for ln in body if "int64_t" in ln]
            assert body and not any(" % " in ln or " / " in ln for ln in index_math), "\n".join(body)
    x, w = torch.randn(*shape) * 2 + 1, torch.randn(shape[1])
    for got, want in zip(ex.run([x, w]), m(x, w)):
        torch.testing.assert_close(got.reshape(want.shape), want, rtol=1e-4, atol=1e-5)


SHORT_ROWS = """
func @short_rows(%x: f32[n, 3, h, w], %y: f32[c, w, 3]) {
  sym n in [0, inf]
  sym h in [0, inf]
  sym w in [0, inf]
  sym c in [0, inf]
  %0 = dim(%x) {axis=0} : index(n)
  %1 = dim(%x) {axis=2} : index(h)
  %2 = dim(%x) {axis=3} : index(w)
  %3 = index_const() {value=3} : index(3)
  %4 = transpose(%x) {perm=[0, 2, 3, 1]} : f32[n, h, w, 3]
  %5 = broadcast_in_dim(%y, %0, %1, %2, %3) {dims=[1, 2, 3]} : f32[n, h, w, 3]
  %6 = add(%4, %5) : f32[n, h, w, 3]
  return %6
}
"""


@pytest.mark.parametrize(
    "n,h,w,c,version",
    [
        (1, 5, 7, 5, "no-broadcast short-rows"),  # an image's NCHW -> NHWC with a per-row term
        (2, 4, 1, 1, "short-rows"),  # y broadcast along h
        (1, 1, 9, 1, "no-broadcast"),  # one row of 9 pixels: too few rows to share between 2 threads
        (1, 1, 1, 1, "no-broadcast"),
        (0, 4, 5, 1, "general"),  # no image at all, y broadcast
        (3, 17, 33, 17, "no-broadcast short-rows"),
    ],
)
def test_short_row_versions_run_and_match(two_threads, n, h, w, c, version):
    """A static innermost extent of 3 nests rows under the next dim when the dims before hold a row per thread."""
    from disc.ir.parser import parse_graph

    graph = parse_graph(SHORT_ROWS)
    ex = NativeExecutor(graph, build_native(graph, profile=True))
    (call,) = [c for c in ex.native.source.calls if isinstance(c, KernelCall)]
    assert call.kernel.versions == ["no-broadcast short-rows", "short-rows", "no-broadcast", "general"]
    x, y = torch.randn(n, 3, h, w), torch.randn(c, w, 3)
    (before,) = [p["calls"] for p in ex.step_profile()]
    (out,) = ex.run([x, y])
    (after,) = [p["calls"] for p in ex.step_profile()]
    torch.testing.assert_close(out, x.permute(0, 2, 3, 1) + y.reshape(1, c, w, 3).expand(n, h, w, 3), rtol=0, atol=0)
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == {version: 1}
