"""The Triton (GPU) backend against PyTorch eager and the reference executor.

Without a GPU these run the generated kernels in Triton's interpreter on CPU
tensors (``TRITON_INTERPRET=1``, set in ``conftest.py``); on a GPU machine the
same tests run on the device. Each case compiles once with
``backend="triton"`` (an error if the graph has no Triton form) and runs at
several shapes, including 1-sized and odd dims, chosen so every speculation
version runs; ``versions_run`` reports which one each step took.
"""

from __future__ import annotations

import math

import pytest
import torch
from kernel_cases import (
    BINARY_F32,
    BINARY_I64,
    CONV1D_GRADIENTS,
    CONV_GRADIENTS,
    HALF_CASES,
    HALF_POINTS,
    HALF_TOLERANCE,
    MAYBE_BROADCAST,
    MIXED_KEEPDIM_SUMS,
    UNARY_F32,
    Attention,
    AttentionSavingForBackward,
    BiasGelu,
    ConcatThree,
    ConvPool,
    Elementwise,
    GroupedQueryAttention,
    MaskedSoftmax,
    Movement,
    NormByUnsqueeze,
    Norms,
    PartsOfAProducer,
    PoolWithIndices,
    Powers,
    RepeatedRows,
    ReshapeByWidth,
    RowSum,
    Scale,
    StatisticsThroughUnitDims,
    check_against_eager,
    check_floor_div,
    check_half_against_eager,
    floor_div_edge_cases,
    half_case,
    op_graph,
    special_f32,
    ties_and_nans,
)
from torch import nn

import disc
from disc.errors import ShapeError

pytest.importorskip("triton")

from disc.codegen.lowering import Unsupported  # noqa: E402
from disc.codegen.triton.program import KernelCall  # noqa: E402
from disc.ir.graph import Graph  # noqa: E402
from disc.ir.parser import parse_graph  # noqa: E402
from disc.ir.types import TensorType  # noqa: E402
from disc.passes.pipeline import run_pipeline  # noqa: E402
from disc.runtime.reference import ReferenceExecutor  # noqa: E402
from disc.runtime.triton_runtime import TritonExecutor, build_triton, place_slots, triton_device  # noqa: E402

DEVICE = triton_device()
BXS = {0: "b", 1: "s"}


def _on(*xs: torch.Tensor) -> tuple:
    return tuple(x.to(DEVICE) for x in xs)


def _compile(model: nn.Module, args: tuple, dynamic: dict) -> disc.CompiledModule:
    cm = disc.compile(model.eval().to(DEVICE), _on(*args), dynamic=dynamic, backend="triton")
    assert isinstance(cm.executor, TritonExecutor)
    return cm


def _check(cm, model: nn.Module, args: tuple, tol: float = 1e-5) -> dict[int, str]:
    """Compare with eager on the program's device and return the version each step ran."""
    check_against_eager(cm, model.to(DEVICE), _on(*args), tol)
    return cm.executor.versions_run(list(_on(*args)))


def _labels(cm, args: tuple) -> list[str]:
    ran = cm.executor.versions_run(list(_on(*args)))
    return [label for _, label in sorted(ran.items()) if label != "library"]


def test_loop_kernel_small_and_large_launches():
    m = Elementwise()
    cm = _compile(m, (torch.randn(2, 5), torch.randn(2, 5)), {"x": BXS, "y": BXS})
    seen = set()
    for shape in [(1, 1), (3, 7), (4, 33), (2, 8200)]:
        args = (torch.randn(*shape), torch.randn(*shape))
        _check(cm, m, args)
        seen.update(_labels(cm, args))
    assert seen == {"small", "general"}  # tiny work on a narrow launch, large work on the wide one
    assert cm.executor.build.lowered.counts() == {"memory_bound": 1, "library": 0}


def test_loop_kernel_broadcast_bias_gelu():
    m = BiasGelu()
    cm = _compile(m, (torch.randn(2, 3, 24),), {"x": BXS})
    for shape in [(1, 1, 24), (2, 9, 24), (5, 17, 24)]:
        _check(cm, m, (torch.randn(*shape),))


def test_broadcast_speculation_versions_both_run():
    graph = parse_graph(MAYBE_BROADCAST)
    ex = TritonExecutor(graph, build_triton(graph))
    (call,) = [c for c in ex.build.source.calls if isinstance(c, KernelCall)]
    assert [v.label for v in call.kernel.versions] == ["no-broadcast small", "no-broadcast large", "small", "general"]
    seen = []
    for rows_x, rows_y in [(4, 4), (4, 1), (1, 1), (7, 7)]:
        x, y = _on(torch.randn(rows_x, 9), torch.randn(rows_y, 9))
        (out,) = ex.run([x, y])
        torch.testing.assert_close(out, x * y)
        seen.append(ex.versions_run([x, y])[0])
    assert seen == ["no-broadcast small", "small", "no-broadcast small", "no-broadcast small"]


def test_row_reductions_block_row_and_loop_row():
    m = RowSum()  # a trailing sum and a max over a middle dim
    cm = _compile(m, (torch.randn(2, 3, 6),), {"x": {0: "b", 1: "s", 2: "n"}})
    seen = set()
    for shape in [(1, 1, 1), (2, 5, 7), (3, 1, 64), (4, 9, 1), (2, 3, 4100)]:
        args = (torch.randn(*shape),)
        _check(cm, m, args)
        seen.update(_labels(cm, args))
    assert {"block-row", "loop-row"} <= seen


def test_stitch_layernorm_and_rmsnorm_each_one_kernel():
    m = Norms()
    cm = _compile(m, (torch.randn(2, 3, 40), torch.randn(2, 3, 40)), {"x": BXS, "r": BXS})
    for shape in [(1, 1, 40), (2, 7, 40), (3, 64, 40)]:
        _check(cm, m, (torch.randn(*shape), torch.randn(*shape)))
    kinds = [c.step.kind for c in cm.executor.build.source.calls if isinstance(c, KernelCall)]
    assert kinds.count("stitch") >= 1 and len(kinds) <= 2, kinds
    text = cm.executor.build.source.text
    assert "tl.sum(" in text and "stitch_" in text


def test_stitch_reads_row_statistics_through_unit_dims():
    # The row's mean is read as [b, s, 1]: the same row, not a re-linearised one.
    m = NormByUnsqueeze()
    cm = _compile(m, (torch.randn(2, 3, 40),), {"x": BXS})
    for shape in [(1, 1, 40), (2, 7, 40), (3, 64, 40)]:
        _check(cm, m, (torch.randn(*shape) * 3,))
    kinds = [c.step.kind for c in cm.executor.build.source.calls if isinstance(c, KernelCall)]
    assert kinds == ["stitch"], kinds


def test_stitch_masked_softmax_one_kernel_in_both_row_schedules():
    m = MaskedSoftmax()
    cm = _compile(m, (torch.randn(2, 4, 5, 5), torch.ones(2, 5)), {"s": {0: "b", 2: "q", 3: "k"}, "mask": {0: "b", 1: "k"}})
    seen = set()
    for b, q, k in [(1, 1, 1), (2, 3, 5), (3, 7, 33), (1, 2, 4500)]:
        args = (torch.randn(b, 4, q, k), (torch.rand(b, k) > 0.3).float())
        _check(cm, m, args)
        seen.update(_labels(cm, args))
    assert {"block-row", "loop-row"} <= seen
    calls = [c for c in cm.executor.build.source.calls if isinstance(c, KernelCall)]
    stitch = [c for c in calls if c.step.kind == "stitch"]
    assert len(stitch) == 1
    ops = [n.op for n in stitch[0].step.group.nodes]
    assert ops.count("reduce") == 2 and "exp" in ops and "div" in ops


class ColumnSums(nn.Module):
    """Bias-gradient shaped reductions: over leading dims, with a full-size output in the same kernel."""

    def forward(self, x):
        g = torch.tanh(x) * 2.0
        return g, g.sum((0, 1)), x.amax(0)


def test_column_reductions_over_leading_dims():
    m = ColumnSums()
    cm = _compile(m, (torch.randn(2, 3, 5),), {"x": {0: "b", 1: "s", 2: "n"}})
    for shape in [(1, 1, 1), (2, 5, 7), (3, 1, 64), (40, 3, 1), (5, 7, 130)]:
        args = (torch.randn(*shape),)
        _check(cm, m, args, tol=1e-5)
        assert set(_labels(cm, args)) == {"column"}


def test_row_and_column_statistics_written_through_unit_dims():
    m = StatisticsThroughUnitDims()
    cm = _compile(m, (torch.randn(4, 6),), {"x": {0: "r", 1: "c"}})
    for shape in [(1, 1), (3, 7), (9, 2), (2, 130)]:
        _check(cm, m, (torch.randn(*shape),))
    kinds = [c.step.kind for c in cm.executor.build.source.calls if isinstance(c, KernelCall)]
    assert len(kinds) == 2, kinds  # the row kernel and the column kernel


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
    calls = [c for c in cm.executor.build.source.calls if isinstance(c, KernelCall)]
    # One kernel per output; tanh(x) * 2 and sigmoid(x) are computed where they are read, never written.
    assert [len(c.step.outputs) for c in calls] == [1, 1], [[n.op for n in c.step.group.nodes] for c in calls]


def test_concat_of_three_parts_at_dynamic_offsets():
    m = ConcatThree()
    cm = _compile(m, (torch.randn(2, 3), torch.randn(2, 4)), {"x": {0: "b", 1: "n"}, "y": {0: "b", 1: "k"}})
    for b, n, k in [(1, 1, 1), (2, 3, 4), (3, 7, 2), (1, 64, 5)]:
        _check(cm, m, (torch.randn(b, n), torch.randn(b, k)))


def test_attention_gemms_read_heads_through_strides():
    m = Attention()
    cm = _compile(m, (torch.randn(2, 5, 32),), {"x": BXS})
    for b, t in [(1, 1), (2, 5), (3, 17)]:
        _check(cm, m, (torch.randn(b, t, 32),), tol=1e-4)
    src = cm.executor.build.source
    for c in src.calls:
        if isinstance(c, KernelCall):
            ops = {n.op for n in c.step.group.nodes}
            assert ops != {"reshape", "transpose"} and ops != {"transpose"}, f"copy kernel {ops}"
    # qkv and output projection: torch.matmul on strided views, no einsum; scores, softmax and
    # context: one fused attention call reading the heads through strides (passes/attention.py)
    assert src.text.count("rt.matmul(") == 2 and src.text.count("rt.attention(") == 1 and "rt.contract(" not in src.text
    assert ".as_strided(" in src.text


def test_grouped_query_attention_reads_each_kv_head_again_instead_of_copying_it():
    m = GroupedQueryAttention()
    cm = _compile(m, (torch.randn(2, 5, 32),), {"x": BXS})
    for b, t in [(1, 1), (2, 5), (3, 17), (1, 64)]:
        _check(cm, m, (torch.randn(b, t, 32),), tol=1e-4)
    for c in cm.executor.build.source.calls:
        if isinstance(c, KernelCall):
            ops = {n.op for n in c.step.group.nodes}
            assert not ops <= {"broadcast_in_dim", "reshape", "transpose", "slice"}, f"K or V copied: {ops}"
    # the expanded K and V: read once per group of query heads by the fused attention call
    assert sum(n.op == "broadcast_in_dim" for n in cm.executor.build.lowered.folded_views) == 2
    assert "rt.attention(" in cm.executor.build.source.text and ", True)" in cm.executor.build.source.text


def test_a_row_repeated_down_a_gemm_operand_is_written_out_and_exact():
    m = RepeatedRows()
    cm = _compile(m, (torch.randn(4, 5),), {"y": {0: "n"}})
    for n in (1, 4, 9):
        _check(cm, m, (torch.randn(n, 5),))
    assert not any(n.op == "broadcast_in_dim" for n in cm.executor.build.lowered.folded_views)


def test_values_saved_for_backward_come_out_of_their_kernels():
    m = AttentionSavingForBackward()
    cm = _compile(m, (torch.randn(2, 5, 32),), {"x": BXS})
    for b, t in [(1, 1), (2, 5), (3, 17)]:
        _check(cm, m, (torch.randn(b, t, 32),), tol=1e-4)


def test_convolution_through_the_library_and_pooling_windows():
    m = ConvPool()
    cm = _compile(m, (torch.randn(1, 3, 16, 16),), {"x": {0: "n", 2: "h", 3: "w"}})
    for n, h, w in [(1, 8, 8), (2, 15, 17), (1, 1, 1)]:
        _check(cm, m, (torch.randn(n, 3, h, w),), tol=1e-4)
    assert "rt.conv(" in cm.executor.build.source.text


@pytest.mark.parametrize("conv", [False, True], ids=["raw", "after_conv"])
def test_max_pool_indices_and_backward(conv):
    """Indices by torch's rule (first of equal maxima, last NaN); the backward scatters through them."""
    m = PoolWithIndices(conv)
    cm = _compile(m, (torch.randn(2, 3, 9, 10),), {"x": {0: "n", 2: "h", 3: "w"}})
    assert not cm.report.fallbacks
    for shape in [(1, 3, 1, 1), (2, 3, 7, 8), (1, 3, 9, 13)]:
        _check(cm, m, (torch.randn(*shape) if conv else ties_and_nans(*shape),))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_convolution_gradients_through_the_library(layout):
    g = parse_graph(CONV_GRADIENTS)
    if layout == "nhwc":
        g = run_pipeline(g)  # channels_last: x and gy are read NHWC
    ex = TritonExecutor(g, build_triton(g))
    assert "rt.conv_backward_input(" in ex.build.source.text and "rt.conv_backward_weight(" in ex.build.source.text
    for shape in [(2, 4, 9, 7), (1, 4, 1, 1), (0, 4, 3, 3)]:
        args = [torch.randn(shape), torch.randn(6, 2, 3, 3)]
        for got, want in zip(ex.run(list(_on(*args))), ReferenceExecutor(g).run(args)):
            assert got.shape == want.shape
            torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)


# -- every elementwise op of the Triton table, against the reference executor ----------------------
# Triton's language has no primitive for these and its interpreter no libdevice: a program
# holding one runs that op as a PyTorch segment (the backend catches Unsupported).
NO_TRITON_FORM = {"tan", "asin", "acos", "atan"}


@pytest.mark.parametrize("op", UNARY_F32 + BINARY_F32)
def test_float_op_matches_the_reference(op):
    arity = 2 if op in BINARY_F32 else 1
    g = op_graph(op, "f32", arity)
    if op in NO_TRITON_FORM:
        with pytest.raises(Unsupported, match=f"no Triton form for elementwise op {op} "):
            build_triton(g)
        return
    ex = TritonExecutor(g, build_triton(g))
    gen = torch.Generator().manual_seed(1)
    for n in (1, 37, 300):
        xs = [special_f32(n, gen, op) for _ in range(arity)]
        if op in ("gelu", "gelu_tanh"):  # torch's own gelu(inf) is inf or nan depending on the vector length
            xs = [torch.where(x.isinf(), 40.0, x) for x in xs]
        if op == "pow":
            xs[1][: min(8, n)] = torch.tensor([2.0, 3.0, -1.0, 0.5, 0.0, 1.0, -2.0, 2.0])[: min(8, n)]
        want = ReferenceExecutor(g).run(xs)[0]
        got = ex.run(list(_on(*xs)))[0].cpu()
        assert got.dtype == want.dtype
        if want.is_floating_point():
            torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6, equal_nan=True)
        else:
            assert torch.equal(got, want), (op, xs, got, want)


def test_floor_div_takes_the_floor_of_the_exact_quotient():
    a, b = floor_div_edge_cases()
    g = op_graph("floor_div", "f32", 2)
    check_floor_div(TritonExecutor(g, build_triton(g)).run(list(_on(a, b)))[0].cpu(), a, b)


@pytest.mark.parametrize("op", BINARY_I64)
def test_integer_op_matches_the_reference(op):
    g = op_graph(op, "i64", 2)
    ex = TritonExecutor(g, build_triton(g))
    a = torch.tensor([7, -7, 7, -7, 5, 0, 3, -3, 9, -9, 1 << 40])
    b = torch.tensor([2, 2, -2, -2, 5, 3, 7, 7, -4, 4, 3])
    want = ReferenceExecutor(g).run([a, b])[0]
    assert torch.equal(ex.run(list(_on(a, b)))[0].cpu(), want)


@pytest.mark.parametrize(
    "op, dtype", [("bitwise_not", "i1"), ("bitwise_not", "i64"), ("bitwise_not", "i32"), ("abs", "i64"), ("neg", "i32")]
)
def test_integer_and_bool_unary_ops_match_the_reference(op, dtype):
    g = op_graph(op, dtype, 1)
    ex = TritonExecutor(g, build_triton(g))
    x = torch.tensor([1, 0, 1, 1, 0]).bool() if dtype == "i1" else torch.tensor([0, 1, -1, 7, -(2**31) + 1, 2**31 - 1])
    x = x.to({"i1": torch.bool, "i32": torch.int32, "i64": torch.int64}[dtype])
    want = ReferenceExecutor(g).run([x])[0]
    got = ex.run(list(_on(x)))[0].cpu()
    assert got.dtype == want.dtype and torch.equal(got, want), (got, want)


@pytest.mark.parametrize("dtype", ["i8", "u8", "i32", "i64"])
def test_shifts_by_every_amount_match_the_reference(dtype):
    bits = {"i8": 8, "u8": 8, "i32": 32, "i64": 64}[dtype]
    tdt = {"i8": torch.int8, "u8": torch.uint8, "i32": torch.int32, "i64": torch.int64}[dtype]
    amounts = list(range(0 if dtype == "u8" else -2, bits + 3))
    values = [0, 1, 5, 100, -1, -100] if dtype != "u8" else [0, 1, 5, 100, 200, 255]
    x = torch.tensor([v for v in values for _ in amounts], dtype=tdt)
    y = torch.tensor([s for _ in values for s in amounts], dtype=tdt)
    for op in ("shift_left", "shift_right"):
        g = op_graph(op, dtype, 2)
        got = TritonExecutor(g, build_triton(g)).run(list(_on(x, y)))[0].cpu()
        assert torch.equal(got, ReferenceExecutor(g).run([x, y])[0]), (op, dtype)


@pytest.mark.parametrize("source, target", [("f32", "i32"), ("i32", "f32"), ("f16", "i16"), ("i16", "bf16"), ("i1", "u8")])
def test_bitcast_keeps_every_bit(source, target):
    g = Graph(name="bitcast")
    n = g.constraints.declare("n", lo=0, source="test")
    g.outputs = [g.add("bitcast", [g.add_input("x", TensorType(source, (n,)))], {"dtype": target})]
    base = torch.tensor([0.0, -0.0, 1.5, -3.25, float("inf"), float("nan"), 6e-8, 65504.0])
    x = {"f32": base, "f16": base.half(), "i32": base.view(torch.int32), "i16": base.bfloat16().view(torch.int16), "i1": base > 0}[source]
    got = TritonExecutor(g, build_triton(g)).run(list(_on(x)))[0].cpu()
    want = ReferenceExecutor(g).run([x])[0]
    assert got.dtype == want.dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (got, want)


BOOL_FROM_LITERALS = """
func @causal_not(%x: i64[n]) {
  sym n in [0, inf]  (test)
  %n = dim(%x) {axis=0} : index(n)
  %zero = constant() {dtype="i64", ref=none, value=0} : i64[]
  %z = broadcast_in_dim(%zero, %n) {dims=[]} : i64[n]
  %keep = le(%x, %z) : i1[n]
  %t = constant() {dtype="i1", ref=none, value=true} : i1[]
  %f = constant() {dtype="i1", ref=none, value=false} : i1[]
  %tb = broadcast_in_dim(%t, %n) {dims=[]} : i1[n]
  %fb = broadcast_in_dim(%f, %n) {dims=[]} : i1[n]
  %mask = select(%keep, %tb, %fb) : i1[n]
  %out = bitwise_not(%mask) : i1[n]
  return %out
}
"""


def test_bitwise_not_of_a_bool_built_from_literals():
    # GPT-2's ~causal_mask: the select of two bool literals is an int32 in Triton, where ~1 is -2 (true).
    g = parse_graph(BOOL_FROM_LITERALS)
    x = torch.tensor([-3, 0, 2, 5, -1])
    got = TritonExecutor(g, build_triton(g)).run(list(_on(x)))[0].cpu()
    assert torch.equal(got, ReferenceExecutor(g).run([x])[0]) and torch.equal(got, x > 0)


def test_shape_errors_come_from_the_generated_checks():
    graph = parse_graph(MAYBE_BROADCAST)
    ex = TritonExecutor(graph, build_triton(graph))
    x, y = _on(torch.randn(4, 9), torch.randn(4, 8))
    with pytest.raises(ShapeError, match="input 1 dim 1"):
        ex.run([x, y])


def test_a_run_time_quotient_of_products_and_a_zero_divisor():
    """-1 in reshape(-1, 2 * b) is (a * b) // (2 * b): the host code once read it as a * b // 2 * b."""
    m = ReshapeByWidth()
    cm = _compile(m, (torch.randn(4, 6),), {"x": {0: "a", 1: "b"}})
    for shape in [(4, 5), (2, 1), (6, 3)]:
        _check(cm, m, (torch.randn(shape),))
    with pytest.raises(ShapeError, match="must not multiply to 0"):
        cm(*_on(torch.randn(3, 0)))


def test_one_program_called_from_many_threads_with_different_shapes(run_in_threads):
    m = Norms()
    cm = _compile(m, (torch.randn(2, 3, 40), torch.randn(2, 3, 40)), {"x": BXS, "r": BXS})

    def work(k: int) -> None:
        for rep in range(3):
            shape = (1 + (k + rep) % 3, 1 + 5 * k, 40)
            _check(cm, m, (torch.randn(*shape), torch.randn(*shape)))

    run_in_threads(work, 4)


def test_slots_live_together_never_overlap():
    gen = torch.Generator().manual_seed(3)
    for _ in range(50):
        n = 6
        sizes = [int(x) for x in torch.randint(0, 5000, (n,), generator=gen)]
        live = [sorted(int(v) for v in torch.randint(0, 10, (2,), generator=gen)) for _ in range(n)]
        clash = [[j for j in range(n) if j != i and live[i][0] <= live[j][1] and live[j][0] <= live[i][1]] for i in range(n)]
        offsets, total = place_slots(sizes, clash)
        for i in range(n):
            assert offsets[i] % 256 == 0 and offsets[i] + sizes[i] <= total
            for j in clash[i]:
                assert offsets[i] + sizes[i] <= offsets[j] or offsets[j] + sizes[j] <= offsets[i] or 0 in (sizes[i], sizes[j])
        assert total <= sum(math.ceil(s / 256) * 256 for s in sizes)


def test_the_kept_workspace_grows_geometrically():
    from disc.runtime.triton_runtime import TritonRuntime, release_workspace

    rt = TritonRuntime(torch.device(DEVICE))
    release_workspace()
    buffers = []
    for size in range(10_000, 40_000, 1_000):  # a length growing by one step per call
        ws, offsets = rt.workspace([size], [[]])
        assert offsets == [0] and ws.numel() >= size
        if not buffers or ws is not buffers[-1]:
            buffers.append(ws)
    assert len(buffers) <= 5, [b.numel() for b in buffers]
    assert all(b.numel() >= a.numel() * 3 // 2 for a, b in zip(buffers, buffers[1:]))
    release_workspace()


@pytest.mark.parametrize("family", ["bert", "gpt2", "t5_encoder", "llama", "vit", "resnet"])
def test_model_families_run_on_the_triton_backend(family):
    from disc.models import MODELS

    entry = MODELS[family]
    model = entry.build()
    cm = disc.compile(model.to(DEVICE), _on(*entry.inputs(entry.export_shape)), dynamic=entry.dynamic, backend="triton")
    assert cm.report.backend.name in ("triton-interpreter", "triton-gpu")
    for shape in entry.shapes[:3]:
        check_against_eager(cm, model, _on(*entry.inputs(shape)), 1e-4)


def test_explain_lists_the_triton_kernels_their_versions_and_the_memory_plan():
    m = MaskedSoftmax()
    cm = _compile(m, (torch.randn(2, 4, 5, 5), torch.ones(2, 5)), {"s": {0: "b", 2: "q", 3: "k"}, "mask": {0: "b", 1: "k"}})
    text = disc.explain(cm)
    assert "-- backend: Triton program" in text
    assert "version block-row: when d" in text and "version loop-row: when True" in text
    assert "BLOCK_N=max(16, triton.next_power_of_2(" in text
    assert "-- memory plan" in text


@pytest.mark.parametrize("seed", [0, -(2**63), 2**63 - 1, 123456789])
def test_random_uniform_draws_the_reference_bits(seed):
    from test_random import TWO_SITES

    graph = parse_graph(TWO_SITES)
    ex = TritonExecutor(graph, build_triton(graph))
    for shape in [(1, 1), (3, 17), (5, 130)]:
        x, s = torch.randn(*shape), torch.tensor([seed], dtype=torch.int64)
        got, want = ex.run(list(_on(x, s))), ReferenceExecutor(graph, {}).run([x, s])
        for g, w in zip(got, want):
            assert torch.equal(g.cpu(), w)


@pytest.mark.skipif(DEVICE.type != "cpu", reason="compares with eager on CPU tensors: interpreter only")
def test_bert_trains_with_forward_and_backward_on_the_triton_backend(monkeypatch):
    """Plug-in training: embedding backward (scatter_add), LayerNorm/softmax/GELU backward kernels, dropout."""
    import copy

    from disc.models import MODELS

    monkeypatch.setenv("DISC_BACKEND", "triton")
    entry = MODELS["bert"]
    model = entry.factory().train()
    for m in model.modules():  # eager and disc draw different dropout masks: compare gradients without
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    ref = copy.deepcopy(model)
    torch._dynamo.reset()
    before = len(disc.reports())
    compiled = torch.compile(model, backend="disc", dynamic=True)
    for k, shape in enumerate([entry.export_shape, *entry.shapes[:2]]):
        args = entry.inputs(shape, seed=k + 1)
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        w = torch.randn(ref(*args)[0].shape, generator=torch.Generator().manual_seed(k))
        (ref(*args)[0] * w).sum().backward()
        (compiled(*args)[0] * w).sum().backward()
        top = max(p.grad.abs().max().item() for p in ref.parameters() if p.grad is not None)
        for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
            if q.grad is not None:
                err = (p.grad - q.grad).abs().max().item() / max(q.grad.abs().max().item(), 1e-2 * top)
                assert err <= 1e-4, (dict(shape), name, err)
    reports = disc.reports()[before:]
    assert [r.backend.name for r in reports] == ["triton-interpreter", "triton-interpreter"], [(r.name, r.backend.reason) for r in reports]
    backward = reports[1].backend.triton.source.text
    assert "tl.atomic_add(" in backward  # the embedding gradient's scatter kernel


def test_sums_with_and_without_keepdim_in_one_kernel():
    g = parse_graph(MIXED_KEEPDIM_SUMS)
    ex = TritonExecutor(g, build_triton(g))
    for shape in [(3, 5, 2, 3), (1, 4, 1, 1), (2, 1, 5, 1)]:
        x = torch.randn(shape).to(DEVICE)
        got = ex.run([x])
        want = ReferenceExecutor(g).run([x])
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_pow_by_a_constant_exponent_is_written_as_products():
    """The frontend writes x ** 2, 3, 0.5, -1, -2 as PyTorch's pow kernels compute them; only y ** 2.5 calls pow."""
    m = Powers()
    cm = _compile(m, (torch.randn(2, 5),), {"x": {0: "b", 1: "s"}})
    assert cm.graph.op_counts()["pow"] == 1
    source = cm.executor.build.source.text
    assert source.count("disc_pow(") == 1 + source.count("def disc_pow(")
    g = torch.Generator().manual_seed(0)
    for shape in [(1, 1), (3, 7), (2, 129)]:
        (x,) = _on(torch.randn(*shape, generator=g) * 3)
        for got, want in zip(cm(x), m(x)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


UNIT_IOTA = """
func @unit_iota(%x: i64[n]) {
  sym n in [0, inf]  (test)
  %one = index_const() {value=1} : index(1)
  %i = iota(%one) {dtype="i64"} : i64[1]
  %n = dim(%x) {axis=0} : index(n)
  %ib = broadcast_in_dim(%i, %n) {dims=[0]} : i64[n]
  %y = add(%x, %ib) : i64[n]
  return %i, %y
}
"""


def test_a_size_one_iota_is_a_typed_scalar():
    # Its index is the literal 0, which has no .to(): the kernel failed to compile on CUDA (T5, BERT's masks).
    g = parse_graph(UNIT_IOTA)
    ex = TritonExecutor(g, build_triton(g))
    for n in (1, 3):
        x = torch.randint(-5, 5, (n,))
        got = [t.cpu() for t in ex.run(list(_on(x)))]
        want = ReferenceExecutor(g).run([x])
        assert all(torch.equal(a, b) for a, b in zip(got, want))


class MaxAndAnyOfRows(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.amax(-1), (x > 2.5).any(-1)


def test_any_over_bools_accumulates_in_int32_tiles():
    # T5's masked max: compiled Triton widens the maximum of two int1 tiles to int32, and a loop's
    # running tile must keep its type, so the bool accumulator is an int32 tile from the start.
    m = MaxAndAnyOfRows()
    cm = _compile(m, (torch.randn(3, 70),), {"x": BXS})
    text = cm.executor.build.source.text
    assert "tl.full([BLOCK_M, BLOCK_N], 0, tl.int1)" not in text and "tl.int32" in text
    for shape in [(1, 1), (3, 70), (2, 5000), (5, 1)]:
        _check(cm, m, (torch.randn(shape),))


def test_one_dimensional_convolution_and_its_gradients_through_the_library():
    # The library calls once spelled conv2d and a 2-d output_padding whatever the rank (wav2vec2 on CUDA).
    g = parse_graph(CONV1D_GRADIENTS)
    ex = TritonExecutor(g, build_triton(g))
    for shape in [(2, 4, 9), (1, 4, 1), (3, 4, 16)]:
        args = [torch.randn(shape), torch.randn(6, 2, 5)]
        for got, want in zip(ex.run(list(_on(*args))), ReferenceExecutor(g).run(args)):
            torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)


class StatisticsOfOneRow(nn.Module):
    # ConvNeXt's training forward: a LayerNorm over one row (batch 1 traced static) also returns
    # its mean; the mean's store was a scalar pointer under the row mask.
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = x.mean(-1, keepdim=True)
        return (x - mean) / (x.var(-1, keepdim=True, unbiased=False) + 1e-6).sqrt(), mean


class SumOverAUnitDim(nn.Module):
    # ConvNeXt's backward: a row reduction whose reduced dim is 1, so its index is the row's alone
    # and the load's pointer spanned rows but not the column mask.
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2.0).sum(-1)


class LastElement(nn.Module):
    # wav2vec2: one element at an offset the kernel gets as a dim, a scalar pointer under a block mask.
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[x.shape[0] - 1 :] * 3.0


@pytest.mark.parametrize(
    "model, shapes, dynamic",
    [
        (StatisticsOfOneRow(), [(1, 32), (1, 1), (1, 77)], {"x": {1: "s"}}),
        (SumOverAUnitDim(), [(5, 1), (1, 1), (300, 1)], {"x": {0: "b"}}),
        (LastElement(), [(7,), (1,), (1000,)], {"x": {0: "n"}}),
    ],
    ids=["one_row_statistics", "sum_over_unit_dim", "last_element"],
)
def test_pointers_span_their_masks(model, shapes, dynamic):
    # Each failed to compile on an H200 and ran right in the interpreter, which broadcasts what
    # the compiler refuses; test_triton_target.py compiles these kernels for an H100 on the CPU.
    cm = _compile(model, (torch.randn(shapes[0]),), dynamic)
    for shape in shapes:
        _check(cm, model, (torch.randn(shape),))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("case", sorted(HALF_CASES))
def test_16_bit_floats_against_eager_in_the_same_dtype(case, dtype):
    # Loaded, computed in f32 inside the kernel, rounded once when stored.
    m, inputs, dynamic = half_case(case, dtype)
    cm = _compile(m, inputs(2, 5), dynamic)
    text = cm.executor.build.source.text
    assert ".to(tl.float32)" in text  # 16-bit loads widen; nothing is computed in 16 bits
    for b, t in HALF_POINTS:
        args = inputs(b, t)
        got = cm(*_on(*args))
        got = got if isinstance(got, tuple) else (got,)
        assert all(g.dtype == dtype for g in got if g.is_floating_point())
        check_half_against_eager(cm, m.to(DEVICE), _on(*args), HALF_TOLERANCE[dtype])


def test_bf16_rounds_to_nearest_even():
    # The interpreter truncates f32 to bf16; the kernels round to nearest even as the GPU and
    # eager do, so one rounded result is eager's bit for bit (truncating differed in half of them).
    m = Scale()
    cm = _compile(m, (torch.randn(2, 5, dtype=torch.bfloat16),), {"x": BXS})
    x = torch.randn(64, 77).to(torch.bfloat16)
    assert torch.equal(cm(*_on(x)).cpu(), (x.float() * 1.7).to(torch.bfloat16))
    assert torch.equal(
        cm(*_on(torch.tensor([[float("nan"), float("inf"), -0.0]], dtype=torch.bfloat16))).cpu().isnan(),
        torch.tensor([[True, False, False]]),
    )


# BART's position-embedding gradient on an H200: the scatter recomputes its index broadcast, but
# not the reshape of the input under it, which no kernel wrote ("read but never materialised").
POSITION_GRADIENT = """
func @position_gradient(%pos: i64[1, s], %grad: f32[1, s, 8]) {
  sym s in [0, inf]  (test)
  %s = dim(%pos) {axis=1} : index(s)
  %one = index_const() {value=1} : index(1)
  %w = index_const() {value=8} : index(8)
  %rows = index_const() {value=6} : index(6)
  %zero = constant() {dtype="f32", ref=none, value=0.0} : f32[]
  %base = broadcast_in_dim(%zero, %rows, %w) {dims=[]} : f32[6, 8]
  %flat = reshape(%pos, %s) : i64[s]
  %g = reshape(%grad, %s, %w) : f32[s, 8]
  %index = broadcast_in_dim(%flat, %s, %w) {dims=[0]} : i64[s, 8]
  %out = scatter_add(%base, %index, %g) {axis=0} : f32[6, 8]
  return %out
}
"""

# DeBERTa's attention backward on an H200: the softmax gradient's rows are reduced in [1, h, s, s]
# and written as [h, s, s]; the output's index was the flat one, which reads the row sum at a
# row the kernel was not computing.
SOFTMAX_GRADIENT_REGROUPED = """
func @softmax_gradient(%g: f32[1, 2, s, s], %p: f32[1, 2, s, s]) {
  sym s in [0, inf]  (test)
  %s = dim(%g) {axis=2} : index(s)
  %one = index_const() {value=1} : index(1)
  %h = index_const() {value=2} : index(2)
  %gp = mul(%g, %p) : f32[1, 2, s, s]
  %sum = reduce(%gp) {dims=[3], keepdim=true, kind="sum"} : f32[1, 2, s, 1]
  %sums = broadcast_in_dim(%sum, %one, %h, %s, %s) {dims=[0, 1, 2, 3]} : f32[1, 2, s, s]
  %ps = mul(%p, %sums) : f32[1, 2, s, s]
  %d = sub(%gp, %ps) : f32[1, 2, s, s]
  %heads = reshape(%d, %h, %s, %s) : f32[2, s, s]
  %c = constant() {dtype="f32", ref=none, value=4.0} : f32[]
  %cs = broadcast_in_dim(%c, %h, %s, %s) {dims=[]} : f32[2, s, s]
  %out = div(%heads, %cs) : f32[2, s, s]
  return %out
}
"""


@pytest.mark.parametrize("text", [POSITION_GRADIENT, SOFTMAX_GRADIENT_REGROUPED], ids=["position_gradient", "softmax_gradient_regrouped"])
def test_training_graphs_that_fell_back_on_a_gpu(text):
    g = parse_graph(text)
    ex = TritonExecutor(g, build_triton(g))
    for s in (1, 5, 17):
        if g.inputs[0].dtype == "i64":
            args = [torch.randint(0, 6, (1, s)), torch.randn(1, s, 8)]
        else:
            args = [torch.randn(1, 2, s, s), torch.rand(1, 2, s, s)]
        got = ex.run(list(_on(*args)))
        want = ReferenceExecutor(g).run(args)
        for a, b in zip(got, want):
            assert torch.allclose(a.cpu(), b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_bert_attention_runs_as_one_fused_call_per_layer(dtype):
    # disc's own BERT writes softmax(q k^T / 4 + mask) v; on the GPU backend each layer's chain is
    # one attention library call (no score matrix, no softmax kernel, no head copies), whatever
    # the batch and length, size 1 included.
    from disc.models import MODELS
    from disc.models.bert import BertConfig, bert

    entry = MODELS["bert"]
    model = bert(BertConfig(num_layers=2, hidden_size=64, num_heads=4, intermediate_size=128), 0).eval().to(dtype)
    cm = _compile(model, entry.example_inputs(batch=2, seq=8), entry.dynamic)
    src = cm.executor.build.source.text
    assert src.count("rt.attention(") == 2 and cm.executor.graph.op_counts().get("attention") == 2
    assert 'kind="max"' not in str([n.attrs for n in cm.executor.graph.nodes if n.op == "reduce"])  # no softmax left
    for b, s in [(1, 1), (2, 5), (3, 33)]:
        args = entry.example_inputs(batch=b, seq=s, seed=b + s)
        if dtype == torch.float32:
            _check(cm, model, args, tol=1e-5)
        else:
            check_half_against_eager(cm, model.to(DEVICE), _on(*args), HALF_TOLERANCE[dtype])
