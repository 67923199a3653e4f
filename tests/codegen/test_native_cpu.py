"""The native CPU backend against PyTorch eager: every kernel form, speculation version and library call.

Each case compiles once with ``backend="native"`` (an error if the graph has no
native form) and runs at several shapes, including 1-sized and odd dims,
chosen so each speculation branch runs at least once.
"""

from __future__ import annotations

import re
import threading

import pytest
import torch
from kernel_cases import (
    CONV_GRADIENTS,
    HALF_CASES,
    HALF_POINTS,
    HALF_TOLERANCE,
    MAYBE_BROADCAST,
    MIXED_KEEPDIM_SUMS,
    Attention,
    AttentionSavingForBackward,
    BiasGelu,
    ConcatThree,
    ConvChain,
    ConvPool,
    Elementwise,
    GroupedQueryAttention,
    MaskedSoftmax,
    Movement,
    Norms,
    PartsOfAProducer,
    Powers,
    RepeatedRows,
    ReshapeByWidth,
    RowSum,
    Scale,
    check_against_eager,
    check_half_against_eager,
    half_case,
)
from torch import nn

import disc
from disc.codegen.cpu.program import KernelCall
from disc.codegen.lowering import LibraryStep
from disc.ir.parser import parse_graph
from disc.passes.pipeline import run_pipeline
from disc.runtime.native import NativeExecutor, build_native
from disc.runtime.reference import ReferenceExecutor

torch.manual_seed(0)


def _compile(model: nn.Module, args: tuple, dynamic: dict) -> disc.CompiledModule:
    cm = disc.compile(model.eval(), args, dynamic=dynamic, backend="native")
    assert isinstance(cm.executor, NativeExecutor)
    return cm


def _check(cm, model: nn.Module, args: tuple, tol: float = 1e-5) -> None:
    check_against_eager(cm, model, args, tol)


BXS = {0: "b", 1: "s"}


def test_loop_kernel_elementwise_chain():
    m = Elementwise()
    cm = _compile(m, (torch.randn(2, 5), torch.randn(2, 5)), {"x": BXS, "y": BXS})
    for shape in [(1, 1), (3, 7), (4, 33), (1, 130)]:
        _check(cm, m, (torch.randn(*shape), torch.randn(*shape)))
    assert cm.executor.native.lowered.counts() == {"memory_bound": 1, "library": 0}


def test_loop_kernel_broadcast_bias_gelu():
    m = BiasGelu()
    cm = _compile(m, (torch.randn(2, 3, 24),), {"x": BXS})
    for shape in [(1, 1, 24), (2, 9, 24), (5, 17, 24)]:
        _check(cm, m, (torch.randn(*shape),))


class BiasGeluSavingInput(nn.Module):
    """A training forward's bias + GELU: the GEMM's 2-D output plus bias is kept for the backward,
    and GELU'd viewed as (batch, seq, hidden)."""

    def __init__(self) -> None:
        super().__init__()
        self.b = nn.Parameter(torch.randn(24))

    def forward(self, x):
        y = x.flatten(0, 1) + self.b
        return y, nn.functional.gelu(y.view_as(x))


def test_an_output_of_another_shape_is_indexed_by_row_not_by_divisions():
    """Each output of a loop kernel is written at the row's own index when the shapes share their
    trailing dims: splitting the flat index by divisions at every element made the kernel 1.5x slower."""
    m = BiasGeluSavingInput()
    cm = _compile(m, (torch.randn(2, 3, 24),), {"x": BXS})
    for shape in [(1, 1, 24), (2, 9, 24), (5, 17, 24)]:
        _check(cm, m, (torch.randn(*shape),))
    source = cm.executor.native.source.text
    kernel = source[source.index("// loop kernel fusing") :]
    inner = kernel[kernel.index("for (int64_t j") : kernel.index("\n  }\n")]
    assert "%" not in inner and " / " not in inner, inner
    assert inner.count("disc_gelu") == 1 and len(re.findall(r"\(v\d+ \+ v\d+\)", inner)) == 1, inner  # one sum


class MergeHeadsAndSum(nn.Module):
    """An attention backward's head merge, (b, heads, s, d) -> (b*s, heads*d), with its bias gradient (a column sum)."""

    def forward(self, x):
        merged = x.transpose(1, 2).reshape(-1, x.shape[1] * x.shape[3])
        return merged, merged.sum(0)


def test_a_reshape_moves_rows_and_columns_apart():
    """(b*s, 4*64) -> (b, s, 4, 64): the row splits by s once per row, the column by constants;
    splitting the flat index by the symbolic s at every element kept the loop from running fast."""
    m = MergeHeadsAndSum()
    cm = _compile(m, (torch.randn(2, 4, 3, 64),), {"x": {0: "b", 2: "s"}})
    for shape in [(1, 4, 1, 64), (2, 4, 9, 64), (3, 4, 17, 64)]:
        _check(cm, m, (torch.randn(*shape),))
    source = cm.executor.native.source.text
    inner = [loop for loop in re.findall(r"for \(int64_t j = 0; j < cols; \+\+j\) \{\n(.*?)\n\s*\}", source, re.S) if "in0[" in loop]
    assert inner, source
    for loop in inner:
        varying = {"j"}  # the loop's index and what is computed from it
        for name, rhs in re.findall(r"const \w+ (\w+) = (.*);", loop):
            if varying & set(re.findall(r"\w+", rhs)):
                varying.add(name)
                assert not re.search(r"[%/] s\.", rhs), loop  # a per-element division by a symbol


def test_input_fusion_reductions_leading_and_trailing_axes():
    m = RowSum()
    cm = _compile(m, (torch.randn(2, 3, 6),), {"x": {0: "b", 1: "s", 2: "n"}})
    for shape in [(1, 1, 1), (2, 5, 7), (3, 1, 64), (4, 9, 1)]:
        _check(cm, m, (torch.randn(*shape),), tol=1e-5)


def test_stitch_layernorm_and_rmsnorm_each_one_kernel():
    m = Norms()
    cm = _compile(m, (torch.randn(2, 3, 40), torch.randn(2, 3, 40)), {"x": BXS, "r": BXS})
    for shape in [(1, 1, 40), (2, 7, 40), (3, 64, 40)]:
        _check(cm, m, (torch.randn(*shape), torch.randn(*shape)))
    kinds = [c.step.kind for c in cm.executor.native.source.calls if isinstance(c, KernelCall)]
    assert kinds.count("stitch") >= 1 and len(kinds) <= 2, kinds


def test_stitch_masked_softmax_is_one_kernel():
    m = MaskedSoftmax()
    cm = _compile(m, (torch.randn(2, 4, 5, 5), torch.ones(2, 5)), {"s": {0: "b", 2: "q", 3: "k"}, "mask": {0: "b", 1: "k"}})
    for b, q, k in [(1, 1, 1), (2, 3, 5), (3, 7, 33), (1, 16, 100)]:
        _check(cm, m, (torch.randn(b, 4, q, k), (torch.rand(b, k) > 0.3).float()))
    calls = [c for c in cm.executor.native.source.calls if isinstance(c, KernelCall)]
    stitch = [c for c in calls if c.step.kind == "stitch"]
    assert len(stitch) == 1
    ops = [n.op for n in stitch[0].step.group.nodes]
    assert ops.count("reduce") == 2 and "exp" in ops and "div" in ops  # max, exp-sum and normalise in one kernel
    # The only other kernel prepares the additive mask once per (batch, key), not per score.
    assert all(c.step.group.nodes[-1].shape[1:3] == (1, 1) for c in calls if c not in stitch)


def test_broadcast_speculation_versions_both_run():
    # y's dim 0 is 1 (a broadcast) or equal to x's: only the values at run time tell.
    graph = parse_graph(MAYBE_BROADCAST)
    native = build_native(graph, profile=True)
    ex = NativeExecutor(graph, native)
    versions = [c.kernel.versions for c in native.source.calls if isinstance(c, KernelCall)]
    assert versions == [["no-broadcast", "general"]]
    for rows_x, rows_y in [(4, 4), (4, 1), (1, 1), (7, 7)]:
        x, y = torch.randn(rows_x, 9), torch.randn(rows_y, 9)
        (out,) = ex.run([x, y])
        torch.testing.assert_close(out, x * y)
    (hits,) = [p["calls"] for p in ex.step_profile()]
    assert hits["no-broadcast"] == 3 and hits["general"] == 1


def test_movement_ops_slice_concat_pad_index_select_transpose():
    m = Movement()
    cm = _compile(m, (torch.randn(3, 4, 5), torch.tensor([0, 2])), {"x": {0: "a", 1: "s", 2: "n"}, "ids": {0: "k"}})
    for a, s, n, k in [(1, 1, 1, 1), (3, 4, 5, 2), (5, 9, 3, 7)]:
        _check(cm, m, (torch.randn(a, s, n), torch.randint(0, a, (k,))))


def test_slices_concat_and_pad_read_their_producer_inside_the_consumer_kernel():
    m = PartsOfAProducer()
    cm = _compile(m, (torch.randn(2, 3, 8), torch.randn(2, 3, 8)), {"x": BXS, "y": BXS})
    for b, s in [(1, 1), (2, 5), (3, 17)]:
        _check(cm, m, (torch.randn(b, s, 8), torch.randn(b, s, 8)))
    calls = [c for c in cm.executor.native.source.calls if isinstance(c, KernelCall)]
    # One kernel per output; tanh(x) * 2 and sigmoid(x) are computed where they are read, never written.
    assert [len(c.step.outputs) for c in calls] == [1, 1], [[n.op for n in c.step.group.nodes] for c in calls]


def test_concat_of_three_parts_at_dynamic_offsets():
    m = ConcatThree()
    cm = _compile(m, (torch.randn(2, 3), torch.randn(2, 4)), {"x": {0: "b", 1: "n"}, "y": {0: "b", 1: "k"}})
    for b, n, k in [(1, 1, 1), (2, 3, 4), (3, 7, 2), (1, 64, 5)]:
        _check(cm, m, (torch.randn(b, n), torch.randn(b, k)))


def test_attention_gemms_read_heads_through_strides_and_need_no_copy_kernel():
    m = Attention()
    cm = _compile(m, (torch.randn(2, 5, 32),), {"x": BXS})
    for b, t in [(1, 1), (2, 5), (3, 17), (1, 64)]:
        _check(cm, m, (torch.randn(b, t, 32),), tol=1e-4)
    calls = cm.executor.native.source.calls
    for c in calls:
        if isinstance(c, KernelCall):
            ops = {n.op for n in c.step.group.nodes}
            assert ops != {"reshape", "transpose"} and ops != {"transpose"}, f"copy kernel {ops}"
            assert "slice" not in ops, f"the q/k/v split is copied: {ops}"
    assert sum(n.op == "slice" for n in cm.executor.native.lowered.folded_views) == 3  # read at offsets of the qkv result
    text = cm.executor.native.source.text
    assert text.count("ral->gemm(") == 4  # qkv, scores, context, output projection


def test_grouped_query_attention_reads_each_kv_head_again_instead_of_copying_it():
    m = GroupedQueryAttention()
    cm = _compile(m, (torch.randn(2, 5, 32),), {"x": BXS})
    for b, t in [(1, 1), (2, 5), (3, 17), (1, 64)]:
        _check(cm, m, (torch.randn(b, t, 32),), tol=1e-4)
    for c in cm.executor.native.source.calls:
        if isinstance(c, KernelCall):
            ops = {n.op for n in c.step.group.nodes}
            assert not ops <= {"broadcast_in_dim", "reshape", "transpose", "slice"}, f"K or V copied: {ops}"
    # the expanded K and V: batch dims of stride 0 in the scores and context GEMMs
    assert sum(n.op == "broadcast_in_dim" for n in cm.executor.native.lowered.folded_views) == 2
    assert "broadcast_in_dim 2" in disc.explain(cm)


def test_a_row_repeated_down_a_gemm_operand_is_written_out_and_exact():
    m = RepeatedRows()
    cm = _compile(m, (torch.randn(4, 5),), {"y": {0: "n"}})
    for n in (1, 4, 9):
        _check(cm, m, (torch.randn(n, 5),))
    assert not any(n.op == "broadcast_in_dim" for n in cm.executor.native.lowered.folded_views)


class GemmResultReshapedForTwoReaders(nn.Module):
    """A batched GEMM's result, reshaped, read by another GEMM and by a column sum: the attention
    backward's bias gradient (Segformer at batch 1 and one head)."""

    def forward(self, p: torch.Tensor, v: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = (p.transpose(-1, -2) @ v).reshape(-1, 16)
        return rows @ w, rows.sum(0)


def test_a_gemm_writing_its_reshaped_result_still_feeds_a_kernel_that_recomputed_the_reshape():
    # The GEMM writes the reshape's layout directly; the column sum had the (cheap) reshape
    # duplicated into its kernel, and that kernel was dropped with the reshape's own group:
    # its output was never written (uninitialised memory, no error).
    m = GemmResultReshapedForTwoReaders()
    w = torch.randn(16, 16)
    cm = _compile(m, (torch.randn(1, 1, 12, 5), torch.randn(1, 1, 12, 16), w), {"p": {2: "k", 3: "n"}, "v": {2: "k"}})
    for k, n in [(1, 1), (12, 5), (7, 1), (3, 9)]:
        _check(cm, m, (torch.randn(1, 1, k, n), torch.randn(1, 1, k, 16), w))


def test_values_saved_for_backward_come_out_of_their_kernels_in_order():
    m = AttentionSavingForBackward()
    cm = _compile(m, (torch.randn(2, 5, 32),), {"x": BXS})
    for b, t in [(1, 1), (2, 5), (3, 17), (1, 64)]:
        _check(cm, m, (torch.randn(b, t, 32),), tol=1e-4)


def test_convolution_and_pooling_through_the_library():
    m = ConvPool()
    cm = _compile(m, (torch.randn(1, 3, 16, 16),), {"x": {0: "n", 2: "h", 3: "w"}})
    for n, h, w in [(1, 8, 8), (2, 15, 17), (3, 32, 24)]:
        _check(cm, m, (torch.randn(n, 3, h, w),), tol=1e-4)
    assert "ral->conv2d(" in cm.executor.native.source.text


def test_convolutions_compute_their_bias_and_relu_in_the_library_call():
    m = ConvChain()
    cm = _compile(m, (torch.randn(1, 3, 16, 16),), {"x": {0: "n", 2: "h", 3: "w"}})
    for n, h, w in [(1, 1, 1), (2, 15, 17), (3, 32, 24), (1, 7, 40), (0, 5, 5)]:
        _check(cm, m, (torch.randn(n, 3, h, w),), tol=1e-4)
    lowered = cm.executor.native.lowered
    epilogues = [(s.epilogue.bias is not None, s.epilogue.relu) for s in lowered.steps if isinstance(s, LibraryStep) and s.epilogue]
    assert sorted(epilogues) == [(False, True), (True, False), (True, True), (True, True)]
    # What is left for kernels: the image's NCHW -> NHWC, the pool and the result's NHWC -> NCHW.
    assert lowered.counts() == {"memory_bound": 3, "library": 4}
    assert cm.executor.native.source.text.count("c.relu = 1;") == 3
    explained = disc.explain(cm)
    assert explained.count("computes its epilogue: + bias %") == 3 and "computes its epilogue: + relu -> %" in explained
    assert "library  -> %" in explained and "[convolution, broadcast_in_dim, add, relu]" in explained


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_convolution_gradients_through_the_library(layout):
    g = parse_graph(CONV_GRADIENTS)
    if layout == "nhwc":
        g = run_pipeline(g)  # channels_last: x and gy are read NHWC
        assert all(n.attrs["channels_last"] for n in g.nodes if n.op.startswith("convolution"))
    ex = NativeExecutor(g, build_native(g))
    assert "ral->conv2d_backward_data(" in ex.native.source.text and "ral->conv2d_backward_weights(" in ex.native.source.text
    for shape in [(2, 4, 9, 7), (1, 4, 1, 1), (3, 4, 2, 5), (0, 4, 3, 3)]:
        args = [torch.randn(shape), torch.randn(6, 2, 3, 3)]
        for got, want in zip(ex.run(args), ReferenceExecutor(g).run(args)):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_shape_errors_from_the_generated_checks():
    m = MaskedSoftmax()
    cm = _compile(m, (torch.randn(2, 4, 5, 5), torch.ones(2, 5)), {"s": {0: "b", 2: "q", 3: "k"}, "mask": {0: "b", 1: "k"}})
    with pytest.raises(disc.ShapeError):
        cm(torch.randn(2, 4, 5, 5), torch.ones(2, 6))


def test_a_run_time_division_by_zero_is_a_shape_error_not_a_crash():
    """reshape(-1, 2 * b) divides a * b by 2 * b at run time: b = 0 used to kill the process (SIGFPE)."""
    m = ReshapeByWidth()
    cm = _compile(m, (torch.randn(4, 6),), {"x": {0: "a", 1: "b"}})
    for shape in [(4, 5), (2, 1), (6, 3)]:
        _check(cm, m, (torch.randn(shape),))
    with pytest.raises(disc.ShapeError, match="must not multiply to 0"):
        cm(torch.randn(3, 0))
    with pytest.raises(disc.ShapeError, match="element count"):
        cm(torch.randn(3, 5))  # 15 elements are not rows of 10; torch refuses it too


def test_one_program_called_from_many_threads_with_different_shapes(run_in_threads):
    m = Attention()
    cm = _compile(m, (torch.randn(2, 5, 32),), {"x": BXS})
    shapes = [(1, 3), (2, 9), (3, 1), (4, 17), (1, 40), (2, 2)]
    inputs = {s: torch.randn(*s, 32) for s in shapes}
    with torch.no_grad():
        want = {s: m(x) for s, x in inputs.items()}
    errors: list[str] = []

    def worker(k: int) -> None:
        for rep in range(6):
            s = shapes[(k + rep) % len(shapes)]
            got = cm(inputs[s])
            if not torch.allclose(got, want[s], rtol=1e-4, atol=1e-5):
                errors.append(f"thread {k} shape {s}")

    run_in_threads(worker, 4)
    assert not errors


def test_workspace_is_kept_per_thread_and_grows_only_when_needed():
    m = Attention()
    cm = _compile(m, (torch.randn(2, 5, 32),), {"x": BXS})
    ex = cm.executor
    small, big = torch.randn(1, 3, 32), torch.randn(3, 40, 32)
    _check(cm, m, (big,), tol=1e-4)
    kept = ex._local.workspace
    _check(cm, m, (small,), tol=1e-4)  # a smaller call reuses the bigger buffer
    assert ex._local.workspace is kept
    seen: list[object] = []
    t = threading.Thread(target=lambda: (cm(small), seen.append(ex._local.workspace)))
    t.start()
    t.join()
    assert seen[0] is not kept  # another thread never shares this thread's workspace
    ex.release_workspace()
    assert ex._local.workspace is None
    _check(cm, m, (big,), tol=1e-4)


def test_workspace_grows_geometrically_so_a_growing_stream_reallocates_rarely():
    # A decoder's length grows by one each step: reallocating the kept workspace at every step
    # fragmented the heap (each new buffer a little bigger than the hole the last one left).
    m = Attention()
    cm = _compile(m, (torch.randn(2, 5, 32),), {"x": BXS})
    ex = cm.executor
    ex.release_workspace()
    buffers = []
    for seq in range(8, 40):
        _check(cm, m, (torch.randn(1, seq, 32),), tol=1e-4)
        if not buffers or ex._local.workspace is not buffers[-1]:
            buffers.append(ex._local.workspace)
    assert 2 <= len(buffers) <= 10, [b.numel() for b in buffers]  # 32 growing calls (scores grow as seq^2)
    for before, after in zip(buffers, buffers[1:]):
        assert after.numel() >= before.numel() * 3 // 2
    ex.release_workspace()


class TwoSizes(nn.Module):
    def forward(self, x):
        wide = torch.cat([x, x * 2], dim=-1).tanh()  # [b, 2n], dead after the sum
        narrow = wide.sum(-1, keepdim=True) + x  # [b, n]
        t = (narrow.tanh() * 3).sigmoid()  # [b, n], written after `wide` is dead
        return t.sum(-1) + t.sum(0).sum()  # a row and a column reduction: two kernels read t


def test_slots_never_live_together_share_bytes_at_every_shape():
    m = TwoSizes()
    cm = _compile(m, (torch.randn(3, 5),), {"x": BXS})
    ex = cm.executor
    slots = ex.native.lowered.slots
    assert any(not a.live_with(b) and a.size != b.size for a in slots for b in slots)
    for b, n in [(1, 1), (3, 5), (64, 33), (2, 1000)]:
        x = torch.randn(b, n)
        # 1e-4: a 2000-long float32 sum feeds a sum of 1000; the two orders of summation differ by
        # up to ~2e-5 of the result (measured against float64), and a shared slot written too early
        # would be off by far more.
        _check(cm, m, (x,), tol=1e-4)
        _, _, packed = ex._plan([x])
        side_by_side = int(ex.native.source.workspace_bound.evaluate({"b": b, "s": n}))
        biggest = max(int(s.size.evaluate({"b": b, "s": n})) for s in slots)
        assert biggest <= packed < side_by_side, (packed, side_by_side)


def test_identical_layers_share_kernels_and_a_second_compile_hits_the_cache():
    from disc.models import MODELS

    entry = MODELS["bert"]
    model = entry.build()
    args = entry.inputs(entry.export_shape)
    first = disc.compile(model, args, dynamic=entry.dynamic, backend="native")
    second = disc.compile(model, args, dynamic=entry.dynamic, backend="native")
    assert second.executor.native.build.cached
    src = first.executor.native.source
    kernel_calls = [c for c in src.calls if isinstance(c, KernelCall)]
    assert len(src.kernels) < len(kernel_calls)  # layers reuse the same functions
    for shape in entry.shapes[:4]:
        _check(first, model, entry.inputs(shape), tol=1e-4)


def test_run_writes_into_caller_buffers_and_names_a_wrong_one():
    m = BiasGelu()
    cm = _compile(m, (torch.randn(3, 24),), {"x": {0: "n"}})
    ex = cm.executor
    x = torch.randn(5, 24)
    buf = torch.empty(5, 24)
    (got,) = ex.run([x], out=[buf])
    assert got.data_ptr() == buf.data_ptr()
    torch.testing.assert_close(buf, m(x).detach(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"out\[0\]: expected a contiguous torch.float32 tensor of shape \[5, 24\]"):
        ex.run([x], out=[torch.empty(4, 24)])
    with pytest.raises(ValueError, match="not contiguous"):
        ex.run([x], out=[torch.empty(24, 5).t()])


def test_explain_lists_each_distinct_kernel_once_with_its_uses():
    import re

    from disc.models import MODELS

    e = MODELS["bert"]
    cm = disc.compile(e.factory().eval(), e.inputs(e.export_shape), dynamic=e.dynamic)
    text = disc.explain(cm)
    listed = re.findall(r"^  (\w+) x(\d+): \[", text, flags=re.M)
    names = [n for n, _ in listed]
    assert len(names) == len(set(names)) == len(cm.executor.native.source.kernels)
    assert sum(int(u) for _, u in listed) == cm.executor.native.lowered.counts()["memory_bound"]
    assert any(int(u) > 1 for _, u in listed)  # identical layers share their kernels


def test_sums_with_and_without_keepdim_in_one_kernel():
    g = parse_graph(MIXED_KEEPDIM_SUMS)
    ex = NativeExecutor(g, build_native(g))
    for shape in [(3, 5, 2, 3), (1, 4, 1, 1), (2, 1, 5, 1)]:
        x = torch.randn(shape)
        got = ex.run([x])
        want = ReferenceExecutor(g).run([x])
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_program_split_into_translation_units_runs_like_one(monkeypatch, tmp_path):
    # Kernels in one unit, the host flow calling them in another: the prototypes in the common
    # part link them; only the entry points are exported.
    import ctypes

    from disc.codegen.cpu import toolchain

    monkeypatch.setenv("DISC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(toolchain, "MIN_SPLIT_CHARS", 0)
    monkeypatch.setattr(toolchain, "_jobs", lambda: 3)
    units, real = [], toolchain._compile
    monkeypatch.setattr(toolchain, "_compile", lambda cmds, *a: units.append(len(cmds)) or real(cmds, *a))
    m = Attention()
    cm = _compile(m, (torch.randn(2, 5, 32),), {"x": BXS})
    assert len(cm.executor.native.source.kernels) >= 2 and 3 in units  # (the RAL builds too, in this fresh cache)
    for b, t in [(1, 1), (2, 5), (3, 17)]:
        _check(cm, m, (torch.randn(b, t, 32),), tol=1e-4)
    lib = ctypes.CDLL(str(cm.executor.native.build.path))
    assert hasattr(lib, "disc_run")
    for kernel in cm.executor.native.source.kernels:
        assert not hasattr(lib, kernel.function(0)), kernel.name


def test_pow_by_a_constant_exponent_is_written_as_products():
    # PyTorch computes x ** 3 as x * x * x (and 2, 0.5, -1, -2 alike); the frontend lowers them so,
    # and the kernels vectorise. Other exponents keep std::pow.
    m = Powers()
    cm = _compile(m, (torch.randn(2, 5),), {"x": BXS})
    assert cm.graph.op_counts()["pow"] == 1
    for shape in [(1, 1), (3, 7), (2, 129)]:
        _check(cm, m, (torch.randn(*shape) * 3,))
    kernels = cm.executor.native.source.text.split("struct Shapes", 1)[1]  # past the prelude's definitions
    assert kernels.count("disc_pow(") == 1 and "std::sqrt(" in kernels  # only y ** 2.5 calls pow


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("case", sorted(HALF_CASES))
def test_16_bit_floats_against_eager_in_the_same_dtype(case, dtype):
    # Kernels keep 16-bit buffers and compute in float, rounding to nearest even once per store;
    # the RAL's 16-bit GEMMs accumulate in float and round once: one whole native program.
    m, inputs, dynamic = half_case(case, dtype)
    cm = _compile(m, inputs(2, 5), dynamic)
    for b, t in HALF_POINTS:
        args = inputs(b, t)
        got = cm(*args)
        got = got if isinstance(got, tuple) else (got,)
        assert all(g.dtype == dtype for g in got if g.is_floating_point())
        check_half_against_eager(cm, m, args, HALF_TOLERANCE[dtype])


def test_16_bit_stores_round_to_nearest_even():
    for dtype in (torch.bfloat16, torch.float16):
        cm = _compile(Scale(), (torch.randn(2, 5, dtype=dtype),), {"x": BXS})
        x = torch.randn(64, 77).to(dtype)
        assert torch.equal(cm(x), (x.float() * 1.7).to(dtype))
        special = torch.tensor([[float("nan"), float("inf"), -0.0, 65504.0]], dtype=dtype)
        got, want = cm(special), (special.float() * 1.7).to(dtype)
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~got.isnan()], want[~want.isnan()])
