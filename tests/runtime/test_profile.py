"""``CompiledModule.profile``: kernels executed by kind and the peak workspace, at any shape."""

from __future__ import annotations

import pytest
import torch

import disc


class Chain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(16, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sin(x) * 2.0  # memory-bound
        z = y @ self.weight  # library
        return torch.relu(z)  # memory-bound


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_profile_counts_kernels_and_scales_workspace_with_shape(rows: int) -> None:
    model = Chain().eval()
    cm = disc.compile(model, (torch.randn(5, 16),), dynamic={"x": {0: "rows"}}, backend="reference")
    x = torch.randn(rows, 16)
    p = cm.profile(x)
    assert p.kernels["library"] == 1
    assert p.kernels["fallback"] == 0
    assert p.kernels["memory_bound"] >= 2  # sin, mul, relu (the scalar's broadcast may add one)
    # Every intermediate is [rows, 16] or [rows, 8] float32; at the multiply three are live
    # (sin, the broadcast scalar, the product), which is the peak.
    assert p.workspace_bytes == 3 * rows * 16 * 4
    # The workspace is linear in the dynamic dim.
    assert cm.profile(torch.randn(2 * rows, 16)).workspace_bytes == 2 * p.workspace_bytes
    # Profiling is a normal call: same result as eager, inputs checked.
    torch.testing.assert_close(cm(x), model(x))
    with pytest.raises(disc.ShapeError):
        cm.profile(torch.randn(rows, 15))


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_native_profile_counts_fused_kernels_and_the_planned_workspace(rows: int) -> None:
    model = Chain().eval()
    cm = disc.compile(model, (torch.randn(5, 16),), dynamic={"x": {0: "rows"}}, backend="native")
    p = cm.profile(torch.randn(rows, 16))
    # sin*2 is one fused kernel, the GEMM a library call, relu writes the output.
    assert p.kernels == {"memory_bound": 2, "library": 1, "fallback": 0}
    # One intermediate lives in the workspace: sin(x)*2, [rows, 16] f32, in a 64-byte aligned slot
    # (the GEMM's result is the relu's input, a second slot).
    expected = sum((b + 63) // 64 * 64 for b in (rows * 16 * 4, rows * 8 * 4))
    assert p.workspace_bytes == expected


def test_profile_counts_fallbacks() -> None:
    class Masked(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.special.bessel_j0(x[x > 0]).exp()  # the Bessel function runs in PyTorch

    cm = disc.compile(Masked(), (torch.randn(9),), dynamic={"x": {0: "n"}})
    p = cm.profile(torch.randn(11))
    assert p.kernels["fallback"] == 1 and p.kernels["library"] == 0


def test_disc_profile_env_makes_profiling_builds(monkeypatch) -> None:
    """``DISC_PROFILE=1`` turns on the per-step counters of programs built without asking (torch.compile's)."""
    from disc.ir.parser import parse_graph
    from disc.runtime.native import NativeExecutor, build_native, step_profile

    g = parse_graph(
        """
        func @f(%x: f32[n, 8]) {
          sym n in [0, inf]
          %0 = exp(%x) : f32[n, 8]
          %1 = reduce(%0) {dims=[1], keepdim=false, kind="sum"} : f32[n]
          return %1
        }
        """
    )
    monkeypatch.delenv("DISC_PROFILE", raising=False)
    with pytest.raises(RuntimeError, match="DISC_PROFILE=1"):
        step_profile(build_native(g))
    monkeypatch.setenv("DISC_PROFILE", "1")
    build = build_native(g)
    before = sum(sum(p["calls"].values()) for p in step_profile(build))
    NativeExecutor(g, build).run([torch.randn(5, 8)])
    assert sum(sum(p["calls"].values()) for p in step_profile(build)) == before + 1


class _Softmax(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1)


def test_explain_of_a_profiling_build_says_which_speculation_version_ran(monkeypatch) -> None:
    """The issue's debug mode: with DISC_PROFILE=1, explain counts each version's launches."""
    monkeypatch.setenv("DISC_PROFILE", "1")
    cm = disc.compile(_Softmax(), (torch.randn(3, 40),), dynamic={"x": {0: "rows", 1: "cols"}}, backend="native")
    for shape in ((3, 40), (1, 1), (1, 9000)):  # two calls with short rows (kept in a row cache), one too long for it
        x = torch.randn(*shape)
        torch.testing.assert_close(cm(x), torch.softmax(x, -1))
    text = disc.explain(cm)
    assert "version row-cached: when s.cols <= 8192: 2 launches" in text
    assert "version general: when true: 1 launch" in text
    assert ": 0 launches" in text  # the split-row version (a long row and fewer rows than threads), not taken
    assert "library calls 0.000 ms in 0 calls" in text
    monkeypatch.delenv("DISC_PROFILE")
    plain = disc.compile(_Softmax(), (torch.randn(3, 40),), dynamic={"x": {0: "rows", 1: "cols"}}, backend="native")
    plain(torch.randn(3, 40))
    assert "version row-cached: when s.cols <= 8192\n" in disc.explain(plain) and "a profiling build" not in disc.explain(plain)


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        return self.out(torch.softmax(q @ k.transpose(-1, -2), -1) @ v)


def test_explain_of_a_profiling_build_splits_library_time_by_kind(monkeypatch) -> None:
    """Which GEMMs the library time goes to: the projections on constant weights apart from the
    attention's GEMMs on activations, each kind with its sites and launches."""
    monkeypatch.setenv("DISC_PROFILE", "1")
    m = _Attention()
    cm = disc.compile(m, (torch.randn(2, 5, 16),), dynamic={"x": {0: "b", 1: "n"}}, backend="native")
    for b, n in ((1, 1), (2, 7), (3, 4)):
        x = torch.randn(b, n, 16)
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)
    text = disc.explain(cm)
    section = text.split("-- library calls by kind (profiling build; most time first) --\n", 1)[1].split("\n\n", 1)[0]
    rows = section.splitlines()
    assert len(rows) == 4, section  # two projections (different weights' shapes) and the two attention GEMMs
    assert sum("(constant weight)" in r for r in rows) == 2, section
    assert all("1 site(s), 3 launches" in r for r in rows), section
    shares = [float(r.split("%")[0].split()[-1]) for r in rows]
    assert shares == sorted(shares, reverse=True) and abs(sum(shares) - 100) < 0.5, section
