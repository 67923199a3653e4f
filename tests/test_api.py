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


class _Cache(torch.nn.Module):
    """A step taking one tensor per layer through ``*past``, as a decoder's KV-cache step does."""

    def forward(self, new: torch.Tensor, *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.cat([p, new * (i + 1)], dim=1) for i, p in enumerate(past))


def _cache_inputs(batch: int, cached: int, new: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch, new, 4), *[torch.randn(batch, cached, 4) for _ in range(3)])


def test_a_star_parameter_takes_one_input_per_tensor_and_one_dynamic_entry_names_them_all(tmp_path):
    cm = disc.compile(_Cache(), _cache_inputs(2, 3, 2), dynamic={"new": {0: "batch", 1: "new"}, "past": {0: "batch", 1: "cached"}})
    assert cm.input_names == ["new", "past_0", "past_1", "past_2"]
    loaded = disc.load(cm.save(tmp_path / "step"))
    for batch, cached, new in ((1, 0, 1), (1, 1, 1), (3, 7, 4)):
        args = _cache_inputs(batch, cached, new)
        for program in (cm, loaded):
            for got, want in zip(program(*args), _Cache()(*args)):
                torch.testing.assert_close(got, want)
    assert cm.num_compilations == 1
    with pytest.raises(disc.ShapeError, match="input .past_1. dim 2 is 5 but must be 4"):
        cm(torch.randn(1, 1, 4), torch.randn(1, 2, 4), torch.randn(1, 2, 5), torch.randn(1, 2, 4))


def test_one_past_input_may_name_its_own_dims():
    dynamic = {"new": {1: "new"}, "past": {1: "cached"}, "past_2": {1: "other"}}
    cm = disc.compile(_Cache(), _cache_inputs(2, 3, 2), dynamic=dynamic)
    args = (torch.randn(2, 1, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4), torch.randn(2, 9, 4))
    for got, want in zip(cm(*args), _Cache()(*args)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dim", ["seq len", "s.b", "1st", "批"])
def test_a_dim_name_the_program_text_cannot_hold_is_refused_by_name(dim):
    # It used to compile, then fail at disc.save (or worse, save and fail at disc.load).
    with pytest.raises(CompileError, match=f"input 'x' dim 0 is named {dim!r}; a dim name is ASCII letters, digits and _"):
        disc.compile(Scale(), (torch.randn(2, 3),), dynamic={"x": {0: dim}})


@pytest.mark.parametrize("dim", ["new", "int", "linux", "errno", "N", "EOF", "fault"])
def test_dim_names_that_are_words_of_cpp_compile(dim):
    # Dim names become fields of the generated C++ program: "new" broke its build.
    cm = disc.compile(Scale(), (torch.randn(2, 3),), dynamic={"x": {0: dim, 1: f"{dim}_cols"}}, backend="native")
    for shape in ((1, 1), (5, 7)):
        x = torch.randn(shape)
        torch.testing.assert_close(cm(x), x * 2.0)


class _Pair(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


@pytest.mark.parametrize(
    "dynamic, constraints, message",
    [
        ({"x": {1: "seq"}}, {"seq": {"min": 10, "max": 4}}, "min 10 is greater than max 4"),
        ({"x": {1: "seq"}}, {"seq": {"max": 4}}, "example input 'x' has seq = 8 \\(dim 1\\)"),
        ({"x": {1: "seq"}}, {"seq": {"min": 9}}, "example input 'x' has seq = 8"),
        ({"x": {1: "seq"}}, {"seq": {"multiple_of": 3}}, "multiple_of 3, but the example input 'x' has seq = 8"),
        ({"x": {1: "seq"}}, {"seq": {"multiple_of": 0}}, "multiple_of must be at least 1"),
        ({"x": {0: "batch", 1: "batch"}}, None, "dim name 'batch' is given to input 'x' dim 0 \\(size 2 in the example\\) and to input 'x' dim 1 \\(size 8\\)"),
        ({"x": {0: "b", 1: "seq"}}, ["seq == 2*b + 1"], "does not hold for the example inputs \\(b = 2, seq = 8\\)"),
    ],
    ids=["min-above-max", "max-below-example", "min-above-example", "multiple-of", "multiple-of-zero", "one-name-two-sizes", "expression"],
)
def test_constraints_the_example_contradicts_fail_at_compile_time(dynamic, constraints, message):
    # Each used to compile a program that rejected every input, its own example included.
    with pytest.raises(disc.CompileError, match=message):
        disc.compile(_Pair(), (torch.randn(2, 8),), dynamic=dynamic, constraints=constraints)


def test_constraints_the_example_meets_still_compile():
    cm = disc.compile(_Pair(), (torch.randn(2, 8),), dynamic={"x": {0: "b", 1: "seq"}}, constraints={"seq": {"min": 2, "max": 16, "multiple_of": 4}})
    assert cm(torch.randn(3, 12)).shape == (3, 12)
    cm = disc.compile(_Pair(), (torch.randn(2, 8),), dynamic={"x": {0: "b", 1: "seq"}}, constraints=["seq == 4*b"])
    assert cm(torch.randn(3, 12)).shape == (3, 12)


class _BranchesOnParity(torch.nn.Module):
    """TensorFlow-style padding as MobileNetV2 writes it: ``int()`` of a size, then a branch on
    its parity. torch.export gives no one program for every width."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        width = int(x.shape[-1])
        pad = 1 if width % 2 else 2
        return torch.nn.functional.pad(x, (0, pad)).cumsum(-1) * 0.5


def test_a_model_branching_on_a_size_compiles_a_graph_per_branch_and_says_why(caplog):
    model = _BranchesOnParity()
    with caplog.at_level("WARNING", logger="disc"):
        cm = disc.compile(model, (torch.randn(2, 1),), dynamic={"x": {1: "width"}})
    assert isinstance(cm, disc.PerBranchModule)
    assert "one graph per branch" in caplog.text and "torch.export could not capture _BranchesOnParity" in caplog.text
    # A stream that starts at width 1, then odd and even widths: dynamo's size-1 graph, then one per parity.
    for width in (1, 4, 7, 1, 10, 3):
        x = torch.randn(2, width)
        torch.testing.assert_close(cm(x), model(x))
    assert cm.num_compilations == 3 and cm.calls == 6
    text = disc.explain(cm)
    assert "via disc.compile, one graph per branch" in text and "Constraints violated" in text and text.count("== disc:") == 4
    x = torch.randn(2, 5)
    torch.testing.assert_close(cm(x=x), model(x))  # by name, as a CompiledModule takes it
    with pytest.raises(disc.InputError, match=r"missing input 'x'; the inputs are \['x'\]"):
        cm(y=x)
    with pytest.raises(disc.InputError, match=r"input 'x' dim 0 is 3; it is static \(2\)"):
        cm(torch.randn(3, 5))
    with pytest.raises(disc.ArtifactError, match="_BranchesOnParity has no single program to save"):
        disc.save(cm, "/nonexistent/never-written")


def test_a_model_branching_on_a_size_is_refused_when_constraints_are_asked_for():
    with pytest.raises(disc.CaptureError, match="torch.export could not capture _BranchesOnParity"):
        disc.compile(_BranchesOnParity(), (torch.randn(2, 5),), dynamic={"x": {1: "width"}}, constraints={"width": {"max": 64}})
