"""channels_last + sink_transposes: convolutions run NHWC and the transposes between them cancel."""

from __future__ import annotations

import textwrap

import pytest
import torch
from golden import check_golden

from disc.ir.parser import parse_graph
from disc.passes.channels_last import channels_last
from disc.passes.pipeline import run_pipeline
from disc.runtime.reference import ReferenceExecutor

CONV_BLOCK = """
func @main(%x: f32[n, 4, h, w], %k: f32[8, 4, 3, 3], %k2: f32[8, 8, 1, 1], %s: f32[8]) {
  sym n in [0, inf]  (input 'x' dim 0)
  sym h in [1, inf]  (input 'x' dim 2)
  sym w in [1, inf]  (input 'x' dim 3)
  %0 = dim(%x) {axis=0} : index(n)
  %1 = dim(%x) {axis=2} : index(h)
  %2 = dim(%x) {axis=3} : index(w)
  %3 = index_const() {value=8} : index(8)
  %4 = convolution(%x, %k) {channels_last=false, dilation=[1, 1], groups=1, output_padding=[], padding=[1, 1], stride=[1, 1], transposed=false} : f32[n, 8, h, w]
  %5 = broadcast_in_dim(%s, %0, %3, %1, %2) {dims=[1]} : f32[n, 8, h, w]
  %6 = add(%4, %5) : f32[n, 8, h, w]
  %7 = relu(%6) : f32[n, 8, h, w]
  %8 = convolution(%7, %k2) {channels_last=false, dilation=[1, 1], groups=1, output_padding=[], padding=[0, 0], stride=[1, 1], transposed=false} : f32[n, 8, h, w]
  %9 = add(%8, %7) : f32[n, 8, h, w]
  return %9
}
"""


def test_convolutions_switch_to_channels_last_between_transposes():
    check_golden(
        channels_last,
        CONV_BLOCK,
        """
        func @main(%x: f32[n, 4, h, w], %k: f32[8, 4, 3, 3], %k2: f32[8, 8, 1, 1], %s: f32[8]) {
          sym n in [0, inf]  (input 'x' dim 0)
          sym h in [1, inf]  (input 'x' dim 2)
          sym w in [1, inf]  (input 'x' dim 3)
          %0 = dim(%x) {axis=0} : index(n)
          %1 = dim(%x) {axis=2} : index(h)
          %2 = dim(%x) {axis=3} : index(w)
          %3 = index_const() {value=8} : index(8)
          %10 = transpose(%x) {perm=[0, 2, 3, 1]} : f32[n, h, w, 4]
          %11 = convolution(%10, %k) {channels_last=true, dilation=[1, 1], groups=1, output_padding=[], padding=[1, 1], stride=[1, 1], transposed=false} : f32[n, h, w, 8]
          %4 = transpose(%11) {perm=[0, 3, 1, 2]} : f32[n, 8, h, w]
          %5 = broadcast_in_dim(%s, %0, %3, %1, %2) {dims=[1]} : f32[n, 8, h, w]
          %6 = add(%4, %5) : f32[n, 8, h, w]
          %7 = relu(%6) : f32[n, 8, h, w]
          %12 = transpose(%7) {perm=[0, 2, 3, 1]} : f32[n, h, w, 8]
          %13 = convolution(%12, %k2) {channels_last=true, dilation=[1, 1], groups=1, output_padding=[], padding=[0, 0], stride=[1, 1], transposed=false} : f32[n, h, w, 8]
          %8 = transpose(%13) {perm=[0, 3, 1, 2]} : f32[n, 8, h, w]
          %9 = add(%8, %7) : f32[n, 8, h, w]
          return %9
        }
        """,
    )


def test_pipeline_leaves_one_transpose_at_each_end():
    # Bias, ReLU and the residual add run NHWC; the transposes between the two
    # convolutions cancel, one copies the input in and one copies the result out.
    g = run_pipeline(parse_graph(textwrap.dedent(CONV_BLOCK).strip()))
    ops = [(n.op, n.attrs.get("perm"), n.attrs.get("channels_last")) for n in g.nodes if n.op in ("transpose", "convolution")]
    assert ops == [
        ("transpose", (0, 2, 3, 1), None),
        ("convolution", None, True),
        ("convolution", None, True),
        ("transpose", (0, 3, 1, 2), None),
    ]


@pytest.mark.parametrize("shape", [(2, 4, 7, 5), (1, 4, 1, 1), (3, 4, 1, 9), (0, 4, 3, 3)])
def test_same_values_as_channels_first(shape):
    g = parse_graph(textwrap.dedent(CONV_BLOCK).strip())
    torch.manual_seed(0)
    args = [torch.randn(shape), torch.randn(8, 4, 3, 3), torch.randn(8, 8, 1, 1), torch.randn(8)]
    (want,) = ReferenceExecutor(g).run(args)
    (got,) = ReferenceExecutor(run_pipeline(g)).run(args)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_transposed_and_1d_convolutions_keep_their_layout():
    src = """
    func @main(%x: f32[2, 4, 9], %k: f32[6, 4, 3], %y: f32[1, 4, 5, 5], %t: f32[4, 2, 3, 3]) {
      %0 = convolution(%x, %k) {channels_last=false, dilation=[1], groups=1, output_padding=[], padding=[1], stride=[1], transposed=false} : f32[2, 6, 9]
      %1 = convolution(%y, %t) {channels_last=false, dilation=[1, 1], groups=1, output_padding=[0, 0], padding=[0, 0], stride=[1, 1], transposed=true} : f32[1, 2, 7, 7]
      return %0, %1
    }
    """
    check_golden(channels_last, src, src)
