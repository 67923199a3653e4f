"""OpenVINO: the model converted by OpenVINO's own PyTorch frontend (dynamic dims), compiled for the CPU plugin.

Why ``openvino.convert_model`` from torch rather than the onnxruntime adapter's
ONNX file: both handled every workload at every shape (1-sized dims too), but
OpenVINO ran its own conversion 1.1-1.6x faster at a mid-size shape of each
workload (it folds attention's transposes into the MatMuls: 4 Transposes are
left in bert-small's compiled graph against 28 from the ONNX file), and the
conversion took 1-4 s in a fresh process against 2.5-12 s for the ONNX export.
The frontend traces with TorchScript (deprecated in torch 2.13, still working);
the tracer's warnings become notes on the results.

Precision is forced to f32: on CPUs with bf16 the plugin would otherwise run
bf16 (3.5x faster on bert-small here) and the comparison with eager would not
be fair. The converted model is saved as OpenVINO IR in the workdir and the
compiled blob goes to ``CACHE_DIR`` next to it, so a warm start neither
converts nor compiles: it loads the blob.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from benchmarks.systems.base import EXPORT_PRELOAD, Runner, register
from benchmarks.systems.onnx_export import (
    CpuPeer,
    ExportError,
    load_output_spec,
    root_cause,
    save_output_spec,
    spec_path,
    to_torch,
    trace_args,
)
from benchmarks.workloads import Workload


class OpenVinoRunner(Runner):
    def __init__(self, compiled: Any, xml_path: Path, notes: list[str]) -> None:
        super().__init__()
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.spec = load_output_spec(xml_path)
        self.notes.extend(notes)

    def __call__(self, *args: torch.Tensor) -> Any:
        # Positional feeds: the frontend keeps every forward arg, but may give an input several names.
        # share_outputs=False: the request reuses its output buffers, so results must be copies.
        arrays = [a.detach().cpu().numpy() for a in args]
        result = self.request.infer(arrays, share_inputs=True, share_outputs=False)
        return to_torch([result[output] for output in self.compiled.outputs], self.spec)

    @property
    def compilations(self) -> int:
        return 1  # one compilation with dynamic shapes serves the whole stream


def convert_openvino(model: nn.Module, workload: Workload, example: tuple, xml_path: Path) -> tuple[Path, list[str]]:
    """The model as OpenVINO IR at ``xml_path``, every dim of ``workload.dynamic`` dynamic; reused if there.

    Also returns the TorchScript tracer's warnings: the frontend traces the
    model, and a size the trace turned into a constant would be wrong at
    other shapes, so they are worth a note next to the results.
    """
    import openvino as ov

    if xml_path.exists() and spec_path(xml_path).exists():
        return xml_path, []
    args = trace_args(workload, example)
    shapes = [
        ov.PartialShape([-1 if axis in axes else size for axis, size in enumerate(a.shape)])
        for a, axes in zip(args, workload.dynamic.values())
    ]
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("ignore")  # torch.jit.trace's own deprecation warnings
        warnings.simplefilter("always", torch.jit.TracerWarning)
        try:
            converted = ov.convert_model(model, example_input=args, input=shapes)
        except Exception as exc:
            raise ExportError(f"openvino.convert_model of {workload.name} failed: {root_cause(exc)}") from exc
        spec = pytree.tree_flatten(model(*args))[1]
    notes = sorted({f"TorchScript trace warned: {w.message}"[:300] for w in caught if issubclass(w.category, torch.jit.TracerWarning)})
    xml_path.parent.mkdir(parents=True, exist_ok=True)
    save_output_spec(xml_path, spec)
    # Saved under another name and renamed last (weights first): an interrupted save never looks reusable.
    partial = xml_path.with_name(xml_path.stem + ".partial.xml")
    ov.save_model(converted, str(partial), compress_to_fp16=False)  # the default would halve the weights to fp16
    os.replace(partial.with_suffix(".bin"), xml_path.with_suffix(".bin"))
    os.replace(partial, xml_path)
    return xml_path, notes


def compile_cpu(xml_path: Path, threads: int, cache_dir: Path) -> Any:
    """``xml_path`` compiled for "CPU": f32, LATENCY hint, ``threads`` threads, blobs cached in ``cache_dir``."""
    import openvino as ov
    import openvino.properties as props
    import openvino.properties.hint as hints

    config = {
        hints.inference_precision: ov.Type.f32,
        hints.performance_mode: hints.PerformanceMode.LATENCY,
        props.inference_num_threads: threads,
        props.cache_dir: str(cache_dir),
    }
    # Compiling from the path (not a read model) lets a cache hit skip reading the IR at all.
    return ov.Core().compile_model(str(xml_path), "CPU", config)


class OpenVino(CpuPeer):
    def prepare(self, model, workload, example, ctx, workdir):  # type: ignore[override]
        xml_path, notes = convert_openvino(model, workload, example, workdir / "model.xml")
        return OpenVinoRunner(compile_cpu(xml_path, torch.get_num_threads(), workdir / "openvino-cache"), xml_path, notes)


register(
    OpenVino(
        "openvino",
        "OpenVINO CPU plugin, f32, LATENCY hint, converted once from torch (openvino.convert_model) with every dim dynamic",
        requires=("openvino",),
        devices=("cpu",),
        cache_note="reuses the converted IR (model.xml) and OpenVINO's compiled blob (CACHE_DIR in the workdir)",
        preload=(*EXPORT_PRELOAD, "openvino"),
    )
)
