"""Fusion planning: groups decided from shape constraints, checked on the patterns that matter."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import disc
from disc.fusion.plan import plan_fusion


def plan_of(model: torch.nn.Module, args: tuple, dynamic: dict):
    return plan_fusion(disc.compile(model, args, dynamic=dynamic).graph)


class LayerNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.norm(x + residual)


class MaskedSoftmax(torch.nn.Module):
    def forward(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.softmax(scores * 0.125 + mask, dim=-1)


class LinearGelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(32, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.linear(x))


def test_residual_layernorm_is_one_stitch_kernel() -> None:
    plan = plan_of(LayerNorm(), (torch.randn(5, 32), torch.randn(5, 32)), {"x": {0: "rows"}, "residual": {0: "rows"}})
    assert plan.counts() == {"stitch": 1}
    (group,) = plan.groups
    assert sum(n.op == "reduce" for n in group.nodes) == 2  # mean and variance in the same kernel


def test_softmax_with_scale_and_mask_is_one_stitch_kernel() -> None:
    dynamic = {"scores": {0: "b", 2: "s", 3: "s"}, "mask": {0: "b", 3: "s"}}
    plan = plan_of(MaskedSoftmax(), (torch.randn(2, 3, 7, 7), torch.randn(2, 1, 1, 7)), dynamic)
    assert plan.counts() == {"stitch": 1}
    ops = [n.op for n in plan.groups[0].nodes]
    assert ops.count("reduce") == 2 and "exp" in ops and "div" in ops


def test_gemm_is_a_library_call_and_its_epilogue_one_loop() -> None:
    plan = plan_of(LinearGelu(), (torch.randn(5, 32),), {"x": {0: "rows"}})
    kinds = [g.kind for g in plan.groups if g.root.op != "transpose"]  # the weight's transpose folds later
    assert kinds == ["library", "loop"]
    epilogue = plan.groups[-1]
    assert [n.op for n in epilogue.nodes if n.op != "broadcast_in_dim"] == ["add", "gelu"]


def test_unfusible_op_splits_groups() -> None:
    class GatherBetween(torch.nn.Module):
        def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            return torch.exp(torch.index_select(torch.sin(x), 0, idx))

    plan = plan_of(GatherBetween(), (torch.randn(4, 9), torch.tensor([0, 3, 1])), {"x": {0: "a", 1: "b"}, "idx": {0: "k"}})
    assert [g.kind for g in plan.groups] == ["loop", "kernel", "loop"]


def test_independent_dims_do_not_fuse_without_proof() -> None:
    # x is [a], y is [b]: nothing proves a == b, so the two reductions stay separate kernels
    # even though their scalar results meet in one add.
    class TwoSums(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.exp(x).sum() + torch.exp(y).sum()

    plan = plan_of(TwoSums(), (torch.randn(6), torch.randn(5)), {"x": {0: "a"}, "y": {0: "b"}})
    groups_with_reduce = [g for g in plan.groups if any(n.op == "reduce" for n in g.nodes)]
    # Each reduction keeps exp (input fusion); the scalar add joins one of them, not both spaces.
    assert all(sum(n.op == "exp" for n in g.nodes) == 1 for g in groups_with_reduce)
    assert plan.memory_bound_kernels == 2


def test_fallback_op_is_its_own_group() -> None:
    class Sorted(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.exp(torch.sort(torch.sin(x)).values)  # sort has no lowering

    plan = plan_of(Sorted(), (torch.randn(9),), {"x": {0: "n"}})
    fallbacks = [g for g in plan.groups if g.kind == "fallback"]
    assert fallbacks and all(len(g.nodes) == 1 and g.root.op == "host_call" for g in fallbacks)
    assert plan.memory_bound_kernels == len(plan.groups) - len(fallbacks)


def test_refused_edges_name_the_rule_that_kept_them_apart() -> None:
    class Mixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.linear(x))  # GEMM -> epilogue: a library call is never fused into
            return torch.exp(h).sum() + torch.exp(y).sum()  # rows of a*8 and b: no proof they match

    plan = plan_of(Mixed(), (torch.randn(3, 8), torch.randn(5)), {"x": {0: "a"}, "y": {0: "b"}})
    reasons = {(r.producer.op, r.reason.split(" (")[0]) for r in plan.refused}
    assert ("dot_general", "the producer is a library call") in reasons
    assert ("reduce", "their reductions reduce different rows") in reasons
    described = plan.describe()
    assert "edges not fused" in described and "-/->" in described
    # Every refusal is an edge between two different groups in the final plan.
    group_of = {n: k for k, g in enumerate(plan.groups) for n in g.nodes}
    assert all(group_of.get(r.producer) != group_of.get(r.consumer) for r in plan.refused)


def test_transposed_softmax_is_not_fused_into_the_row_kernel() -> None:
    class SoftmaxBothWays(torch.nn.Module):
        def forward(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            p = torch.softmax(s, dim=-1)
            return p, p.transpose(-1, -2) * 2.0  # reads other rows' results

    plan = plan_of(SoftmaxBothWays(), (torch.randn(2, 7, 7),), {"s": {0: "b", 1: "q", 2: "k"}})
    stitch = [g for g in plan.groups if g.kind == "stitch"]
    assert len(stitch) == 1 and not any(n.op == "transpose" for n in stitch[0].nodes)
    assert any("rows other than the one being computed" in r.reason for r in plan.refused)


def test_a_reduction_broadcast_onto_other_rows_is_not_stitched() -> None:
    class MinusOtherRowsMax(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.exp(x - x.amax(1))  # [n, n]: column j subtracts row j's max

    class MinusOwnRowsMax(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.exp(x - x.amax(1, keepdim=True))

    square = (torch.randn(6, 6),)
    other = plan_of(MinusOtherRowsMax(), square, {"x": {0: "n", 1: "n"}})
    assert [g.kind for g in other.groups] == ["input", "loop"]
    assert any("transpose, reshape or broadcast would read" in r.reason for r in other.refused)
    own = plan_of(MinusOwnRowsMax(), square, {"x": {0: "n", 1: "n"}})
    assert [g.kind for g in own.groups] == ["stitch"]
    compiled = disc.compile(MinusOtherRowsMax(), square, dynamic={"x": {0: "n", 1: "n"}})
    assert compiled.report.backend.name == "native-cpu"  # it fell back to the reference executor
    for n in (1, 4, 9):
        x = torch.randn(n, n) * 3
        torch.testing.assert_close(compiled(x), torch.exp(x - x.amax(1)), rtol=2e-6, atol=0)


def test_groups_run_after_the_groups_they_read() -> None:
    class EarlyAndLate(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            v = torch.relu(x) + 1.0  # feeds a GEMM early and a transposed output at the end
            out = torch.exp(self.linear(v)).sum(-1)
            return out, v.transpose(0, 1)

    plan = plan_of(EarlyAndLate(), (torch.randn(5, 8),), {"x": {0: "rows"}})
    position = {n: k for k, g in enumerate(plan.groups) for n in g.nodes}
    for k, g in enumerate(plan.groups):
        for n in g.nodes:
            for x in n.inputs:
                if x in position and x not in g.nodes:
                    assert position[x] < k, f"group {k} reads %{x.name} computed by group {position[x]}"


def test_a_producer_that_also_feeds_a_gemm_the_group_reads_is_not_pulled_in() -> None:
    """The residual of a transformer layer: h feeds the GEMM and is added to its result. Pulling h
    into the add's group would make that kernel depend on itself through the GEMM."""

    class Residual(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.exp(x) * 2.0
            return torch.tanh(h + self.linear(h))

    plan = plan_of(Residual(), (torch.randn(5, 8),), {"x": {0: "rows"}})
    group_of = {n: k for k, g in enumerate(plan.groups) for n in g.nodes}
    exp = next(n for n in group_of if n.op == "exp")
    tanh = next(n for n in group_of if n.op == "tanh")
    assert group_of[exp] < group_of[tanh]  # two groups, the producer's scheduled first
    cycle = [r for r in plan.refused if r.reason == "one kernel would depend on itself through another kernel"]
    assert cycle and all(group_of[r.producer] == group_of[exp] and group_of[r.consumer] == group_of[tanh] for r in cycle)


def test_a_scatter_recomputes_its_broadcast_index_and_zero_base() -> None:
    """An embedding's backward scatters rows of the gradient at the token ids: the ids broadcast
    along the row and the zero base are computed inside the scatter kernel, not written out (an
    int64 copy of the ids per gradient element, 2 MB at 8x128 tokens of width 256) and read back."""
    emb = torch.nn.Embedding(10, 8)
    eager = torch.nn.Embedding(10, 8)
    eager.load_state_dict(emb.state_dict())
    before = len(disc.reports())
    compiled = torch.compile(emb, backend="disc", dynamic=True)
    for shape in [(3, 5), (1, 1), (2, 7)]:
        ids = torch.randint(0, 10, shape)
        compiled(ids).pow(2).sum().backward()
        eager(ids).pow(2).sum().backward()
        torch.testing.assert_close(emb.weight.grad, eager.weight.grad)
    (backward,) = [r for r in disc.reports()[before:] if "backward" in r.name]
    plan = plan_fusion(backward.graph)
    (scatter,) = [g for g in plan.groups if g.root.op == "scatter_add"]
    assert scatter.kind == "kernel"
    assert sorted(n.op for n in scatter.nodes) == ["broadcast_in_dim", "broadcast_in_dim", "scatter_add"]
    base, index, _ = scatter.root.inputs
    assert base in scatter.nodes and index in scatter.nodes
    assert not [g for g in plan.groups if {n.op for n in g.nodes} == {"broadcast_in_dim"}]


class ScaleRowsByGathered(torch.nn.Module):
    """Rows scaled by gathered scores viewed as a column: [n] -> [n, 1] -> broadcast (the detector's tail)."""

    def forward(self, x: torch.Tensor, table: torch.Tensor, idx: torch.Tensor, col: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = table[idx]  # a gather: a kernel of its own, its result in memory whatever the plan does
        return x * s.unsqueeze(-1), x * torch.sigmoid(s).unsqueeze(-1), col * s.unsqueeze(-1)


def _reshape_only_groups(plan) -> list:
    return [g for g in plan.groups if {n.op for n in g.nodes} == {"reshape"}]


def test_a_unit_dim_reshape_of_a_buffer_is_read_in_place_not_copied() -> None:
    """A reshape that only adds a dim of size 1 to a value in memory anyway (an input, a gather's
    or a GEMM's result) used to be a kernel of its own copying that value (the detector's kept
    scores, BERT's position embeddings [seq, d] -> [1, seq, d]); the kernels reading it now read
    the value through the unit dims. A reshape of a fused value stays in its producer's kernel."""
    m = ScaleRowsByGathered()
    dyn = {"x": {0: "n"}, "table": {0: "m"}, "idx": {0: "n"}, "col": {0: "n"}}
    args = (torch.randn(5, 4), torch.randn(7), torch.randint(0, 7, (5,)), torch.randn(5, 1))
    plan = plan_of(m, args, dyn)
    assert not _reshape_only_groups(plan)
    ops = sorted([n.op for n in g.nodes] for g in plan.groups)
    # The two broadcasts read s and sigmoid(s) directly (remove_noops drops the reshape under a
    # broadcast); col * s.unsqueeze(-1) recomputes the reshape of the gather's result in place.
    assert ops == [["broadcast_in_dim", "mul"], ["broadcast_in_dim", "mul"], ["index_select"], ["reshape", "mul"], ["sigmoid"]]
    compiled = disc.compile(m, args, dynamic=dyn)
    assert compiled.report.backend.name == "native-cpu"
    assert "kernel fusing: reshape\n" not in compiled.executor.native.source.text
    for n, rows in ((1, 1), (2, 9), (7, 3)):
        x, table, idx, col = torch.randn(n, 4), torch.randn(rows), torch.randint(0, rows, (n,)), torch.randn(n, 1)
        for got, want in zip(compiled(x, table, idx, col), m(x, table, idx, col)):
            torch.testing.assert_close(got, want)


def test_a_unit_dim_reshape_returned_by_the_program_is_still_written_out() -> None:
    class ColumnOut(torch.nn.Module):
        def forward(self, x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            col = s.unsqueeze(-1)
            return x * col, col

    m, dyn = ColumnOut(), {"x": {0: "n"}, "s": {0: "n"}}
    compiled = disc.compile(m, (torch.randn(5, 4), torch.randn(5)), dynamic=dyn)
    assert compiled.report.backend.name == "native-cpu"
    for n in (1, 6):
        x, s = torch.randn(n, 4), torch.randn(n)
        got, want = compiled(x, s), m(x, s)
        assert got[1].shape == (n, 1) and got[1].data_ptr() != s.data_ptr()
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)


class LayerNormByUnsqueeze(torch.nn.Module):
    """LayerNorm as often written by hand: statistics without keepdim, unsqueezed back."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1).unsqueeze(-1)
        var = ((x - mean) ** 2).mean(-1).unsqueeze(-1)
        return (x - mean) * torch.rsqrt(var + 1e-5)


class SoftmaxOverMiddleDim(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = torch.exp(x - x.amax(1).unsqueeze(1))
        return e / e.sum(1).view(x.shape[0], 1, x.shape[2])


def test_statistics_unsqueezed_back_onto_their_rows_are_one_stitch_kernel() -> None:
    """``x.mean(-1).unsqueeze(-1)`` reads each row's mean at its own row: the unit dim is a view,
    not a move to other rows. It used to split a LayerNorm into 4 kernels (the reshape was taken
    for one that reads other rows)."""
    cases = (
        (LayerNormByUnsqueeze(), {"x": {0: "b", 1: "s"}}, [(1, 1, 16), (2, 7, 16), (3, 1, 16)], (2, 5, 16)),
        (SoftmaxOverMiddleDim(), {"x": {0: "b", 1: "n", 2: "s"}}, [(1, 1, 1), (2, 7, 5), (3, 9, 1)], (2, 7, 5)),
    )
    for m, dyn, shapes, example in cases:
        plan = plan_of(m, (torch.randn(*example),), dyn)
        assert [g.kind for g in plan.groups] == ["stitch"], (type(m).__name__, plan.counts())
        compiled = disc.compile(m, (torch.randn(*example),), dynamic=dyn)
        assert compiled.report.backend.name == "native-cpu"
        for shape in shapes:
            x = torch.randn(*shape) * 3
            torch.testing.assert_close(compiled(x), m(x), rtol=1e-5, atol=1e-6)


def test_statistics_unsqueezed_onto_other_rows_are_not_stitched() -> None:
    class MinusOtherRowsMaxUnsqueezed(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x - x.amax(1).unsqueeze(0)  # [n, n]: column j subtracts row j's max

    dyn = {"x": {0: "n", 1: "n"}}
    plan = plan_of(MinusOtherRowsMaxUnsqueezed(), (torch.randn(6, 6),), dyn)
    (sub,) = [g for g in plan.groups if "sub" in {n.op for n in g.nodes}]
    assert "reduce" not in {n.op for n in sub.nodes}
    compiled = disc.compile(MinusOtherRowsMaxUnsqueezed(), (torch.randn(6, 6),), dynamic=dyn)
    for n in (1, 4, 9):
        x = torch.randn(n, n)
        torch.testing.assert_close(compiled(x), x - x.amax(1).unsqueeze(0), rtol=0, atol=0)


class Rotary(torch.nn.Module):
    """A rotary embedding as LLaMA writes it: rotate_half is two slices, a neg and a concat."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x * 2.0  # a fused producer, computed at the positions the slices read
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


ROTARY_DYN = {"x": {0: "b", 2: "s"}, "cos": {0: "s"}, "sin": {0: "s"}}


def _rotary_args(b: int, s: int) -> tuple[torch.Tensor, ...]:
    return torch.randn(b, 2, s, 16), torch.randn(s, 16), torch.randn(s, 16)


def test_rotate_half_and_its_producer_are_one_loop_kernel() -> None:
    """Slices, neg, concat and the multiply-add of a rotary embedding: one kernel that computes
    ``x * 2`` at the positions the slices read instead of writing it and four parts out."""
    m = Rotary()
    plan = plan_of(m, _rotary_args(2, 5), ROTARY_DYN)
    assert [g.kind for g in plan.groups] == ["loop"], plan.describe()
    assert {"slice", "concat", "neg", "mul", "add"} <= {n.op for n in plan.groups[0].nodes}
    compiled = disc.compile(m, _rotary_args(2, 5), dynamic=ROTARY_DYN)
    assert compiled.report.backend.name == "native-cpu"
    for b, s in ((1, 1), (2, 7), (3, 4)):
        args = _rotary_args(b, s)
        torch.testing.assert_close(compiled(*args), m(*args))


def test_a_sliced_value_also_returned_is_written_by_the_kernel_that_reads_its_parts() -> None:
    """``x * 2`` is returned, so it is not folded away: the one kernel writes it at its own
    positions and recomputes it where the slices read (a multiply, cheaper than a reload)."""
    class RotaryAlsoReturningX(torch.nn.Module):
        def forward(self, x, cos, sin):
            x = x * 2.0
            rotated = torch.cat([-x[..., 8:], x[..., :8]], dim=-1)
            return x * cos + rotated * sin, x

    m = RotaryAlsoReturningX()
    compiled = disc.compile(m, _rotary_args(2, 5), dynamic=ROTARY_DYN)
    plan = plan_fusion(compiled.graph)
    assert [g.kind for g in plan.groups] == ["loop"], plan.describe()
    assert compiled.graph.outputs[1] in plan.groups[0].nodes
    for b, s in ((1, 1), (3, 6)):
        args = _rotary_args(b, s)
        for got, want in zip(compiled(*args), m(*args)):
            torch.testing.assert_close(got, want)


def test_a_concat_is_not_fused_with_a_reduction() -> None:
    class ConcatThenSum(torch.nn.Module):
        def forward(self, a, b):
            return torch.cat([a * 2, b], dim=-1).sum(-1)

    dyn = {"a": {0: "n", 1: "k"}, "b": {0: "n", 1: "m"}}
    plan = plan_of(ConcatThenSum(), (torch.randn(3, 4), torch.randn(3, 5)), dyn)
    assert any(r.reason == "a slice, concat or pad is not fused with a reduction" for r in plan.refused)
    compiled = disc.compile(ConcatThenSum(), (torch.randn(3, 4), torch.randn(3, 5)), dynamic=dyn)
    for n, k, mm in ((1, 1, 1), (4, 3, 9)):
        a, b = torch.randn(n, k), torch.randn(n, mm)
        torch.testing.assert_close(compiled(a, b), ConcatThenSum()(a, b))


CONV_EPILOGUES = """
func @main(%x: f32[n, h, w, 4], %k: f32[8, 4, 3, 3], %k2: f32[8, 8, 1, 1], %s: f32[8], %t: f32[8]) {
  sym n in [0, inf]  (input 'x' dim 0)
  sym h in [1, inf]  (input 'x' dim 1)
  sym w in [1, inf]  (input 'x' dim 2)
  %0 = dim(%x) {axis=0} : index(n)
  %1 = dim(%x) {axis=1} : index(h)
  %2 = dim(%x) {axis=2} : index(w)
  %3 = index_const() {value=8} : index(8)
  %4 = convolution(%x, %k) {channels_last=true, dilation=[1, 1], groups=1, output_padding=[], padding=[1, 1], stride=[1, 1], transposed=false} : f32[n, h, w, 8]
  %5 = broadcast_in_dim(%s, %0, %1, %2, %3) {dims=[3]} : f32[n, h, w, 8]
  %6 = add(%4, %5) : f32[n, h, w, 8]
  %7 = relu(%6) : f32[n, h, w, 8]
  %8 = convolution(%7, %k2) {channels_last=true, dilation=[1, 1], groups=1, output_padding=[], padding=[0, 0], stride=[1, 1], transposed=false} : f32[n, h, w, 8]
  %9 = broadcast_in_dim(%t, %0, %1, %2, %3) {dims=[3]} : f32[n, h, w, 8]
  %10 = add(%9, %8) : f32[n, h, w, 8]
  return %10
}
"""


def _groups(text: str, conv_epilogues: bool = True) -> list[tuple[str, list[str]]]:
    from disc.ir.parser import parse_graph

    plan = plan_fusion(parse_graph(text), conv_epilogues=conv_epilogues)
    return [(g.kind, [n.op for n in g.nodes]) for g in plan.groups]


def test_a_convolution_takes_its_bias_and_relu_where_the_backend_asks() -> None:
    bias_relu = ("library", ["convolution", "broadcast_in_dim", "add", "relu"])
    bias_first = ("library", ["convolution", "broadcast_in_dim", "add"])  # add(bias, conv): either side
    assert _groups(CONV_EPILOGUES) == [bias_relu, bias_first]
    assert _groups(CONV_EPILOGUES, conv_epilogues=False) == [
        ("library", ["convolution"]),
        ("loop", ["broadcast_in_dim", "add", "relu"]),
        ("library", ["convolution"]),
        ("loop", ["broadcast_in_dim", "add"]),
    ]


def test_a_convolution_leaves_an_epilogue_others_read_or_could_fuse_with() -> None:
    # The ReLU also read by an elementwise op (a residual add): that add would be left alone.
    residual = CONV_EPILOGUES.replace("return %10", "%11 = add(%10, %7) : f32[n, h, w, 8]\n  return %11")
    assert _groups(residual)[0] == ("library", ["convolution"])
    # The convolution's own result is returned: it must be written as it is.
    returned = CONV_EPILOGUES.replace("return %10", "return %10, %4")
    assert _groups(returned)[0] == ("library", ["convolution"])
    # A vector added along the width, not the channels: no bias.
    along_w = CONV_EPILOGUES.replace("%t: f32[8]", "%t: f32[w]").replace("%9 = broadcast_in_dim(%t, %0, %1, %2, %3) {dims=[3]}", "%9 = broadcast_in_dim(%t, %0, %1, %2, %3) {dims=[2]}")
    assert _groups(along_w)[-1] == ("loop", ["broadcast_in_dim", "add"])
