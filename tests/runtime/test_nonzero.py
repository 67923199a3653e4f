"""Data-dependent sizes in one native program: boolean-mask indexing (``nonzero``) runs in the host flow.

The program plans every buffer sized by a count at the count's bound (the mask's
length), runs the ``nonzero``, and the steps after it use the count it found.
Every case compares with eager at several shapes, including a mask that keeps
nothing, one that keeps everything, 1-sized and odd dims.
"""

from __future__ import annotations

import pytest
import torch
from test_segments import DETECT_DYNAMIC, DETECT_SHAPES, DetectLike, check_concurrent_calls
from torch import nn

import disc
from disc.runtime.native import NativeExecutor


def _compare(model: nn.Module, cm: disc.CompiledModule, inputs: tuple) -> None:
    with torch.no_grad():
        want, got = model(*inputs), cm(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for w, g in zip(want, got, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape)
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def _native(cm: disc.CompiledModule) -> NativeExecutor:
    assert cm.report.backend.name == "native-cpu", cm.report.backend.reason
    assert isinstance(cm.executor, NativeExecutor)
    return cm.executor


def test_detector_is_one_native_program() -> None:
    torch.manual_seed(0)
    model = DetectLike().eval()
    cm = disc.compile(model, (torch.randn(2, 3, 24, 20),), dynamic=DETECT_DYNAMIC)
    executor = _native(cm)
    assert cm.report.fallbacks == {}
    assert executor.native.source.data_dependent
    assert cm.profile(torch.randn(2, 3, 31, 29)).kernels["fallback"] == 0
    g = torch.Generator().manual_seed(1)
    for shape in [*DETECT_SHAPES, (1, 3, 2, 2), (5, 3, 17, 3)]:
        _compare(model, cm, (torch.randn(*shape, generator=g),))


def test_generated_host_flow_plans_at_the_bound_then_binds_the_count() -> None:
    torch.manual_seed(0)
    cm = disc.compile(DetectLike().eval(), (torch.randn(2, 3, 24, 20),), dynamic=DETECT_DYNAMIC)
    source = _native(cm).native.source
    text = source.text
    [count] = source.counts
    shapes = text[text.index("compute_shapes(const") :]
    # Sized for the most the count can be before the program runs (disc_shapes, the workspace) ...
    assert f"s.{count} = s.b * " in shapes and "the most its count can be" in shapes
    # ... and set to what the nonzero found before any step reading it.
    run = text[text.index("disc_run(") :]
    found = run.index(f"s.{count} = disc_nonzero(")
    assert all(run.index(call) > found for call in ("kernel_4(", "if (ral->gemm"))
    assert "actual_dims[0] = s." + count in run
    text = disc.explain(cm)
    assert "disc_nonzero x1: [nonzero]" in text
    assert f"{count} is a count known mid-call: sized at its bound b*((h + 1)//2)*((w + 1)//2)" in text


class MaskReductions(nn.Module):
    """Reductions over the kept rows (their length is the count, as a loop bound and as a value in
    the mean), and a second mask with a count of its own."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        kept = x[x[:, 0] > 0]
        return kept.sum(0), kept.mean(0), y[y < 0.5] * 2


def test_reductions_over_the_count_and_two_counts() -> None:
    model = MaskReductions()
    cm = disc.compile(model, (torch.randn(7, 5), torch.rand(6)), dynamic={"x": {0: "n", 1: "c"}, "y": {0: "m"}})
    executor = _native(cm)
    assert len(executor.native.source.counts) == 2
    g = torch.Generator().manual_seed(2)
    for n, c, m in [(1, 1, 1), (7, 5, 6), (33, 3, 129), (2, 17, 1)]:
        x, y = torch.randn(n, c, generator=g), torch.rand(m, generator=g)
        x[0, 0] = 1.0  # at least one kept row, so the mean is defined
        _compare(model, cm, (x, y))
    # Everything kept, and nothing kept by the second mask.
    _compare(model, cm, (torch.ones(4, 3), torch.ones(5)))


class Nested(nn.Module):
    """A selection of a selection: the second mask's length is the first count."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = x[x > 0]
        again = kept[kept < 1]
        return again * torch.arange(again.shape[0], dtype=x.dtype) + again.sum()


def test_a_count_bounded_by_another_count() -> None:
    model = Nested()
    cm = disc.compile(model, (torch.randn(40),), dynamic={"x": {0: "n"}})
    assert len(_native(cm).native.source.counts) == 2
    g = torch.Generator().manual_seed(3)
    for n in (1, 2, 40, 999):
        _compare(model, cm, (torch.randn(n, generator=g),))
    _compare(model, cm, (-torch.ones(8),))  # the first count is 0, so is the second


def test_a_mask_long_enough_for_the_parallel_nonzero() -> None:
    """Masks of 64K elements or more are scanned in one chunk per thread (count, then write)."""

    class Positions(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[x > 0.3] + 1

    model = Positions()
    cm = disc.compile(model, (torch.randn(10, 10),), dynamic={"x": {0: "a", 1: "b"}})
    _native(cm)
    g = torch.Generator().manual_seed(4)
    for shape in [(300, 301), (257, 1000), (1, 70000), (3, 5)]:
        _compare(model, cm, (torch.randn(*shape, generator=g),))
    _compare(model, cm, (torch.ones(300, 300),))  # every element kept


def test_concurrent_calls_with_different_counts(run_in_threads) -> None:
    """Each call binds its own count: the program stays stateless with data-dependent sizes."""
    torch.manual_seed(0)
    model = DetectLike().eval()
    cm = disc.compile(model, (torch.randn(2, 3, 24, 20),), dynamic=DETECT_DYNAMIC)
    _native(cm)
    check_concurrent_calls(model, cm, run_in_threads, seed=5)


def test_saved_and_loaded(tmp_path) -> None:
    torch.manual_seed(0)
    model = DetectLike().eval()
    cm = disc.compile(model, (torch.randn(2, 3, 24, 20),), dynamic=DETECT_DYNAMIC)
    loaded = disc.load(cm.save(tmp_path / "detector"))
    assert loaded.report.backend.name == "native-cpu"
    g = torch.Generator().manual_seed(6)
    for shape in [(1, 3, 1, 1), (2, 3, 33, 47)]:
        _compare(model, loaded, (torch.randn(*shape, generator=g),))


@pytest.mark.parametrize("backend", ["reference", "native"])
def test_backends_agree(backend: str) -> None:
    """The reference executor and the native program give the same selections."""
    model = Nested()
    cm = disc.compile(model, (torch.randn(40),), dynamic={"x": {0: "n"}}, backend=backend)
    x = torch.randn(77, generator=torch.Generator().manual_seed(7))
    _compare(model, cm, (x,))


def test_a_small_selection_does_not_keep_the_bound_buffer() -> None:
    """An output sized for every candidate but holding few of them is returned compact."""

    class Select(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[x > 3.0] * 2

    cm = disc.compile(Select(), (torch.randn(64),), dynamic={"x": {0: "n"}})
    _native(cm)
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(8))
    small = cm(x)  # about 0.1% of the candidates
    assert small.untyped_storage().nbytes() == small.numel() * 4
    _compare(Select(), cm, (x,))
    x[:] = 4.0  # all of them: the buffer is used as it is
    every = cm(x)
    assert every.numel() == x.numel() and torch.equal(every, x * 2)


def test_plugin_mode_keeps_the_selection_in_one_native_graph() -> None:
    """With dynamo told to trace data-dependent ops (README, plug-in mode), torch.compile hands disc the
    whole detector, nonzero included, and it runs as one native program: no graph break."""
    torch.manual_seed(0)
    model = DetectLike().eval()
    torch._dynamo.reset()
    before = len(disc.reports())
    compiled = torch.compile(model, backend="disc", dynamic=True)
    g = torch.Generator().manual_seed(9)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), torch.no_grad():
        for shape in [(2, 3, 24, 20), (3, 3, 33, 47), (2, 3, 8, 8)]:
            x = torch.randn(*shape, generator=g)
            want, got = model(x), compiled(x)
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    made = disc.reports()[before:]
    assert len(made) == 1  # one graph for all three shapes (none has a size-1 dim)
    assert made[0].backend.name == "native-cpu" and made[0].fallbacks == {}
