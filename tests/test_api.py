"""disc.compile's argument checks: a wrong ``dynamic`` is a clear CompileError, not a crash."""

from __future__ import annotations

import pytest
import torch

import disc
from disc.errors import CompileError


class Scale(torch.nn.Module):
    def forward(self, x):
        return x * 2.0


def test_dynamic_true_is_refused_with_the_expected_form():
    with pytest.raises(CompileError, match=r"dynamic must map input names to \{axis: dim name\}.*backend='disc', dynamic=True"):
        disc.compile(Scale(), (torch.randn(2, 3),), dynamic=True)  # type: ignore[arg-type]


def test_dynamic_naming_an_unknown_input_lists_the_inputs():
    with pytest.raises(CompileError, match=r"unknown input\(s\) \['y'\]; inputs are \['x'\]"):
        disc.compile(Scale(), (torch.randn(2, 3),), dynamic={"y": {0: "batch"}})


def test_dynamic_axis_out_of_range_names_input_and_rank():
    with pytest.raises(CompileError, match=r"dynamic axis 2 of input 'x' is out of range for rank 2"):
        disc.compile(Scale(), (torch.randn(2, 3),), dynamic={"x": {2: "batch"}})


def test_a_named_dynamic_dim_runs_at_other_sizes():
    cm = disc.compile(Scale(), (torch.randn(2, 3),), dynamic={"x": {0: "batch"}})
    for rows in (1, 5):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(cm(x), x * 2.0)
