"""Golden tests of sink_transposes: transposes move below layout-blind ops and cancel in pairs."""

from __future__ import annotations

import textwrap

import pytest
import torch
from golden import check_golden

from disc.ir.parser import parse_graph
from disc.passes.dce import dce
from disc.passes.rewrite import Pass
from disc.passes.sink_transposes import sink_transposes
from disc.runtime.reference import ReferenceExecutor

# sink_transposes leaves the bypassed transposes unused; dce drops them.
sink_then_dce = Pass("sink+dce", lambda g: dce(sink_transposes(g)))

NHWC_CHAIN = """
func @main(%a: f32[n, h, w, 8], %b: f32[n, h, w, 8], %s: f32[8], %r: f32[n, 8, h, w]) {
  sym n in [0, inf]  (input 'a' dim 0)
  sym h in [1, inf]  (input 'a' dim 1)
  sym w in [1, inf]  (input 'a' dim 2)
  %0 = dim(%a) {axis=0} : index(n)
  %1 = dim(%a) {axis=1} : index(h)
  %2 = dim(%a) {axis=2} : index(w)
  %3 = index_const() {value=8} : index(8)
  %4 = transpose(%a) {perm=[0, 3, 1, 2]} : f32[n, 8, h, w]
  %5 = transpose(%b) {perm=[0, 3, 1, 2]} : f32[n, 8, h, w]
  %6 = broadcast_in_dim(%s, %0, %3, %1, %2) {dims=[1]} : f32[n, 8, h, w]
  %7 = mul(%4, %6) : f32[n, 8, h, w]
  %8 = add(%7, %5) : f32[n, 8, h, w]
  %9 = relu(%8) : f32[n, 8, h, w]
  %10 = reduce_window(%9) {ceil_mode=false, dilation=[], kind="max", padding=[[0, 0], [0, 0], [1, 1], [0, 0]], strides=[1, 1, 2, 1], window=[1, 1, 3, 1]} : f32[n, 8, (h + 1)//2, w]
  %11 = transpose(%10) {perm=[0, 2, 3, 1]} : f32[n, (h + 1)//2, w, 8]
  %12 = reduce(%9) {dims=[2, 3], keepdim=false, kind="sum"} : f32[n, 8]
  %13 = reduce(%9) {dims=[0], keepdim=false, kind="max"} : f32[8, h, w]
  %14 = add(%9, %r) : f32[n, 8, h, w]
  return %11, %12, %13, %14
}
"""


def test_sinks_through_pointwise_pooling_and_reductions():
    check_golden(
        sink_then_dce,
        NHWC_CHAIN,
        # mul/add/relu run on %a and %b (the per-channel broadcast now targets
        # dim 3); the pooling window moves to dim 1 and its transpose cancels
        # the one back to NHWC (%11); the sum over H, W keeps (n, 8) in order
        # and needs no transpose, the max over n does ([h, w, 8] -> [8, h, w]).
        # %14 adds a channels-first input, so %9 is materialised for it alone.
        """
        func @main(%a: f32[n, h, w, 8], %b: f32[n, h, w, 8], %s: f32[8], %r: f32[n, 8, h, w]) {
          sym n in [0, inf]  (input 'a' dim 0)
          sym h in [1, inf]  (input 'a' dim 1)
          sym w in [1, inf]  (input 'a' dim 2)
          %0 = dim(%a) {axis=0} : index(n)
          %1 = dim(%a) {axis=1} : index(h)
          %2 = dim(%a) {axis=2} : index(w)
          %3 = index_const() {value=8} : index(8)
          %15 = broadcast_in_dim(%s, %0, %1, %2, %3) {dims=[3]} : f32[n, h, w, 8]
          %16 = mul(%a, %15) : f32[n, h, w, 8]
          %17 = add(%16, %b) : f32[n, h, w, 8]
          %18 = relu(%17) : f32[n, h, w, 8]
          %9 = transpose(%18) {perm=[0, 3, 1, 2]} : f32[n, 8, h, w]
          %19 = reduce_window(%18) {ceil_mode=false, dilation=[], index_dims=[], kind="max", padding=[[0, 0], [1, 1], [0, 0], [0, 0]], strides=[1, 2, 1, 1], window=[1, 3, 1, 1]} : f32[n, (h + 1)//2, w, 8]
          %20 = reduce(%18) {dims=[1, 2], keepdim=false, kind="sum"} : f32[n, 8]
          %21 = reduce(%18) {dims=[0], keepdim=false, kind="max"} : f32[h, w, 8]
          %13 = transpose(%21) {perm=[2, 0, 1]} : f32[8, h, w]
          %14 = add(%9, %r) : f32[n, 8, h, w]
          return %19, %20, %13, %14
        }
        """,
    )


@pytest.mark.parametrize("shape", [(2, 5, 3), (1, 1, 1), (3, 2, 7), (2, 1, 4)])
def test_same_values(shape):
    g = parse_graph(textwrap.dedent(NHWC_CHAIN).strip())
    n, h, w = shape
    torch.manual_seed(0)
    args = [torch.randn(n, h, w, 8), torch.randn(n, h, w, 8), torch.randn(8), torch.randn(n, 8, h, w)]
    want = ReferenceExecutor(g).run(args)
    got = ReferenceExecutor(sink_then_dce(g)).run(args)
    for x, y in zip(got, want):
        assert x.shape == y.shape
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_mixed_permutations_and_non_broadcast_operands_stay():
    src = """
    func @main(%a: f32[2, 3, 4], %b: f32[3, 4, 2], %c: f32[4, 2, 3]) {
      %0 = transpose(%a) {perm=[1, 2, 0]} : f32[3, 4, 2]
      %1 = transpose(%c) {perm=[2, 0, 1]} : f32[3, 4, 2]
      %2 = add(%0, %1) : f32[3, 4, 2]
      %3 = mul(%0, %b) : f32[3, 4, 2]
      return %2, %3
    }
    """
    check_golden(sink_then_dce, src, src)


def test_reshape_reads_through_a_transpose_of_unit_dims():
    check_golden(
        sink_then_dce,
        """
        func @main(%x: f32[n, 1, 1, 8]) {
          sym n in [0, inf]  (input 'x' dim 0)
          %0 = dim(%x) {axis=0} : index(n)
          %1 = index_const() {value=8} : index(8)
          %2 = transpose(%x) {perm=[0, 3, 1, 2]} : f32[n, 8, 1, 1]
          %3 = reshape(%2, %0, %1) : f32[n, 8]
          return %3
        }
        """,
        """
        func @main(%x: f32[n, 1, 1, 8]) {
          sym n in [0, inf]  (input 'x' dim 0)
          %0 = dim(%x) {axis=0} : index(n)
          %1 = index_const() {value=8} : index(8)
          %3 = reshape(%x, %0, %1) : f32[n, 8]
          return %3
        }
        """,
    )


FLATTEN_BACK = """
func @main(%x: f32[n, h, w, 8]) {
  sym n in [0, inf]  (input 'x' dim 0)
  sym h in [1, inf]  (input 'x' dim 1)
  sym w in [1, inf]  (input 'x' dim 2)
  %0 = dim(%x) {axis=0} : index(n)
  %1 = dim(%x) {axis=1} : index(h)
  %2 = dim(%x) {axis=2} : index(w)
  %3 = index_const() {value=8} : index(8)
  %4 = imul(%1, %2) : index(h*w)
  %5 = transpose(%x) {perm=[0, 3, 1, 2]} : f32[n, 8, h, w]
  %6 = reshape(%5, %0, %3, %4) : f32[n, 8, h*w]
  %7 = transpose(%6) {perm=[0, 2, 1]} : f32[n, h*w, 8]
  return %7
}
"""


@pytest.mark.parametrize("shape", [(2, 5, 3), (1, 1, 1), (3, 1, 7)])
def test_flatten_back_keeps_values(shape):
    g = parse_graph(FLATTEN_BACK)
    x = torch.randn(*shape, 8)
    [want] = ReferenceExecutor(g).run([x])
    [got] = ReferenceExecutor(sink_then_dce(g)).run([x])
    assert got.shape == want.shape and torch.equal(got, want)


def test_flatten_and_transpose_back_of_a_channels_last_map_is_a_reshape():
    """``conv(x).flatten(2).transpose(1, 2)`` after channels_last: NHWC -> NCHW -> [n, c, h*w] -> [n, h*w, c]
    moves no element, so it becomes one reshape of the NHWC map (no index arithmetic in the kernel)."""
    check_golden(
        sink_then_dce,
        FLATTEN_BACK,
        """
        func @main(%x: f32[n, h, w, 8]) {
          sym n in [0, inf]  (input 'x' dim 0)
          sym h in [1, inf]  (input 'x' dim 1)
          sym w in [1, inf]  (input 'x' dim 2)
          %0 = dim(%x) {axis=0} : index(n)
          %1 = dim(%x) {axis=1} : index(h)
          %2 = dim(%x) {axis=2} : index(w)
          %3 = index_const() {value=8} : index(8)
          %4 = imul(%1, %2) : index(h*w)
          %7 = reshape(%x, %0, %4, %3) : f32[n, h*w, 8]
          return %7
        }
        """,
    )


MOVING_CHAINS = {
    # h and w flattened in the wrong order: [n, h, w, 8] -> [n, 8, w, h] -> [n, 8, w*h] -> [n, w*h, 8].
    "swapped": """
    func @main(%x: f32[n, h, w, 8]) {
      sym n in [0, inf]  (input 'x' dim 0)
      sym h in [1, inf]  (input 'x' dim 1)
      sym w in [1, inf]  (input 'x' dim 2)
      %0 = dim(%x) {axis=0} : index(n)
      %1 = dim(%x) {axis=1} : index(h)
      %2 = dim(%x) {axis=2} : index(w)
      %3 = index_const() {value=8} : index(8)
      %4 = imul(%2, %1) : index(h*w)
      %5 = transpose(%x) {perm=[0, 3, 2, 1]} : f32[n, 8, w, h]
      %6 = reshape(%5, %0, %3, %4) : f32[n, 8, h*w]
      %7 = transpose(%6) {perm=[0, 2, 1]} : f32[n, h*w, 8]
      return %7
    }
    """,
    # The channels split: [n, h, 8] -> [n, 8, h] -> [n, 2, 4*h] -> [n, 4*h, 2].
    "split": """
    func @main(%x: f32[n, h, 8]) {
      sym n in [0, inf]  (input 'x' dim 0)
      sym h in [1, inf]  (input 'x' dim 1)
      %0 = dim(%x) {axis=0} : index(n)
      %1 = dim(%x) {axis=1} : index(h)
      %2 = index_const() {value=2} : index(2)
      %3 = index_const() {value=4} : index(4)
      %4 = imul(%3, %1) : index(4*h)
      %5 = transpose(%x) {perm=[0, 2, 1]} : f32[n, 8, h]
      %6 = reshape(%5, %0, %2, %4) : f32[n, 2, 4*h]
      %7 = transpose(%6) {perm=[0, 2, 1]} : f32[n, 4*h, 2]
      return %7
    }
    """,
}


@pytest.mark.parametrize("name", sorted(MOVING_CHAINS))
def test_chains_that_move_elements_stay(name):
    src = textwrap.dedent(MOVING_CHAINS[name])
    check_golden(sink_then_dce, src, src)


POOL_INDICES = """
func @main(%a: f32[n, h, w, 4]) {
  sym n in [0, inf]  (input 'a' dim 0)
  sym h in [1, inf]  (input 'a' dim 1)
  sym w in [1, inf]  (input 'a' dim 2)
  %0 = transpose(%a) {perm=[0, 3, 1, 2]} : f32[n, 4, h, w]
  %1 = reduce_window(%0) {ceil_mode=false, dilation=[], index_dims=[2, 3], kind="argmax", padding=[[0, 0], [0, 0], [1, 1], [1, 1]], strides=[1, 1, 2, 2], window=[1, 1, 3, 3]} : i64[n, 4, (h + 1)//2, (w + 1)//2]
  %2 = transpose(%a) {perm=[0, 3, 2, 1]} : f32[n, 4, w, h]
  %3 = reduce_window(%2) {ceil_mode=false, dilation=[], index_dims=[2, 3], kind="argmax", padding=[], strides=[1, 1, 2, 1], window=[1, 1, 2, 1]} : i64[n, 4, w//2, h]
  return %1, %3
}
"""


def test_pool_indices_sink_only_where_their_dims_keep_order():
    check_golden(
        sink_then_dce,
        POOL_INDICES,
        # NCHW -> NHWC keeps H before W, so the flat H x W positions are the same
        # numbers: the window moves to dims 1, 2 with index_dims renumbered. The
        # second transpose swaps H and W; its positions (w * h_size + h) have no
        # untransposed spelling, so it stays.
        """
        func @main(%a: f32[n, h, w, 4]) {
          sym n in [0, inf]  (input 'a' dim 0)
          sym h in [1, inf]  (input 'a' dim 1)
          sym w in [1, inf]  (input 'a' dim 2)
          %4 = reduce_window(%a) {ceil_mode=false, dilation=[], index_dims=[1, 2], kind="argmax", padding=[[0, 0], [1, 1], [1, 1], [0, 0]], strides=[1, 2, 2, 1], window=[1, 3, 3, 1]} : i64[n, (h + 1)//2, (w + 1)//2, 4]
          %1 = transpose(%4) {perm=[0, 3, 1, 2]} : i64[n, 4, (h + 1)//2, (w + 1)//2]
          %2 = transpose(%a) {perm=[0, 3, 2, 1]} : f32[n, 4, w, h]
          %3 = reduce_window(%2) {ceil_mode=false, dilation=[], index_dims=[2, 3], kind="argmax", padding=[], strides=[1, 1, 2, 1], window=[1, 1, 2, 1]} : i64[n, 4, w//2, h]
          return %1, %3
        }
        """,
    )
    g = parse_graph(textwrap.dedent(POOL_INDICES).strip())
    x = torch.randint(0, 3, (2, 5, 7, 4)).float()  # many equal maxima: the first must win in both forms
    for got, want in zip(ReferenceExecutor(sink_then_dce(g)).run([x]), ReferenceExecutor(g).run([x])):
        assert torch.equal(got, want)


BATCH_NORM_STATISTICS = """
func @main(%a: f32[n, h, w, 8], %g: f32[8, 1, 1]) {
  sym n in [1, inf]  (input 'a' dim 0)
  sym h in [1, inf]  (input 'a' dim 1)
  sym w in [1, inf]  (input 'a' dim 2)
  %0 = dim(%a) {axis=0} : index(n)
  %1 = dim(%a) {axis=1} : index(h)
  %2 = dim(%a) {axis=2} : index(w)
  %3 = index_const() {value=8} : index(8)
  %4 = transpose(%a) {perm=[0, 3, 1, 2]} : f32[n, 8, h, w]
  %5 = reduce(%4) {dims=[0, 2, 3], keepdim=true, kind="sum"} : f32[1, 8, 1, 1]
  %6 = broadcast_in_dim(%5, %0, %3, %1, %2) {dims=[0, 1, 2, 3]} : f32[n, 8, h, w]
  %7 = sub(%4, %6) : f32[n, 8, h, w]
  %8 = broadcast_in_dim(%g, %0, %3, %1, %2) {dims=[1, 2, 3]} : f32[n, 8, h, w]
  %9 = mul(%7, %8) : f32[n, 8, h, w]
  return %9, %5
}
"""


def test_batch_norm_statistics_broadcast_back_in_the_untransposed_layout():
    check_golden(
        sink_then_dce,
        BATCH_NORM_STATISTICS,
        # Training BatchNorm after an NHWC convolution: the per-channel sum (kept as
        # [1, 8, 1, 1]) is computed on %a, so its broadcast back reads it untransposed;
        # the [8, 1, 1] scale's dims would come out of order (3, 1, 2), so the small
        # operand is transposed instead. The whole chain runs NHWC.
        """
        func @main(%a: f32[n, h, w, 8], %g: f32[8, 1, 1]) {
          sym n in [1, inf]  (input 'a' dim 0)
          sym h in [1, inf]  (input 'a' dim 1)
          sym w in [1, inf]  (input 'a' dim 2)
          %0 = dim(%a) {axis=0} : index(n)
          %1 = dim(%a) {axis=1} : index(h)
          %2 = dim(%a) {axis=2} : index(w)
          %3 = index_const() {value=8} : index(8)
          %10 = reduce(%a) {dims=[0, 1, 2], keepdim=true, kind="sum"} : f32[1, 1, 1, 8]
          %5 = transpose(%10) {perm=[0, 3, 1, 2]} : f32[1, 8, 1, 1]
          %11 = broadcast_in_dim(%10, %0, %1, %2, %3) {dims=[0, 1, 2, 3]} : f32[n, h, w, 8]
          %12 = sub(%a, %11) : f32[n, h, w, 8]
          %13 = transpose(%g) {perm=[1, 2, 0]} : f32[1, 1, 8]
          %14 = broadcast_in_dim(%13, %0, %1, %2, %3) {dims=[1, 2, 3]} : f32[n, h, w, 8]
          %15 = mul(%12, %14) : f32[n, h, w, 8]
          %9 = transpose(%15) {perm=[0, 3, 1, 2]} : f32[n, 8, h, w]
          return %9, %5
        }
        """,
    )
    g = parse_graph(textwrap.dedent(BATCH_NORM_STATISTICS).strip())
    for n, h, w in [(1, 1, 1), (2, 3, 5)]:
        args = [torch.randn(n, h, w, 8), torch.randn(8, 1, 1)]
        for got, want in zip(ReferenceExecutor(sink_then_dce(g)).run(args), ReferenceExecutor(g).run(args)):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
