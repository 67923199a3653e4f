"""Graphs with fallbacks: compiled segments with PyTorch running the fallbacks between them.

Every case compares with eager at several shapes, including 1-sized and odd
dims and a mask that keeps nothing (a data-dependent dim of 0). The detector
without a fallback is one native program (tests/runtime/test_nonzero.py); on
the GPU path its nonzero is still a host op.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import disc
from disc.ir.parser import parse_graph
from disc.runtime.native import NativeExecutor
from disc.runtime.segments import SegmentedExecutor, host_ops, plan_segments, stages


class DetectLike(nn.Module):
    """Conv features, a score per location, the locations above their image's mean kept (a data-dependent
    count), then an MLP over however many survived: the shape of the detector benchmark, small."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU())
        self.score = nn.Conv2d(8, 1, 1)
        self.box = nn.Conv2d(8, 4, 1)
        self.refine = nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.backbone(x)
        scores = self.score(feats).sigmoid().flatten(1)
        boxes = self.box(feats).flatten(2).transpose(1, 2)
        feats = feats.flatten(2).transpose(1, 2)
        keep = scores > scores.mean(dim=1, keepdim=True)
        kept = self.before_refine(torch.cat([boxes[keep], feats[keep]], dim=-1))
        return (boxes[keep] + self.refine(kept)) * scores[keep].unsqueeze(-1)

    def before_refine(self, kept: torch.Tensor) -> torch.Tensor:
        return kept


class DetectWithFallback(DetectLike):
    """DetectLike with an op disc leaves to PyTorch (a Bessel function) between the selection and the
    MLP: the count born at the first segment's nonzero is bound in the second from the tensor it reads."""

    def before_refine(self, kept: torch.Tensor) -> torch.Tensor:
        return torch.special.bessel_j0(kept)


DETECT_DYNAMIC = {"x": {0: "b", 2: "h", 3: "w"}}
# (1, 3, 1, 1): one location, never above its own mean, so nothing is kept.
DETECT_SHAPES = [(1, 3, 1, 1), (1, 3, 8, 8), (2, 3, 33, 47), (3, 3, 64, 40)]


def _compile_detector(backend: str | None = None, device: str = "cpu", model_type: type = DetectWithFallback) -> tuple[nn.Module, disc.CompiledModule]:
    torch.manual_seed(0)
    model = model_type().eval().to(device)
    return model, disc.compile(model, (torch.randn(2, 3, 24, 20, device=device),), dynamic=DETECT_DYNAMIC, backend=backend)


def _check(model: nn.Module, cm: disc.CompiledModule, shapes, seed: int = 1, device: str = "cpu") -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for shape in shapes:
            x = torch.randn(*shape, generator=g).to(device)
            expected, got = model(x), cm(x)
            assert got.shape == expected.shape, (shape, got.shape, expected.shape)
            if expected.numel():
                err = ((got - expected).abs().max() / expected.abs().max().clamp_min(1e-6)).item()
                assert err < 1e-4, (shape, err)


def test_detector_runs_as_native_segments() -> None:
    model, cm = _compile_detector()
    assert cm.report.backend.name == "native-cpu segments", cm.report.backend.reason
    assert isinstance(cm.executor, SegmentedExecutor)
    segments = cm.executor.plan.segments
    assert len(segments) == 2 and all(isinstance(s.executor, NativeExecutor) for s in segments)
    # The Bessel function runs in PyTorch after the first segment, which also runs the nonzero
    # (natively) and the gathers of the kept rows.
    assert [f.op for f in cm.executor.plan.host_ops[0]] == ["host_call"]
    assert [n.op for n in segments[0].graph.nodes].count("nonzero") == 1
    assert sum(cm.report.fallbacks.values()) == 1
    _check(model, cm, DETECT_SHAPES)


def test_segment_inputs_and_outputs() -> None:
    """Only what crosses a cut is handed on; the refine MLP's weights are folded into its segment, not passed."""
    _, cm = _compile_detector()
    first, second = cm.executor.plan.segments
    fallbacks = cm.executor.plan.host_ops[0]
    read_by_fallbacks = {x for f in fallbacks for x in f.inputs}
    assert read_by_fallbacks <= set(first.outputs) <= read_by_fallbacks | set(second.inputs)
    assert [x.op for x in second.inputs].count("host_call") == 1 and second.inputs[0].op == "input"
    assert {x for x in second.inputs if x.op != "input"} <= set(first.outputs) | set(fallbacks)
    assert second.outputs == cm.graph.outputs
    # The first segment's outputs are sized by the count, which it reports; the second binds the
    # count from the shapes of what it reads, and folds the transposed weights.
    assert first.build.source.data_dependent and not second.build.source.data_dependent
    assert second.build.lowered.counts()["library"] == 2
    assert len(second.build.lowered.folded_views) == 2


def test_segments_are_cheaper_than_the_reference_executor() -> None:
    """Kernel counts: the fused native segments launch far fewer kernels than ops the reference would run."""
    model, cm = _compile_detector()
    ref = disc.compile(model, (torch.randn(2, 3, 24, 20),), dynamic=DETECT_DYNAMIC, backend="reference")
    x = torch.randn(2, 3, 31, 29)
    ours, theirs = cm.profile(x), ref.profile(x)
    assert ours.kernels["fallback"] == theirs.kernels["fallback"] == 1  # the Bessel function, run by PyTorch
    assert ours.kernels["memory_bound"] < theirs.kernels["memory_bound"]


def check_concurrent_calls(model: nn.Module, cm: disc.CompiledModule, run_in_threads, seed: int) -> None:
    """Calls of ``cm`` from several threads at once, at different shapes (and kept counts), against eager."""
    g = torch.Generator().manual_seed(seed)
    cases = [torch.randn(*s, generator=g) for s in [(1, 3, 9, 13), (2, 3, 40, 32), (3, 3, 17, 5), (1, 3, 64, 64), (1, 3, 1, 1)] * 3]
    with torch.no_grad():
        expected = [model(x) for x in cases]
    got: list = [None] * len(cases)

    def work(i: int) -> None:
        with torch.no_grad():
            got[i] = cm(cases[i])

    run_in_threads(work, len(cases))
    for e, o in zip(expected, got):
        assert o.shape == e.shape and torch.allclose(o, e, rtol=1e-4, atol=1e-5)


def test_concurrent_calls_with_different_shapes(run_in_threads) -> None:
    model, cm = _compile_detector()
    check_concurrent_calls(model, cm, run_in_threads, seed=3)


def test_explain_lists_segments_and_fallbacks() -> None:
    _, cm = _compile_detector()
    text = disc.explain(cm)
    assert "2 compiled segments; 1 op run by PyTorch between them" in text
    assert "segment 0: reads %x; hands on" in text
    assert "then PyTorch: %" in text and "= host_call(" in text
    assert text.count("-- backend: native CPU program --") == 2


class _Around(nn.Module):
    """Compiled ops before and after one op disc leaves to PyTorch."""

    def __init__(self, op) -> None:
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.op(torch.tanh(x) * 2 + 1)
        return torch.relu(y - y.mean(dim=-1, keepdim=True)) if y.dim() == 2 else y.exp()


FALLBACK_OPS = {
    "sort": lambda y: torch.sort(y, dim=-1).values,
    "topk": lambda y: torch.topk(y, 1, dim=-1).values,
    "cummax": lambda y: torch.cummax(y, dim=1).values,
    "median": lambda y: y.median(dim=1).values,
    "nonzero": lambda y: torch.nonzero(y > 1.5)[:, 1].float(),
    # The fallback reads a literal scalar, which segments inline and never hold (wav2vec2's KeyError: None).
    "reads_a_literal": lambda y: torch.special.zeta(y.abs() + 2, torch.tensor(3.0)),
}


@pytest.mark.parametrize("name", sorted(FALLBACK_OPS))
def test_fallback_op_between_compiled_ops(name: str) -> None:
    model = _Around(FALLBACK_OPS[name]).eval()
    cm = disc.compile(model, (torch.randn(5, 7),), dynamic={"x": {0: "a", 1: "b"}})
    assert cm.report.fallbacks and cm.report.backend.name == "native-cpu segments", cm.report.backend.reason
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for shape in [(1, 1), (1, 9), (5, 7), (3, 16), (2, 33)]:
            x = torch.randn(*shape, generator=g)
            expected, got = model(x), cm(x)
            assert got.shape == expected.shape and torch.allclose(got, expected, rtol=1e-5, atol=1e-6), (name, shape)


PLAN_IR = """
func @plan(%x: f32[n, 4]) {
  sym n in [0, inf]  (input 'x' dim 0)
  sym u0 in [0, inf]  (torch symbol u0)
  %w = constant() {dtype="f32", ref="w", value=none} : f32[3, 4]
  %a = exp(%x) : f32[n, 4]
  %f = host_call(%a) {call="pick", dtype="f32", shape=["u0", "4"], target="aten.pick"} : f32[u0, 4]
  %g = host_call(%f) {call="again", dtype="f32", shape=["u0", "4"], target="aten.again"} : f32[u0, 4]
  %wt = transpose(%w) {perm=[1, 0]} : f32[4, 3]
  %y = dot_general(%g, %wt) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[u0, 3]
  %z = tanh(%y) : f32[u0, 3]
  return %z, %a
}
"""


def test_plan_places_ops_by_stage() -> None:
    """IR in, plan out: a fallback reading a fallback runs at the same point; the transposed constant is copied."""
    g = parse_graph(PLAN_IR)
    g.constants["w"] = torch.randn(3, 4)
    by_name = {n.name: n for n in g.nodes}
    stage = stages(g, host_ops(g))
    assert [stage[by_name[k]] for k in ("a", "f", "g", "y", "z")] == [0, 0, 0, 1, 1]
    plan = plan_segments(g)
    assert [[f.name for f in fs] for fs in plan.host_ops] == [["f", "g"], []]
    first, second = plan.segments
    assert [o.name for o in first.outputs] == ["a"]  # read by %f and returned
    assert [x.name for x in second.inputs] == ["x", "g"]  # %wt is copied, not handed on
    assert [n.op for n in second.graph.nodes if n.op not in ("input", "dim")] == ["constant", "transpose", "dot_general", "tanh"]
    assert [o.name for o in second.outputs] == ["z"]


def test_segments_on_triton() -> None:
    """The same cut on the GPU path (Triton's interpreter on CPU tensors in CI)."""
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, cm = _compile_detector(backend="triton", device=device, model_type=DetectLike)
    assert cm.report.backend.name in ("triton-interpreter segments", "triton-gpu segments"), cm.report.backend.reason
    # The Triton host flow sizes every buffer before its first launch, so the nonzero runs in PyTorch.
    assert [f.op for f in cm.executor.plan.host_ops[0]] == ["nonzero"]
    _check(model, cm, [(1, 3, 1, 1), (2, 3, 13, 11)], device=device)


class _CumsumBetween(nn.Module):
    """cumsum has reference semantics but no C++ kernel form: the code generator refuses it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cumsum(torch.tanh(x) * 2 + 1, dim=-1)
        return torch.softmax(y - y.mean(dim=-1, keepdim=True), dim=-1)


def test_refused_op_runs_in_pytorch_between_segments() -> None:
    model = _CumsumBetween()
    cm = disc.compile(model, (torch.randn(5, 7),), dynamic={"x": {0: "a", 1: "b"}})
    assert not cm.report.fallbacks  # the frontend lowered everything; the code generator refused cumsum
    assert cm.report.backend.name == "native-cpu segments", cm.report.backend.reason
    assert "1 refused by the code generator" in cm.report.backend.reason
    [[refused]] = [fs for fs in cm.executor.plan.host_ops if fs]
    assert refused.op == "cumsum" and "no C++ kernel form" in cm.executor.plan.reasons[refused]
    assert [len(s.graph.outputs) for s in cm.executor.plan.segments] == [1, 1]  # before it and after it
    assert "then PyTorch: %" in disc.explain(cm) and "= cumsum(" in disc.explain(cm)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for shape in [(1, 1), (1, 9), (5, 7), (3, 16), (2, 33)]:
            x = torch.randn(*shape, generator=g)
            assert torch.allclose(cm(x), model(x), rtol=1e-5, atol=1e-6), shape


def test_explicit_native_backend_still_refuses() -> None:
    """backend="native" asks for the whole program in C++: a refused op is an error naming it, not a segment."""
    with pytest.raises(disc.CompileError, match="cumsum"):
        disc.compile(_CumsumBetween(), (torch.randn(5, 7),), dynamic={"x": {0: "a", 1: "b"}}, backend="native")
