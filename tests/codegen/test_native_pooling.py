"""Windowed reductions (pooling) in generated C++, against PyTorch eager.

Pooling kernels split the innermost output dim into a border (windows that reach
into the padding: masked loads) and an interior (no checks, loads affine in the
column). The widths below put columns in the left border, the interior and the
right border, and none in the interior (a window wider than the row), with
padding, dilation, ceil_mode, sum windows and a fused elementwise consumer.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from kernel_cases import PoolWithIndices, check_against_eager, ties_and_nans
from torch import nn

import disc
from disc.runtime.native import NativeExecutor, build_native


class Pool(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


POOLS = {
    "max_3x3_s2_p1": lambda x: F.max_pool2d(x, 3, 2, 1),
    "max_3x3_s2_p1_relu": lambda x: torch.relu(F.max_pool2d(x, 3, 2, 1)) * 2.0,
    "max_2x2_s3_ceil": lambda x: F.max_pool2d(x, 2, 3, ceil_mode=True),
    "max_dilated_ceil": lambda x: F.max_pool2d(x, 3, 2, 1, (2, 2), ceil_mode=True),
    "max_3x3_s3_p1_ceil": lambda x: F.max_pool2d(x, 3, 3, 1, ceil_mode=True),
    "avg_3x3_s1_p1_with_pad": lambda x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=True),
    "avg_2x2": lambda x: F.avg_pool2d(x, 2),
    "max_1x5_s1_p2": lambda x: F.max_pool2d(x, (1, 5), 1, (0, 2)),
}
# (batch, channels, height, width): odd and 1-sized dims, widths 1..37
SHAPES = [(1, 1, 5, 1), (2, 3, 7, 8), (1, 2, 9, 37), (3, 1, 4, 2), (1, 1, 11, 13)]


def _ok(name: str, shape: tuple[int, ...]) -> bool:
    try:
        POOLS[name](torch.zeros(shape))
        return True
    except RuntimeError:  # torch refuses windows larger than the padded input
        return False


@pytest.mark.parametrize("name", sorted(POOLS))
def test_pooling_matches_eager(name: str) -> None:
    model = Pool(POOLS[name])
    cm = disc.compile(model, (torch.randn(2, 3, 9, 10),), dynamic={"x": {0: "n", 1: "c", 2: "h", 3: "w"}}, backend="reference")
    ex = NativeExecutor(cm.graph, build_native(cm.graph))
    ran = 0
    for shape in SHAPES:
        if not _ok(name, shape):
            continue
        x = torch.randn(*shape)
        if name.startswith("max") and shape[-1] > 3:
            x[..., 0, 0] = float("nan")  # NaN propagates through max windows
        (got,) = ex.run([x])
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5, equal_nan=True, msg=f"{name} at {shape}")
        ran += 1
    assert ran >= 3


def test_pooling_interior_loop_has_no_padding_checks() -> None:
    cm = disc.compile(Pool(POOLS["max_3x3_s2_p1"]), (torch.randn(2, 3, 9, 10),), dynamic={"x": {2: "h", 3: "w"}}, backend="reference")
    text = build_native(cm.graph).source.text
    kernels = text[text.index("// disc: translation unit") :]  # past the prelude's helpers
    # Rows whose windows lie inside the input come first, then the border rows.
    inside_rows, border_rows = kernels.split("} else {", 1)
    assert re.search(r"if \(\(i\d+ \* 2 - 1 >= 0\) & \(i\d+ \* 2 - 1 \+ 2 < s\.h\)\) \{", inside_rows)
    for rows, row_masks in ((inside_rows, 0), (border_rows, 9)):
        body = rows[rows.index("for (int64_t j = j_lo; j < j_hi; ++j)") :]
        interior = body[: body.index("#pragma omp simd")]
        assert interior.count("in0[") == 9
        columns = re.findall(r"const int64_t (p\d+) = j \* 2 \+ -?\d+;", interior)
        assert len(columns) == 9
        for p in columns:  # column positions are used as they are: not clamped, not masked
            assert not re.search(rf"std::min<int64_t>\({p}\b|\({p} >= 0\)", interior), p
        assert interior.count(" ? ") == row_masks  # border rows still mask the row index (it may be in the padding)


@pytest.mark.parametrize("conv", [False, True], ids=["raw", "after_conv"])
def test_max_pool_indices_and_backward_match_eager(conv: bool) -> None:
    """Indices follow torch's rule (first of equal maxima, last NaN) and the backward scatters through them."""
    model = PoolWithIndices(conv).eval()
    cm = disc.compile(model, (torch.randn(2, 3, 9, 10),), dynamic={"x": {0: "n", 2: "h", 3: "w"}}, backend="native")
    assert not cm.report.fallbacks and isinstance(cm.executor, NativeExecutor)
    for shape in [(1, 3, 1, 1), (2, 3, 7, 8), (1, 3, 9, 37), (3, 3, 4, 2)]:
        x = torch.randn(*shape) if conv else ties_and_nans(*shape)
        check_against_eager(cm, model, (x,))
