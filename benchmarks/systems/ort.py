"""onnxruntime: the model exported to ONNX once (dynamic dims), run by an ``InferenceSession`` on the CPU.

The session applies every graph optimization (``ORT_ENABLE_ALL``) and uses as
many intra-op threads as torch, so both sides of the comparison get the same
cores. ORT re-optimizes the graph at every session creation; saving the
optimized graph (``optimized_model_filepath``) was measured and left out: on
bert-base it saved 0.3 s per warm start but added 3.3 s to the cold one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from benchmarks.systems.base import EXPORT_PRELOAD, Runner, register
from benchmarks.systems.onnx_export import CpuPeer, export_onnx, input_arrays, load_output_spec, to_torch
from benchmarks.workloads import Workload


class OrtRunner(Runner):
    def __init__(self, session: Any, workload: Workload, onnx_path: Path) -> None:
        super().__init__()
        self.session = session
        self.workload = workload
        self.spec = load_output_spec(onnx_path)
        self.names = {i.name for i in session.get_inputs()}

    def __call__(self, *args: torch.Tensor) -> Any:
        return to_torch(self.session.run(None, input_arrays(self.workload, args, self.names)), self.spec)

    @property
    def compilations(self) -> int:
        return 1  # the export and the session, whatever shapes follow


def make_session(onnx_path: Path, threads: int) -> Any:
    """A CPU session at ``ORT_ENABLE_ALL`` with ``threads`` intra-op threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    # Spin inside a run (ORT's default, ~20% faster on small calls) but not after it: the suite interleaves
    # systems call by call, and threads left spinning took the cores from the next one (eager 2x slower on gpt2-decode).
    options.add_session_config_entry("session.force_spinning_stop", "1")
    return ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])


class OnnxRuntime(CpuPeer):
    def prepare(self, model, workload, example, ctx, workdir):  # type: ignore[override]
        onnx_path = export_onnx(model, workload, example, workdir / "model.onnx")
        return OrtRunner(make_session(onnx_path, torch.get_num_threads()), workload, onnx_path)


register(
    OnnxRuntime(
        "onnxruntime",
        "onnxruntime CPU, ORT_ENABLE_ALL, exported once with torch.onnx (dynamo) and every dim dynamic",
        requires=("onnx", "onnxscript", "onnxruntime"),
        devices=("cpu",),
        cache_note="reuses the exported model.onnx; the session (graph optimization) is created again",
        preload=(*EXPORT_PRELOAD, "torch.onnx", "onnx", "onnxscript", "onnxruntime"),
    )
)
