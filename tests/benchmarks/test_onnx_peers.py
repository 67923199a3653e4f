"""The CPU peers (onnxruntime, OpenVINO) and disc on the same exported file, on the smoke workload: eager's outputs at every shape, and a warm start."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from benchmarks.harness import rel_error
from benchmarks.systems import SYSTEMS, Context
from benchmarks.systems.onnx_export import ExportError, export_onnx
from benchmarks.workloads import Workload, smoke_workload

SHAPES = [{"batch": 2, "seq": 16}, {"batch": 1, "seq": 1}]


def check_matches_eager(runner, workload: Workload, model: torch.nn.Module) -> None:
    for i, shape in enumerate(SHAPES):
        args = workload.inputs(shape, seed=i)
        with torch.no_grad():
            ref = model(*args)
        out = runner(*args)
        assert isinstance(out, tuple) and len(out) == len(ref)
        assert [o.shape for o in out] == [r.shape for r in ref], shape
        assert rel_error(out, ref) <= 1e-4, shape


@pytest.fixture(scope="module")
def smoke() -> tuple[Workload, torch.nn.Module]:
    workload = smoke_workload()
    return workload, workload.build()


@pytest.mark.parametrize("name", ["onnxruntime", "openvino", "disc-onnx"])
def test_peer_matches_eager_and_warm_start_reuses_export(name, smoke, tmp_path: Path, monkeypatch) -> None:
    system = SYSTEMS[name]
    for module in system.requires:
        pytest.importorskip(module)
    workload, model = smoke
    assert system.missing() is None and system.unsupported(workload, Context()) is None
    # The first shape has batch 1 and seq 1: the export must still leave both dims dynamic.
    example = workload.inputs(SHAPES[1])

    cold = system.prepare(model, workload, example, Context(), tmp_path)
    assert cold.compilations == 1
    check_matches_eager(cold, workload, model)

    def no_second_export(*args, **kwargs):
        raise AssertionError("the warm start exported the model again")

    monkeypatch.setattr(torch.onnx, "export", no_second_export)
    if name == "openvino":
        import openvino

        monkeypatch.setattr(openvino, "convert_model", no_second_export)
    warm = system.prepare(model, workload, example, Context(), tmp_path)
    check_matches_eager(warm, workload, model)


class FixesSeq(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], 2, 4).sum(-1)  # only seq == 8 fits


def test_export_that_fixes_a_dynamic_dim_is_an_error(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    workload = dataclasses.replace(
        smoke_workload(),
        name="fixes-seq",
        build=FixesSeq,
        make_inputs=lambda shape, seed: (torch.randn(shape["batch"], shape["seq"]),),
        dynamic={"x": {0: "batch", 1: "seq"}},
        stream=({"batch": 2, "seq": 8},),
    )
    with pytest.raises(ExportError, match="seq"):
        export_onnx(FixesSeq().eval(), workload, workload.inputs(workload.stream[0]), tmp_path / "model.onnx")
    assert not (tmp_path / "model.onnx").exists()
