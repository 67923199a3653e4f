"""Hugging Face's Llama (grouped-query attention, rotary positions) generating with a KV cache.

The GPU benchmark's decode workload (``benchmarks/hf_workloads.py``) at a tiny size, on the CPU:
``DecodeStep`` takes the cache as one tensor per layer through ``*past``; ``disc.compile``
must compile it once and match eager from a 1-token prefill with an empty cache and a 1-row
batch through prompts and steps of other lengths, and over a greedy generation feeding its
grown cache back. The plug-in runs the Hugging Face model itself on a ``DynamicCache`` (what
``generate`` passes) with no graph break.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import disc  # noqa: E402
from benchmarks.hf_workloads import DECODE_DYNAMIC, DecodeStep, empty_past, llama  # noqa: E402

RTOL = 1e-4


def _step_inputs(model: torch.nn.Module, batch: int, cached: int, new: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    c = model.config
    ids = torch.randint(0, c.vocab_size, (batch, new), generator=g)
    head_dim = c.hidden_size // c.num_attention_heads
    past = [torch.randn(batch, c.num_key_value_heads, cached, head_dim, generator=g) for _ in range(2 * c.num_hidden_layers)]
    return (ids, torch.ones(batch, cached + new, dtype=torch.int64), *past)


def _close(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=RTOL, atol=RTOL * float(w.abs().max()))


@pytest.fixture(scope="module")
def compiled() -> tuple[DecodeStep, object]:
    step = DecodeStep(llama(tiny=True))
    return step, disc.compile(step, _step_inputs(step.model, 2, 3, 2, 0), dynamic=DECODE_DYNAMIC)


@pytest.mark.parametrize("batch, cached, new", [(1, 0, 1), (1, 1, 1), (1, 6, 1), (3, 7, 4), (2, 0, 9), (1, 13, 2)])
def test_a_decode_step_matches_eager_at_every_cache_length_with_one_compilation(compiled, batch, cached, new):
    step, cm = compiled
    args = _step_inputs(step.model, batch, cached, new, seed=batch * 100 + cached * 10 + new)
    with torch.no_grad():
        _close(cm(*args), step(*args))
    assert cm.num_compilations == 1


def test_a_greedy_generation_feeds_its_grown_cache_back(compiled):
    step, cm = compiled
    prompt = torch.randint(0, step.model.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(7))

    def generate(fn) -> list[torch.Tensor]:
        ids, mask, past = prompt, torch.ones_like(prompt), empty_past(step.model, 2, torch.float32, "cpu")
        tokens = []
        for _ in range(6):
            logits, *past = fn(ids, mask, *past)
            ids = logits[:, -1:].argmax(-1)
            mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
            tokens.append(ids)
        return tokens

    with torch.no_grad():
        assert torch.equal(torch.cat(generate(cm), 1), torch.cat(generate(step), 1))
    assert cm.num_compilations == 1


def test_the_plugin_runs_generate_style_calls_on_a_dynamic_cache_without_graph_breaks():
    import torch._dynamo as dynamo
    import transformers as hf

    model = llama(tiny=True)
    arg = DecodeStep(model).cache_arg
    dynamo.reset()
    dynamo.utils.counters.clear()
    plugin = torch.compile(model, backend="disc", dynamic=True)

    def generate(fn, prompt: torch.Tensor) -> list[torch.Tensor]:
        cache, ids, mask = hf.DynamicCache(), prompt, torch.ones_like(prompt)
        logits = []
        for _ in range(4):
            out = fn(input_ids=ids, attention_mask=mask, use_cache=True, **{arg: cache})
            logits.append(out.logits)
            ids = out.logits[:, -1:].argmax(-1)
            mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
        return logits

    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for batch, length in ((1, 1), (1, 5), (2, 9)):
            prompt = torch.randint(0, model.config.vocab_size, (batch, length), generator=g)
            for got, want in zip(generate(plugin, prompt), generate(model, prompt)):
                torch.testing.assert_close(got, want, rtol=RTOL, atol=RTOL * float(want.abs().max()))
    assert not dynamo.utils.counters["graph_break"], dict(dynamo.utils.counters["graph_break"])
    dynamo.reset()


# bf16: eager rounds every op's result to bf16 and disc rounds at its kernels' stores, so the two
# differ by a few bf16 steps across a model (0.6-0.8% of the largest logit measured).
BF16_RTOL = 3e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_gpu_program_of_a_decode_step_matches_eager(dtype):
    # The Triton program (in Triton's interpreter without a GPU; its kernel forms are compiled for
    # an H100 at the session's end), with the cache as inputs and outputs, in the benchmark's dtypes.
    step = DecodeStep(llama(tiny=True).to(dtype))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    step = step.to(device)

    def inputs(batch: int, cached: int, new: int, seed: int) -> tuple[torch.Tensor, ...]:
        return tuple(t.to(device).to(dtype) if t.is_floating_point() else t.to(device) for t in _step_inputs(step.model, batch, cached, new, seed))

    cm = disc.compile(step, inputs(2, 3, 2, 0), dynamic=DECODE_DYNAMIC, backend="triton")
    # Each layer's attention is one library call on the 16-bit cache as the step grew it.
    attention = [n for n in cm.executor.graph.nodes if n.op == "attention"]
    assert len(attention) == step.model.config.num_hidden_layers
    assert all(n.dtype == ("f32" if dtype == torch.float32 else "bf16") for n in attention)
    rtol = RTOL if dtype == torch.float32 else BF16_RTOL
    for batch, cached, new in ((1, 0, 1), (1, 5, 1), (3, 7, 4)):
        args = inputs(batch, cached, new, seed=cached)
        with torch.no_grad():
            for got, want in zip(cm(*args), step(*args)):
                assert got.shape == want.shape and got.dtype == want.dtype
                torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=rtol * float(want.float().abs().max()))
    assert cm.num_compilations == 1
