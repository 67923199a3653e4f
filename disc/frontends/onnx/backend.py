"""``onnx.backend.base.Backend`` for disc: what ONNX's own backend test suite drives.

    from disc.frontends.onnx import backend
    rep = backend.prepare(model)            # compiles once (disc.onnx.compile)
    outputs = rep.run([x, y])               # a tuple of numpy arrays
    backend.run_model(model, [x, y])        # both at once

``$DISC_ONNX_BACKEND`` picks disc's backend for ``prepare`` ("auto" by default; "reference"
runs the imported IR op by op, which checks import semantics without compiling code).
"""

from __future__ import annotations

import os
from typing import Any

from onnx.backend.base import Backend, BackendRep

from disc.frontends.onnx import OnnxProgram
from disc.frontends.onnx import compile as compile_onnx


class DiscRep(BackendRep):
    def __init__(self, program: OnnxProgram) -> None:
        self.program = program

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, dict):
            return tuple(self.program(**inputs))
        if not isinstance(inputs, (list, tuple)):
            inputs = [inputs]
        return tuple(self.program(*inputs))


class DiscBackend(Backend):
    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> DiscRep:
        super().prepare(model, device, **kwargs)
        if not cls.supports_device(device):
            raise RuntimeError(f"disc's ONNX backend runs on CPU, not {device}")
        return DiscRep(compile_onnx(model, backend=kwargs.get("backend") or os.environ.get("DISC_ONNX_BACKEND") or None))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"


prepare = DiscBackend.prepare
run_model = DiscBackend.run_model
supports_device = DiscBackend.supports_device
