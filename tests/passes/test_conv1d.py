"""conv1d_as_2d: 1-D convolutions become 2-D ones over a unit height, same values, natively run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from golden import check_golden

import disc
from disc.passes.conv1d import conv1d_as_2d

CONV1D = """
func @main(%x: f32[n, 4, l], %k: f32[6, 2, 3]) {
  sym n in [0, inf]  (input 'x' dim 0)
  sym l in [1, inf]  (input 'x' dim 2)
  check l + 2 >= 5  "convolution: padded x dim 2 must be >= the dilated kernel (w dim 2)"
  %0 = convolution(%x, %k) {channels_last=false, dilation=[2], groups=2, output_padding=[], padding=[1], stride=[2], transposed=false} : f32[n, 6, (l + 1)//2 - 1]
  return %0
}
"""


def test_a_1_d_convolution_is_a_2_d_one_over_a_unit_height():
    check_golden(
        conv1d_as_2d,
        CONV1D,
        """
        func @main(%x: f32[n, 4, l], %k: f32[6, 2, 3]) {
          sym n in [0, inf]  (input 'x' dim 0)
          sym l in [1, inf]  (input 'x' dim 2)
          check l + 2 >= 5  "convolution: padded x dim 2 must be >= the dilated kernel (w dim 2)"
          %1 = dim(%x) {axis=0} : index(n)
          %2 = dim(%x) {axis=1} : index(4)
          %3 = dim(%x) {axis=2} : index(l)
          %4 = index_const() {value=1} : index(1)
          %5 = reshape(%x, %1, %2, %4, %3) : f32[n, 4, 1, l]
          %6 = dim(%k) {axis=0} : index(6)
          %7 = dim(%k) {axis=1} : index(2)
          %8 = dim(%k) {axis=2} : index(3)
          %9 = index_const() {value=1} : index(1)
          %10 = reshape(%k, %6, %7, %9, %8) : f32[6, 2, 1, 3]
          %11 = convolution(%5, %10) {channels_last=false, dilation=[1, 2], groups=2, output_padding=[], padding=[0, 1], stride=[1, 2], transposed=false} : f32[n, 6, 1, (l + 1)//2 - 1]
          %12 = dim(%11) {axis=0} : index(n)
          %13 = dim(%11) {axis=1} : index(6)
          %14 = dim(%11) {axis=3} : index((l + 1)//2 - 1)
          %0 = reshape(%11, %12, %13, %14) : f32[n, 6, (l + 1)//2 - 1]
          return %0
        }
        """,
    )


class _Conv1dStack(torch.nn.Module):
    """wav2vec2's feature-extractor shape: strided 1-D convolutions with GELU between, a grouped
    positional one with padding, and a bias."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv1d(1, 8, 5, stride=3, bias=False)
        self.c2 = torch.nn.Conv1d(8, 8, 3, stride=2, dilation=2)
        self.pos = torch.nn.Conv1d(8, 8, 4, padding=2, groups=4)

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.c1(wave))
        h = F.gelu(self.c2(h))
        return h + self.pos(h)[..., : h.shape[-1]]


def test_1_d_convolutions_run_in_the_native_program_as_eager():
    torch.manual_seed(0)
    model = _Conv1dStack().eval()
    cm = disc.compile(model, (torch.randn(2, 1, 400),), dynamic={"wave": {0: "batch", 2: "samples"}})
    assert cm.report.backend.name == "native-cpu", cm.report.backend.reason
    assert not any(n.op == "convolution" and len(n.shape) == 3 for n in cm.graph.nodes)
    for shape in [(1, 1, 17), (1, 1, 18), (3, 1, 101), (2, 1, 400)]:
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("length", [1, 2, 9])
def test_a_padded_1_d_convolution_over_short_inputs(length: int):
    model = torch.nn.Conv1d(3, 5, 3, padding=1).eval()
    cm = disc.compile(model, (torch.randn(2, 3, 8),), dynamic={"input": {0: "batch", 2: "length"}})
    assert cm.report.backend.name == "native-cpu", cm.report.backend.reason
    x = torch.randn(1, 3, length)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-5)
