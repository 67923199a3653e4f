"""The Triton program on a real GPU: kernels compiled with the model, per-shape CUDA graphs.

Skipped without a CUDA GPU (the interpreter runs no compiled kernels and records no graphs).
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch import nn

import disc

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


class Block(nn.Module):
    """LayerNorm, masked softmax and a GELU MLP: row reductions with dynamic row lengths."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(48)
        self.up = nn.Linear(48, 96)
        self.down = nn.Linear(96, 48)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        scores = torch.softmax(h @ h.transpose(1, 2) * 0.2 + mask[:, None, :], dim=-1)
        return x + self.down(nn.functional.gelu(self.up(scores @ h)))


def _inputs(b: int, s: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, s, 48, generator=g)
    mask = torch.where(torch.rand(b, s, generator=g) > 0.2, 0.0, -1e9)
    return x.cuda(), mask.cuda()


SHAPES = [(1, 1), (2, 7), (3, 64), (1, 300), (5, 17), (2, 4096 + 3)]


def _compiled(monkeypatch, graphs: str = "16"):
    monkeypatch.setenv("DISC_CUDA_GRAPHS", graphs)
    m = Block().cuda().eval()
    cm = disc.compile(m, _inputs(2, 8, 0), dynamic={"x": {0: "b", 1: "s"}, "mask": {0: "b", 1: "s"}})
    assert cm.report.backend.name == "triton-gpu"
    return m, cm


def _jit_cache_sizes(cm) -> dict[str, int]:
    module = cm.executor.build.module
    sizes = {}
    for name in dir(module):
        fn = getattr(module, name)
        caches = getattr(fn, "device_caches", None)
        if caches is not None and hasattr(fn, "warmup"):
            sizes[name] = sum(len(c[0]) for c in caches.values())
    return sizes


def test_every_kernel_form_is_compiled_with_the_model_none_at_a_call(monkeypatch):
    m, cm = _compiled(monkeypatch, graphs="0")
    build = cm.executor.build
    assert build.compiled and build.compile_seconds > 0
    before = _jit_cache_sizes(cm)
    with torch.no_grad():
        for b, s in SHAPES:
            args = _inputs(b, s, b * 100 + s)
            torch.testing.assert_close(cm(*args), m(*args), rtol=1e-4, atol=1e-4)
    assert not cm.executor.runtime.jit_launches, cm.executor.runtime.jit_launches
    assert _jit_cache_sizes(cm) == before, "a call compiled a kernel form the build had not"


def test_a_shape_is_recorded_at_its_second_call_and_replays_match_eager(monkeypatch):
    m, cm = _compiled(monkeypatch)
    graphs = cm.executor.graphs
    with torch.no_grad():
        for b, s in SHAPES[:4]:
            for call in range(3):
                args = _inputs(b, s, 7 * call + s)  # new values every call: a replay reads this call's inputs
                out = cm(*args)
                torch.testing.assert_close(out, m(*args), rtol=1e-4, atol=1e-4)
        assert graphs.captures == 4 and graphs.shapes() == 4
        first = cm(*_inputs(2, 7, 1))
        second = cm(*_inputs(2, 7, 2))
        assert not torch.equal(first, second), "a replay's output is the caller's own copy"


def test_the_graph_cache_keeps_the_most_recent_shapes(monkeypatch):
    m, cm = _compiled(monkeypatch, graphs="2")
    graphs = cm.executor.graphs
    with torch.no_grad():
        for s in (5, 6, 7):
            for _ in range(2):
                cm(*_inputs(1, s, s))
    assert graphs.captures == 3 and graphs.shapes() == 2
    assert graphs.key(_inputs(1, 5, 0)) not in graphs._entries


def test_a_generation_replays_every_token_after_one_recording_by_default(monkeypatch):
    # A decoder's generation is a new shape per token; with 16 shapes remembered (the old
    # default) each step's graph was evicted before the next generation came back to it, and
    # every other generation recorded all of them again.
    monkeypatch.delenv("DISC_CUDA_GRAPHS", raising=False)
    m = Block().cuda().eval()
    cm = disc.compile(m, _inputs(2, 8, 0), dynamic={"x": {0: "b", 1: "s"}, "mask": {0: "b", 1: "s"}})
    graphs = cm.executor.graphs
    with torch.no_grad():
        for generation in range(4):
            for s in range(1, 41):
                args = _inputs(1, s, generation * 100 + s)
                if generation == 3 and s % 10 == 0:
                    torch.testing.assert_close(cm(*args), m(*args), rtol=1e-4, atol=1e-4)
                else:
                    cm(*args)
            assert graphs.captures == (0 if generation == 0 else 40), (generation, graphs.captures)


def test_threads_share_one_program_and_its_graphs(monkeypatch):
    m, cm = _compiled(monkeypatch)
    cases = [_inputs(b, s, b + s) for b, s in SHAPES[:4]]
    with torch.no_grad():
        want = [m(*a) for a in cases]

    def work(k: int) -> None:
        with torch.no_grad():
            for i in range(12):
                j = (k + i) % len(cases)
                torch.testing.assert_close(cm(*cases[j]), want[j], rtol=1e-4, atol=1e-4)

    with ThreadPoolExecutor(max_workers=4) as pool:
        for done in [pool.submit(work, k) for k in range(4)]:
            done.result()  # re-raises a thread's failure here


def test_a_profilers_launch_hook_sees_every_kernel(monkeypatch):
    from triton import knobs

    chain = knobs.runtime.launch_enter_hook
    if not hasattr(chain, "add"):
        pytest.skip("this Triton keeps a single launch hook, not a chain")
    m, cm = _compiled(monkeypatch, graphs="0")
    seen: list = []
    chain.add(seen.append)
    try:
        with torch.no_grad():
            cm(*_inputs(2, 9, 0))
    finally:
        chain.remove(seen.append)
    assert len(seen) == cm.executor.build.lowered.counts()["memory_bound"]


def test_a_shape_that_cannot_be_recorded_keeps_running_as_plain_calls(monkeypatch):
    m, cm = _compiled(monkeypatch)
    graphs = cm.executor.graphs

    def refuse(inputs):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs, "_capture", refuse)
    with torch.no_grad():
        for seed in range(3):
            args = _inputs(3, 11, seed)
            torch.testing.assert_close(cm(*args), m(*args), rtol=1e-4, atol=1e-4)
    assert graphs.captures == 0 and graphs.shapes() == 0


def test_library_calls_follow_the_tf32_flags_eager_follows(monkeypatch):
    # Under TF32 a GEMM rounds its inputs to 10-bit significands (errors ~1e-3 of the scale);
    # disc's GEMMs are cuBLAS calls made under the caller's flags, and a graph captured under one
    # setting is not replayed under the other.
    m, cm = _compiled(monkeypatch)
    args = _inputs(3, 64, 5)
    with torch.no_grad():
        exact = m.double()(*(a.double() for a in args))
        m.float()
        for tf32 in (True, False, True, False):
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
            for _ in range(3):  # the second call captures, the third replays
                got = cm(*args)
            want = m(*args)
            error = ((got.double() - exact).abs().max() / exact.abs().max()).item()
            eager = ((want.double() - exact).abs().max() / exact.abs().max()).item()
            if tf32:
                assert error > 1e-5 and eager > 1e-5, (error, eager)  # both rounded
            else:
                assert error < 1e-5 and eager < 1e-5, (error, eager)
    # conftest.py's setting (TF32 off) holds again after the last pass
