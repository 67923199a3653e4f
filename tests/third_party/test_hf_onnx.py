"""Third-party models exported to ONNX the way users export them, then compiled by ``disc.onnx``.

Each ``hf_zoo`` architecture goes through ``torch.onnx.export(dynamo=True)`` with every dim of
every input dynamic (the batch and the length; an image's sides), and ``disc.onnx.compile``
must compile the file once and match ONNX Runtime on the same file over the first shapes of the
architecture's stream (size-1 dims first). The exporter writes shape arithmetic of its own
(a mask's elements over the ids' batch, a patch count squared, interpolation sizes from the
input's sides) that disc's own tests of the ONNX frontend did not see until they were run here.

Where ONNX Runtime itself fails at a shape (an exported ViT or SegFormer keeps the traced image's
patch count or batch as a constant), disc must refuse too, or match at the shapes ORT runs.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from hf_zoo import ARCHS, Arch

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import disc.onnx  # noqa: E402

# torch.export itself fails on these with every dim dynamic (before any ONNX exists).
NOT_EXPORTED = {
    "swin": "torch.export: the window partition's view of a padded map",
    "t5": "torch.export: the attention's view",
}
# Compiled and refused with a clear error naming the op: (op, why).
REFUSED = {"wav2vec2": ("Expand", "an Expand whose shape is a sum over the mask's values: a data-dependent shape")}
RTOL = 1e-4


def _export(arch: Arch, path: Path) -> None:
    model = arch.build().eval()
    batch, length = arch.stream[0]
    args, kwargs = arch.inputs(batch, length, 0)

    def dynamic(t: object) -> dict | None:
        if not isinstance(t, torch.Tensor):
            return None
        if arch.family == "vision" and t.dim() == 4:  # NCHW: the channels stay
            return {0: torch.export.Dim.DYNAMIC, 2: torch.export.Dim.DYNAMIC, 3: torch.export.Dim.DYNAMIC}
        return {axis: torch.export.Dim.DYNAMIC for axis in range(t.dim())}

    bound = inspect.signature(model.forward).bind(*args, **kwargs).arguments
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            program = torch.onnx.export(model, args, kwargs=kwargs, dynamo=True, dynamic_shapes={k: pytree.tree_map(dynamic, v) for k, v in bound.items()}, verbose=False)
        finally:
            logging.disable(logging.NOTSET)
    program.save(str(path), external_data=False)


def _feeds(arch: Arch, names: list[str], batch: int, length: int) -> dict[str, np.ndarray]:
    args, kwargs = arch.inputs(batch, length, 1)
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    return {name: t.numpy() for name, t in zip(names, tensors)}


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_an_exported_model_compiles_once_and_matches_onnx_runtime(name, tmp_path):
    arch = ARCHS[name]
    path = tmp_path / f"{name}.onnx"
    if name in NOT_EXPORTED:
        pytest.skip(NOT_EXPORTED[name])
    _export(arch, path)
    if name in REFUSED:
        with pytest.raises(disc.CompileError, match=REFUSED[name][0]):
            disc.onnx.compile(str(path))
        return
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    program = disc.onnx.compile(str(path))
    compared = 0
    for batch, length in arch.stream[:4]:
        if not arch.valid_length(length):
            continue
        feeds = _feeds(arch, names, batch, length)
        try:
            want = sess.run(None, feeds)
        except Exception:  # the exported graph does not hold at this shape: disc may refuse it too
            continue
        got = program(**feeds)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (batch, length, g.shape, w.shape)
            if w.dtype.kind == "f" and w.size:
                err = float(np.abs(g.astype(np.float64) - w).max() / max(np.abs(w).max(), 1e-30))
                assert err <= RTOL, (batch, length, err)
            else:
                assert np.array_equal(g, w), (batch, length)
        compared += 1
    assert compared >= 1
    assert getattr(program, "compilations", 1) == 1
