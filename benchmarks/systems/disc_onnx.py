"""disc on the exported ONNX file: ``disc.onnx.compile`` reading the ``model.onnx`` that
onnxruntime and OpenVINO read (exported the same way, every dim dynamic), called with numpy
arrays as their sessions are. It shows what an ONNX user gets from disc without PyTorch in the
loop; the ``disc`` system compiles the PyTorch model itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from benchmarks.systems.base import EXPORT_PRELOAD, Runner, register
from benchmarks.systems.onnx_export import CpuPeer, export_onnx, input_arrays, load_output_spec, to_torch
from benchmarks.workloads import Workload


class DiscOnnxRunner(Runner):
    def __init__(self, program: Any, workload: Workload, onnx_path: Path) -> None:
        super().__init__()
        self.program = program
        self.workload = workload
        self.spec = load_output_spec(onnx_path)
        self.names = set(program.input_names)

    def __call__(self, *args: torch.Tensor) -> Any:
        return to_torch(self.program(**input_arrays(self.workload, args, self.names)), self.spec)

    @property
    def compilations(self) -> int:
        return getattr(self.program, "compilations", 1)  # one program for every shape, unless inputs are used as shapes


class DiscOnnx(CpuPeer):
    def prepare(self, model, workload, example, ctx, workdir):  # type: ignore[override]
        import disc.onnx

        onnx_path = export_onnx(model, workload, example, workdir / "model.onnx")
        return DiscOnnxRunner(disc.onnx.compile(str(onnx_path)), workload, onnx_path)


register(
    DiscOnnx(
        "disc-onnx",
        "disc.onnx.compile on the model.onnx the CPU peers read (exported once with torch.onnx, dynamo, every dim dynamic)",
        requires=("onnx", "onnxscript"),
        devices=("cpu",),
        cache_note="reuses the exported model.onnx; disc.onnx.compile runs again (the ONNX path keeps no program cache yet)",
        preload=(*EXPORT_PRELOAD, "torch.onnx", "onnx", "onnxscript", "disc.onnx"),
    )
)
