"""Call-time input checks: every rule names the input and dim, and a shape remembered as valid
still has its dtype, device and type checked on every call."""

import numpy as np
import pytest
import torch
from torch import nn

import disc
from disc.runtime import checks, native


class AddRows(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


@pytest.fixture(scope="module")
def add_rows() -> disc.CompiledModule:
    return disc.compile(
        AddRows(),
        (torch.randn(8, 3), torch.randn(8, 3)),
        dynamic={"x": {0: "n"}, "y": {0: "n"}},
        constraints={"n": {"min": 2, "max": 64, "multiple_of": 2}},
    )


@pytest.mark.parametrize(
    "x, y, error, message",
    [
        (torch.randn(4, 3), torch.randn(6, 3), disc.ShapeError, r"input 'y' dim 0 is 6 but must equal input 'x' dim 0 \(4\)"),
        (torch.randn(4, 5), torch.randn(4, 5), disc.ShapeError, r"input 'x' dim 1 is 5 but must be 3 \(a static dim"),
        (torch.randn(66, 3), torch.randn(66, 3), disc.ShapeError, r"input 'x' dim 0 is 66 but n must be in \[2, 64\]"),
        (torch.randn(5, 3), torch.randn(5, 3), disc.ShapeError, r"input 'x' dim 0 is 5 but n must be a multiple of 2"),
        (torch.randn(4, 3).double(), torch.randn(4, 3), disc.InputError, r"input 'x' has dtype torch.float64, compiled for torch.float32"),
        (torch.randn(4, 3, 1), torch.randn(4, 3), disc.InputError, r"input 'x' has rank 3 \(shape \(4, 3, 1\)\)"),
        (torch.randn(4, 3, device="meta"), torch.randn(4, 3), disc.InputError, r"input 'x' is on meta; this program was compiled for cpu"),
        (np.zeros((4, 3), np.float32), torch.randn(4, 3), disc.InputError, r"input 'x' must be a tensor, got ndarray"),
    ],
)
def test_each_rule_names_the_input_and_dim_even_at_a_shape_that_passed_before(add_rows, x, y, error, message):
    # (4, 3) and (6, 3) pairs ran first, so their shapes are remembered as valid: the dtype, device
    # and type rules must still be applied at them.
    for n in (4, 6):
        a, b = torch.randn(n, 3), torch.randn(n, 3)
        torch.testing.assert_close(add_rows(a, b), a + b)
    with pytest.raises(error, match=message):
        add_rows(x, y)
    a, b = torch.randn(4, 3), torch.randn(4, 3)  # still good afterwards
    torch.testing.assert_close(add_rows(a, b), a + b)


def test_remembered_shapes_are_bounded_and_forgetting_them_changes_no_result(add_rows, monkeypatch):
    monkeypatch.setattr(checks, "SHAPES_KEPT", 3)
    monkeypatch.setattr(native, "PLANS_KEPT", 3)
    executor = add_rows.executor
    for n in (2, 4, 6, 8, 10, 4, 2, 62):
        a, b = torch.randn(n, 3), torch.randn(n, 3)
        torch.testing.assert_close(add_rows(a, b), a + b)
        assert 1 <= len(add_rows._check_inputs.passed) <= 3
        assert 1 <= len(executor._plans) <= 3
    with pytest.raises(disc.ShapeError, match="must be a multiple of 2"):
        add_rows(torch.randn(3, 3), torch.randn(3, 3))


def test_a_shape_the_native_program_refuses_is_never_kept(add_rows):
    executor = add_rows.executor
    kept = dict(executor._plans)
    for _ in range(2):  # the second call must fail the same way, not find a plan
        with pytest.raises(disc.ShapeError, match="input 1 dim 0"):
            executor.run([torch.randn(4, 3), torch.randn(6, 3)])  # past the Python checks, straight to disc_shapes
    assert executor._plans == kept


def test_outputs_carry_no_graph_whether_or_not_an_input_requires_grad(add_rows):
    a, b = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3)
    with torch.enable_grad():
        for inputs in ((a, b), (a.detach(), b)):
            out = add_rows(*inputs)
            assert not out.requires_grad and out.grad_fn is None
            torch.testing.assert_close(out, a.detach() + b)


class SumsOfTwo(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sum(-1) + y.sum(-1)


def test_an_expression_constraint_names_the_inputs_and_the_values():
    # It said `shape check failed: input 0 dim 1 must equal 2*half`: no input name, no values.
    cm = disc.compile(SumsOfTwo(), (torch.randn(2, 8), torch.randn(2, 4)), dynamic={"x": {0: "b", 1: "seq"}, "y": {0: "b", 1: "half"}}, constraints=["seq == 2*half"])
    with pytest.raises(disc.ShapeError, match=r"input 'x' dim 1 is 7 but must equal seq = 2\*half = 8 \(half = 4 from input 'y' dim 1\)"):
        cm(torch.randn(2, 7), torch.randn(2, 4))
    assert cm(torch.randn(3, 10), torch.randn(3, 5)).shape == (3,)


def test_a_sparse_input_is_an_input_error(add_rows):
    x = torch.randn(4, 3)
    add_rows(x, x)  # its shape is now remembered as valid: the fast path must still refuse a sparse tensor
    for sparse in (x.to_sparse(), x.to_sparse_csr()):
        with pytest.raises(disc.InputError, match=r"input 'x' is a sparse_(coo|csr) tensor; disc takes dense tensors \(pass x.to_dense\(\)\)"):
            add_rows(sparse, x)
