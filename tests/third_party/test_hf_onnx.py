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


def _matches(got: list[np.ndarray], want: list[np.ndarray], where: object) -> None:
    """Same outputs: shapes and dtypes equal, floats within RTOL of the largest, the rest exact."""
    assert len(got) == len(want), where
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (where, g.shape, w.shape, g.dtype, w.dtype)
        if w.dtype.kind == "f" and w.size:
            err = float(np.abs(g.astype(np.float64) - w).max() / max(np.abs(w).max(), 1e-30))
            assert err <= RTOL, (where, err)
        else:
            assert np.array_equal(g, w), where


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
        _matches(program(**feeds), want, (batch, length))
        compared += 1
    assert compared >= 1
    assert getattr(program, "compilations", 1) == 1


# -- GPT-2 with its KV cache as inputs: a decode step as ONNX deployments export it -----------------
KV_LAYERS, KV_HEADS, KV_HEAD_DIM, KV_VOCAB = 2, 2, 16, 128


class _DecodeStep(torch.nn.Module):
    """One GPT-2 step on (ids, mask, past keys and values per layer); returns the logits and the
    grown keys and values as tensors, which the next step takes as its past."""

    def __init__(self) -> None:
        super().__init__()
        import transformers as hf

        self.config = hf.GPT2Config(
            vocab_size=KV_VOCAB, n_embd=KV_HEADS * KV_HEAD_DIM, n_layer=KV_LAYERS, n_head=KV_HEADS, n_positions=64,
            bos_token_id=KV_VOCAB - 1, eos_token_id=KV_VOCAB - 1,
        )  # fmt: skip
        # SDPA's is_causal becomes a symbolic bool under torch.export, which the kernel refuses.
        self.model = hf.GPT2LMHeadModel._from_config(self.config, attn_implementation="eager").eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, past: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.config)
        for layer in range(KV_LAYERS):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
        return (out.logits, *[t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)])


def _step_inputs(batch: int, past: int, new: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, KV_VOCAB, (batch, new), generator=g)
    kv = [torch.randn(batch, KV_HEADS, past, KV_HEAD_DIM, generator=g) for _ in range(2 * KV_LAYERS)]
    return ids, torch.ones(batch, past + new, dtype=torch.int64), kv


def _export_step(step: _DecodeStep, example: tuple, path: Path) -> None:
    dim = torch.export.Dim.DYNAMIC
    dynamic = {"input_ids": {0: dim, 1: dim}, "attention_mask": {0: dim, 1: dim}, "past": [{0: dim, 2: dim}] * (2 * KV_LAYERS)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            program = torch.onnx.export(step, example, dynamo=True, dynamic_shapes=dynamic, verbose=False)
        finally:
            logging.disable(logging.NOTSET)
    program.save(str(path), external_data=False)


def test_gpt2_with_kv_cache_inputs_compiles_once_and_decodes_as_onnx_runtime_does(tmp_path):
    """Batch, past length and new tokens all dynamic (traced at 2 tokens: a 1-token trace pins the
    count to 1). One compilation serves single steps from a 1-long past and a 1-token batch, a
    multi-token step, and a decode loop whose grown cache is fed back, against ORT and eager."""
    torch.manual_seed(0)
    step = _DecodeStep().eval()
    path = tmp_path / "gpt2_kv.onnx"
    _export_step(step, _step_inputs(2, 3, 2, 0), path)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    program = disc.onnx.compile(str(path))

    def run(ids, mask, kv, where):
        feeds = dict(zip(names, [ids.numpy(), mask.numpy(), *[t.numpy() for t in kv]]))
        got = program(**feeds)
        _matches(got, sess.run(None, feeds), where)
        with torch.no_grad():
            _matches(got, [t.numpy() for t in step(ids, mask, kv)], where)
        return got

    for batch, past, new in [(1, 1, 1), (1, 2, 1), (2, 7, 1), (3, 12, 1), (1, 5, 4), (2, 1, 3)]:
        run(*_step_inputs(batch, past, new, 7), (batch, past, new))
    ids, mask, kv = _step_inputs(2, 1, 3, 11)
    for t in range(4):
        got = run(ids, mask, kv, ("loop", t))
        ids = torch.from_numpy(got[0][:, -1].argmax(-1, keepdims=True))  # greedy: the next token
        kv = [torch.from_numpy(a) for a in got[1:]]
        mask = torch.ones(ids.shape[0], kv[0].shape[2] + 1, dtype=torch.int64)
    assert kv[0].shape[2] == 1 + 3 + 3  # the cache grew by one a step after the 3-token start
    assert getattr(program, "compilations", 1) == 1


def test_a_token_count_the_export_pinned_is_refused_by_name(tmp_path):
    """Traced at one new token, the exporter keeps that 1 in the graph (ORT then fails inside an
    Add at 4 tokens); disc refuses the call naming the input and the dim."""
    torch.manual_seed(0)
    step = _DecodeStep().eval()
    path = tmp_path / "gpt2_kv_1.onnx"
    _export_step(step, _step_inputs(2, 3, 1, 0), path)
    program = disc.onnx.compile(str(path))
    ids, mask, kv = _step_inputs(1, 5, 1, 3)
    feeds = [ids.numpy(), mask.numpy(), *[t.numpy() for t in kv]]
    assert program(*feeds)[0].shape == (1, 1, KV_VOCAB)
    ids, mask, kv = _step_inputs(1, 5, 4, 3)
    with pytest.raises(disc.ShapeError, match=r"input 'input_ids' dim 1 is 4 but must be 1"):
        program(ids.numpy(), mask.numpy(), *[t.numpy() for t in kv])
