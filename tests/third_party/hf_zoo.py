"""Tiny Hugging Face ``transformers`` models with random weights, for checking disc against eager.

Every model is built from a config class in code (nothing is downloaded) and is small enough to run a
forward pass on CPU in a few milliseconds. Each entry says how to build the model, how to make inputs
for a (batch, length) pair, which shapes to stream through it, and which output tensors to compare.

``length`` is the sequence length for text models, the image side (square images) for vision models,
and the number of encoder frames for the audio model (see ``_wav2vec2_inputs`` for the sample count).

Run ``python tests/third_party/hf_zoo.py`` to check every entry in eager PyTorch and print a table.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers as hf

Inputs = tuple[tuple[Any, ...], dict[str, Any]]

VOCAB = 128
HIDDEN = 32
TEXT_STREAM = [(1, 5), (2, 9), (3, 1), (4, 16), (3, 23)]
MAX_TEXT = 64  # every text model has at least this many positions (learned tables are sized for it)


@dataclass(frozen=True)
class Arch:
    name: str
    family: str  # "encoder", "decoder", "encoder-decoder", "vision" or "audio"
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[int, int, int], Inputs]  # (batch, length, seed) -> (args, kwargs)
    stream: list[tuple[int, int]]  # (batch, length) pairs in the order a test feeds them
    output: Callable[[Any], list[torch.Tensor]]  # the float tensors to compare, from the model's output
    # Lengths the model accepts (``inputs`` raises ValueError for the others); see the notes on each entry.
    valid_length: Callable[[int], bool] = field(default=lambda n: n >= 1)


# --------------------------------------------------------------------------- building


def _zero_dropout(config: hf.PreTrainedConfig) -> hf.PreTrainedConfig:
    """Set every dropout-like probability of ``config`` to 0 (names differ across models: ``*_dropout``,
    ``*_pdrop``, ``layerdrop``, ``drop_path_rate``), so train mode is deterministic too."""
    for key, value in config.to_dict().items():
        if isinstance(value, float) and re.search(r"dropout|pdrop|layerdrop|drop_path", key):
            setattr(config, key, 0.0)
    return config


def _seeded(make: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    """``make`` run under seed 0, in eval mode. The global RNG is restored afterwards, so building a
    model does not change the random numbers a test draws next."""

    def build() -> torch.nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return make().eval()

    return build


def _model(cls: type, config: hf.PreTrainedConfig, **kwargs: Any) -> Callable[[], torch.nn.Module]:
    # A copy per build: models write into their config (the attention implementation, for one).
    return _seeded(lambda: cls(_zero_dropout(copy.deepcopy(config)), **kwargs))


def _calibrated(
    build: Callable[[], torch.nn.Module], inputs: Callable[[int, int, int], Inputs], batch: int, length: int
) -> Callable[[], torch.nn.Module]:
    """``build`` with its BatchNorm running statistics measured on one random batch, as training
    would leave them. With the initial ones (mean 0, variance 1) each eval-mode block shrinks its
    activations: MobileNetV2's outputs were 1e-27, so small that no error could show against them."""

    def calibrated() -> torch.nn.Module:
        model = build()
        norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
        momenta = [m.momentum for m in norms]
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # a cumulative average: after one batch, that batch's statistics
        args, kwargs = inputs(batch, length, 12345)
        with torch.no_grad():
            model.train()(*args, **kwargs)
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
        return model.eval()

    return calibrated


# --------------------------------------------------------------------------- inputs


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _check(arch: str, length: int, ok: Callable[[int], bool]) -> None:
    if not ok(length):
        raise ValueError(f"{arch} does not accept length {length}")


def _text_ok(length: int) -> bool:
    return 1 <= length <= MAX_TEXT


def _padding_mask(batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """Ones, except that odd rows end in padding (zeros). Row 0 is never padded, so ``length`` stays the
    longest row, and every row keeps at least one 1."""
    mask = torch.ones(batch, length, dtype=torch.long)
    if length > 1:
        for row in range(1, batch, 2):
            kept = int(torch.randint(1, length, (1,), generator=gen))
            mask[row, kept:] = 0
    return mask


def _token_ids(batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=gen)


def _encoder_inputs(pad_id: int) -> Callable[[int, int, int], Inputs]:
    def inputs(batch: int, length: int, seed: int) -> Inputs:
        _check("text model", length, _text_ok)
        gen = _gen(seed)
        ids = _token_ids(batch, length, gen)
        mask = _padding_mask(batch, length, gen)
        ids = ids.masked_fill(mask == 0, pad_id)  # what a tokenizer puts under the padding
        return (ids,), {"attention_mask": mask}

    return inputs


def _decoder_inputs(batch: int, length: int, seed: int) -> Inputs:
    _check("text model", length, _text_ok)
    ids = _token_ids(batch, length, _gen(seed))
    return (ids,), {"attention_mask": torch.ones(batch, length, dtype=torch.long)}


def _seq2seq_inputs(pad_id: int) -> Callable[[int, int, int], Inputs]:
    """Encoder inputs as for an encoder, plus decoder ids of a different length (``length // 2 + 1``)."""
    encoder = _encoder_inputs(pad_id)

    def inputs(batch: int, length: int, seed: int) -> Inputs:
        args, kwargs = encoder(batch, length, seed)
        kwargs["decoder_input_ids"] = _token_ids(batch, length // 2 + 1, _gen(seed + 1))
        return args, kwargs

    return inputs


def _image_inputs(arch: str, ok: Callable[[int], bool], **extra: Any) -> Callable[[int, int, int], Inputs]:
    def inputs(batch: int, side: int, seed: int) -> Inputs:
        _check(arch, side, ok)
        pixels = torch.randn(batch, 3, side, side, generator=_gen(seed))
        return (pixels,), dict(extra)

    return inputs


# --------------------------------------------------------------------------- outputs


def _last_hidden(out: Any) -> list[torch.Tensor]:
    return [out.last_hidden_state]


def _logits(out: Any) -> list[torch.Tensor]:
    return [out.logits]


def _hidden_and_pooled(out: Any) -> list[torch.Tensor]:
    return [out.last_hidden_state, out.pooler_output]


def _seq2seq(out: Any) -> list[torch.Tensor]:
    return [out.last_hidden_state, out.encoder_last_hidden_state]


# --------------------------------------------------------------------------- text: encoders

# Attention implementation: the library's default, left alone. ``main`` prints model.config._attn_implementation;
# with transformers 5.24 it is "sdpa" for all but deberta_v2 and bloom ("eager": no SDPA path), and
# convnext and mobilenet_v2 (which have no attention; the config still says "eager").

_bert = Arch(
    name="bert",
    family="encoder",
    # The pooler is left out: its parameters would get no gradient from last_hidden_state.
    build=_model(
        hf.BertModel,
        hf.BertConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        ),
        add_pooling_layer=False,
    ),
    inputs=_encoder_inputs(pad_id=0),
    stream=TEXT_STREAM,
    valid_length=_text_ok,
    output=_last_hidden,
)

_roberta = Arch(
    name="roberta",
    family="encoder",
    # RoBERTa numbers positions from pad_token_id + 1 and skips pad tokens (a cumsum over ids != pad),
    # so max_position_embeddings must cover length + 2.
    build=_model(
        hf.RobertaModel,
        hf.RobertaConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=66,
            pad_token_id=1,
        ),
        add_pooling_layer=False,
    ),
    inputs=_encoder_inputs(pad_id=1),
    stream=TEXT_STREAM,
    valid_length=_text_ok,
    output=_last_hidden,
)

_deberta_v2 = Arch(
    name="deberta_v2",
    family="encoder",
    # DeBERTa-v3 style disentangled attention: content-to-position and position-to-content terms, relative
    # positions log-bucketed beyond position_buckets (16, below the longest stream length 23), shared keys.
    build=_model(
        hf.DebertaV2Model,
        hf.DebertaV2Config(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            position_buckets=16,
            share_att_key=True,
            norm_rel_ebd="layer_norm",
            position_biased_input=False,
        ),
    ),
    inputs=_encoder_inputs(pad_id=0),
    stream=TEXT_STREAM,
    valid_length=_text_ok,
    output=_last_hidden,
)

# --------------------------------------------------------------------------- text: decoders

# use_cache=False everywhere: the outputs are then plain tensors, with no cache object beside them.

_gpt2 = Arch(
    name="gpt2",
    family="decoder",
    build=_model(
        hf.GPT2LMHeadModel,
        hf.GPT2Config(
            vocab_size=VOCAB,
            n_embd=HIDDEN,
            n_layer=2,
            n_head=2,
            n_positions=64,
            bos_token_id=VOCAB - 1,  # the defaults (50256) lie outside the tiny vocabulary
            eos_token_id=VOCAB - 1,
            use_cache=False,
        ),
    ),
    inputs=_decoder_inputs,
    stream=TEXT_STREAM,
    valid_length=_text_ok,
    output=_logits,
)


def _llama_like(config_cls: type, **extra: Any) -> hf.PreTrainedConfig:
    """A LLaMA-shaped config: rotary positions, RMSNorm, SwiGLU, and grouped-query attention
    (4 query heads share 2 key/value heads)."""
    return config_cls(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_cache=False,
        **extra,
    )


_llama = Arch(
    name="llama",
    family="decoder",
    build=_model(hf.LlamaForCausalLM, _llama_like(hf.LlamaConfig)),
    inputs=_decoder_inputs,
    stream=TEXT_STREAM,
    valid_length=_text_ok,
    output=_logits,
)

_mistral = Arch(
    name="mistral",
    family="decoder",
    # A 4-token sliding window: the stream has sequences shorter (1) and longer (5 to 23) than it.
    build=_model(hf.MistralForCausalLM, _llama_like(hf.MistralConfig, sliding_window=4)),
    inputs=_decoder_inputs,
    stream=TEXT_STREAM,
    valid_length=_text_ok,
    output=_logits,
)

_qwen2 = Arch(
    name="qwen2",
    family="decoder",
    # Qwen2 differs from LLaMA by biases on the q/k/v projections.
    build=_model(hf.Qwen2ForCausalLM, _llama_like(hf.Qwen2Config)),
    inputs=_decoder_inputs,
    stream=TEXT_STREAM,
    valid_length=_text_ok,
    output=_logits,
)

_bloom = Arch(
    name="bloom",
    family="decoder",
    # ALiBi: no position embeddings; a per-head linear bias on attention scores, built from the
    # attention mask's cumulative sum. Bloom has no SDPA path, so it runs "eager" attention (baddbmm).
    build=_model(
        hf.BloomModel,
        hf.BloomConfig(vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=2, n_head=4, use_cache=False),
    ),
    inputs=_decoder_inputs,
    stream=TEXT_STREAM,
    valid_length=_text_ok,
    output=_last_hidden,
)

# --------------------------------------------------------------------------- text: encoder-decoders

_t5 = Arch(
    name="t5",
    family="encoder-decoder",
    # Bucketed relative position bias (8 buckets, exact below 4, log-spaced up to distance 16).
    build=_model(
        hf.T5Model,
        hf.T5Config(
            vocab_size=VOCAB,
            d_model=HIDDEN,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
            use_cache=False,
        ),
    ),
    inputs=_seq2seq_inputs(pad_id=0),
    stream=TEXT_STREAM,
    valid_length=_text_ok,
    output=_seq2seq,
)

_bart = Arch(
    name="bart",
    family="encoder-decoder",
    build=_model(
        hf.BartModel,
        hf.BartConfig(
            vocab_size=VOCAB,
            d_model=HIDDEN,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
            use_cache=False,
        ),
    ),
    inputs=_seq2seq_inputs(pad_id=1),
    stream=TEXT_STREAM,
    valid_length=_text_ok,
    output=_seq2seq,
)

# --------------------------------------------------------------------------- vision


def _vit_ok(side: int) -> bool:
    return side >= 4


_vit = Arch(
    name="vit",
    family="vision",
    # Sides other than config.image_size need interpolate_pos_encoding=True (a bool in the kwargs): the
    # position embeddings are resized bicubically to the patch grid. Sides not divisible by the patch
    # size (4) are floored by the patch convolution.
    build=_model(
        hf.ViTModel,
        hf.ViTConfig(
            image_size=32,
            patch_size=4,
            hidden_size=HIDDEN,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
        ),
        add_pooling_layer=False,
    ),
    inputs=_image_inputs("vit", _vit_ok, interpolate_pos_encoding=True),
    stream=[(1, 32), (2, 24), (3, 40), (2, 16), (5, 30)],
    output=_last_hidden,
    valid_length=_vit_ok,
)


def _swin_ok(side: int) -> bool:
    # A Swin layer whose feature map is no wider than its window *permanently* sets its own window to the
    # map size and its shift to 0 (state kept on the module across calls), and a window smaller than 4
    # no longer matches the relative position bias table. Keeping the last stage's map (side / 4, rounded
    # up) above the window (4) avoids both: side >= 17. Sides not divisible by the patch (2), by 2 at the
    # patch merge, or by the window are padded inside the model.
    return side >= 17


_swin = Arch(
    name="swin",
    family="vision",
    build=_model(
        hf.SwinModel,
        hf.SwinConfig(
            image_size=32,
            patch_size=2,
            embed_dim=HIDDEN,
            depths=[2, 2],  # two blocks per stage: the second uses shifted windows
            num_heads=[2, 4],
            window_size=4,
            mlp_ratio=2.0,
        ),
    ),
    inputs=_image_inputs("swin", _swin_ok),
    stream=[(1, 32), (2, 24), (3, 37), (2, 20), (5, 29)],
    output=_hidden_and_pooled,
    valid_length=_swin_ok,
)


def _convnext_ok(side: int) -> bool:
    return side >= 8  # a 4x4 stride-4 stem, then a 2x2 stride-2 downsampling


_convnext = Arch(
    name="convnext",
    family="vision",
    # The pooled output goes through the final LayerNorm, which last_hidden_state does not.
    build=_model(
        hf.ConvNextModel,
        hf.ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[2, 2], image_size=32),
    ),
    inputs=_image_inputs("convnext", _convnext_ok),
    stream=[(1, 32), (2, 24), (3, 37), (2, 16), (5, 29)],
    output=_hidden_and_pooled,
    valid_length=_convnext_ok,
)


def _mobilenet_ok(side: int) -> bool:
    # Eval accepts any side; in train mode every BatchNorm needs more than one value per channel, and at
    # output_stride 8 the last maps are ceil(side / 8) wide, so batch-1 training needs side >= 9.
    return side >= 9


_mobilenet_v2 = Arch(
    name="mobilenet_v2",
    family="vision",
    # depth_multiplier and expand_ratio shrink the 17 inverted-residual blocks; finegrained_output=False
    # lets depth_multiplier shrink the final 1280-channel convolution too. output_stride=8 turns the
    # last strides into dilations.
    build=_calibrated(
        _model(
            hf.MobileNetV2Model,
            hf.MobileNetV2Config(image_size=32, depth_multiplier=0.25, expand_ratio=2.0, finegrained_output=False, output_stride=8),
        ),
        _image_inputs("mobilenet_v2", _mobilenet_ok),
        4,
        32,
    ),
    inputs=_image_inputs("mobilenet_v2", _mobilenet_ok),
    stream=[(1, 32), (2, 24), (3, 37), (2, 16), (5, 29)],
    output=_hidden_and_pooled,
    valid_length=_mobilenet_ok,
)


def _segformer_ok(side: int) -> bool:
    # Stage 1 (7x7 patches, stride 4, padding 3) must be at least 2 wide for its 2x2 spatial reduction.
    return side >= 5


_segformer = Arch(
    name="segformer",
    family="vision",
    # Logits for 5 classes at a quarter of the image resolution (the decode head upsamples stage 2 to
    # stage 1 bilinearly). The decode head has a BatchNorm.
    build=_calibrated(
        _model(
            hf.SegformerForSemanticSegmentation,
            hf.SegformerConfig(
                num_encoder_blocks=2,
                depths=[1, 1],
                sr_ratios=[2, 1],
                hidden_sizes=[16, 32],
                patch_sizes=[7, 3],
                strides=[4, 2],
                num_attention_heads=[1, 2],
                mlp_ratios=[2, 2],
                decoder_hidden_size=32,
                num_labels=5,
            ),
        ),
        _image_inputs("segformer", _segformer_ok),
        4,
        32,
    ),
    inputs=_image_inputs("segformer", _segformer_ok),
    stream=[(1, 32), (2, 24), (3, 37), (2, 16), (5, 29)],
    output=_logits,
    valid_length=_segformer_ok,
)

# --------------------------------------------------------------------------- audio

# Feature encoder: conv(kernel 10, stride 5) then conv(kernel 3, stride 2): 10 * frames + 10 samples make
# exactly `frames` frames; 3 samples more (too few for another frame) make every sample count odd.
_W2V_SAMPLES_PER_FRAME = 10
_W2V_EXTRA_SAMPLES = 13


def _wav2vec2_samples(frames: int) -> int:
    return _W2V_SAMPLES_PER_FRAME * frames + _W2V_EXTRA_SAMPLES


def _wav2vec2_inputs(batch: int, frames: int, seed: int) -> Inputs:
    """``batch`` raw waveforms of ``_wav2vec2_samples(frames)`` samples; odd rows are padded (zeros in both
    the waveform and the mask) after a whole number of frames, keeping at least one."""
    _check("wav2vec2", frames, lambda n: n >= 1)
    gen = _gen(seed)
    samples = _wav2vec2_samples(frames)
    audio = torch.randn(batch, samples, generator=gen)
    mask = torch.ones(batch, samples, dtype=torch.long)
    if frames > 1:
        for row in range(1, batch, 2):
            kept = _wav2vec2_samples(int(torch.randint(1, frames, (1,), generator=gen)))
            mask[row, kept:] = 0
    audio = audio * mask
    return (audio,), {"attention_mask": mask}


_wav2vec2 = Arch(
    name="wav2vec2",
    family="audio",
    # The "stable layer norm" variant (pre-norm, LayerNorm in the feature encoder), the one that takes an
    # attention mask. SpecAugment off: it masks random frames in train mode (and adds a parameter).
    build=_model(
        hf.Wav2Vec2Model,
        hf.Wav2Vec2Config(
            hidden_size=HIDDEN,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            conv_dim=(16, 16),
            conv_kernel=(10, 3),
            conv_stride=(5, 2),
            num_feat_extract_layers=2,
            num_conv_pos_embeddings=8,
            num_conv_pos_embedding_groups=4,
            feat_extract_norm="layer",
            do_stable_layer_norm=True,
            apply_spec_augment=False,
            mask_time_prob=0.0,
        ),
    ),
    inputs=_wav2vec2_inputs,
    stream=[(1, 5), (2, 9), (3, 1), (4, 16), (3, 23)],
    output=_last_hidden,
)

ARCHS: dict[str, Arch] = {
    arch.name: arch
    for arch in [
        _bert,
        _roberta,
        _deberta_v2,
        _gpt2,
        _llama,
        _mistral,
        _qwen2,
        _bloom,
        _t5,
        _bart,
        _vit,
        _swin,
        _convnext,
        _mobilenet_v2,
        _segformer,
        _wav2vec2,
    ]
}


# --------------------------------------------------------------------------- eager self-check


def run(model: torch.nn.Module, arch: Arch, batch: int, length: int, seed: int = 0) -> list[torch.Tensor]:
    args, kwargs = arch.inputs(batch, length, seed)
    return arch.output(model(*args, **kwargs))


def weighted_sum(outputs: list[torch.Tensor], seed: int = 1234) -> torch.Tensor:
    """A scalar loss: each output times a fixed random tensor of its shape, summed."""
    gen = _gen(seed)
    return sum((out * torch.randn(out.shape, generator=gen)).sum() for out in outputs)


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


@dataclass
class Report:
    name: str
    params: int
    forward_ms: float
    largest: tuple[int, int]
    attention: str
    no_grad_params: list[str]
    shapes: list[list[tuple[int, ...]]]


def check(arch: Arch, timing_runs: int = 5) -> Report:
    """Build ``arch`` twice and check, in eager: identical weights; every stream shape runs, and gives the
    same outputs twice and for a rebuilt model; train mode (no dropout left) matches eval except around
    BatchNorm; backward through the weighted sum of the outputs works."""
    model = arch.build()
    again = arch.build()
    assert all(torch.equal(p, q) for p, q in zip(model.state_dict().values(), again.state_dict().values())), arch.name
    has_batch_norm = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())

    shapes = []
    with torch.no_grad():
        for batch, length in arch.stream:
            first = run(model, arch, batch, length)
            assert _same(first, run(model, arch, batch, length)), (arch.name, batch, length, "not repeatable")
            assert _same(first, run(again, arch, batch, length)), (arch.name, batch, length, "differs after rebuild")
            assert all(t.is_floating_point() and t.shape[0] == batch for t in first), (arch.name, "outputs")
            assert all(torch.isfinite(t).all() for t in first), (arch.name, batch, length, "not finite")
            shapes.append([tuple(t.shape) for t in first])

    # Train mode on a fresh model (BatchNorm updates its running statistics in train mode). Gradients
    # accumulate over the stream: a parameter left without one is unused at every shape.
    trained = arch.build().train()
    for batch, length in arch.stream:
        outputs = run(trained, arch, batch, length)
        # Compared with grad enabled on both sides: where the attention bias requires grad (T5, Swin),
        # SDPA takes another kernel than under no_grad (~1e-6 apart), so only same-mode runs are equal.
        assert _same(outputs, run(trained, arch, batch, length)), (arch.name, batch, length, "train not repeatable")
        if not has_batch_norm:
            with torch.no_grad():
                evaluated = run(model, arch, batch, length)
            assert all(torch.allclose(t, e, rtol=1e-5, atol=1e-5) for t, e in zip(outputs, evaluated)), (
                arch.name,
                batch,
                length,
                "train differs from eval",
            )
        weighted_sum(outputs).backward()
    no_grad = [name for name, p in trained.named_parameters() if p.requires_grad and p.grad is None]

    largest = max(arch.stream, key=lambda s: s[0] * s[1] ** (2 if arch.family == "vision" else 1))
    args, kwargs = arch.inputs(*largest, 0)
    times = []
    with torch.no_grad():
        model(*args, **kwargs)
        for _ in range(timing_runs):
            start = time.perf_counter()
            model(*args, **kwargs)
            times.append(time.perf_counter() - start)
    return Report(
        name=arch.name,
        params=sum(p.numel() for p in model.parameters()),
        forward_ms=1e3 * sorted(times)[len(times) // 2],
        largest=largest,
        attention=str(getattr(model.config, "_attn_implementation", None)),
        no_grad_params=no_grad,
        shapes=shapes,
    )


def main() -> None:
    torch.set_num_threads(1)
    print(f"{'name':14} {'family':16} {'params':>8} {'fwd ms':>7}  {'at':9} {'attention':9} no-grad params")
    for arch in ARCHS.values():
        r = check(arch)
        print(
            f"{r.name:14} {arch.family:16} {r.params:8d} {r.forward_ms:7.2f}  {str(r.largest):9} "
            f"{r.attention:9} {', '.join(r.no_grad_params) or '-'}"
        )


if __name__ == "__main__":
    main()
