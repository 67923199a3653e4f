"""The built-in model zoo: small, deterministic models of the common families.

Every family has an entry in ``MODELS`` (see ``ModelEntry``) that says how to
build the model, how to make inputs for a given set of dynamic dims, which
input axes are dynamic (and under which dim name), and a default list of test
shapes including 1-sized dims. Models are built in eval mode with weights
drawn from a fixed seed, so two builds give the same outputs.

    entry = MODELS["bert"]
    model = entry.factory()
    for shape in entry.shapes:                    # e.g. {"batch": 2, "seq": 16}
        out = model(*entry.example_inputs(**shape))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

from disc.models.bert import BertConfig, BertModel, bert_base, bert_small, bert_tiny
from disc.models.gpt2 import GPT2Config, GPT2LMHeadModel, gpt2_base, gpt2_small, gpt2_tiny
from disc.models.llama import LlamaConfig, LlamaForCausalLM, llama_small, llama_tiny
from disc.models.resnet import ResNet, ResNetConfig, resnet18, resnet_small, resnet_tiny
from disc.models.t5 import T5Config, T5EncoderModel, T5ForConditionalGeneration, t5_encoder_small, t5_encoder_tiny, t5_small, t5_tiny
from disc.models.vit import VisionTransformer, ViTConfig, vit_small, vit_tiny

Shape = Mapping[str, int]


@dataclass(frozen=True, eq=False)  # compared and hashed by identity
class ModelEntry:
    """How to build, feed and vary one model family.

    ``shapes``, ``dim_ranges``, ``dim_multiples`` and ``export_shape`` describe
    the default ``factory`` (the tiny configuration); the other ``variants``
    take the same inputs but may accept other ranges (e.g. more positions).
    """

    name: str
    factory: Callable[..., nn.Module]  # factory(seed=0) -> model in eval mode
    variants: Mapping[str, Callable[..., nn.Module]]  # size name -> factory; includes "tiny"
    example_inputs: Callable[..., tuple]  # example_inputs(**dims, seed=0) -> positional forward args
    arg_names: tuple[str, ...]  # names of the forward arguments example_inputs produces, in order
    dims: tuple[str, ...]  # names of the dynamic dims
    dynamic: Mapping[str, Mapping[int, str]]  # forward arg name -> {axis: dim name}
    shapes: tuple[Shape, ...]  # default test shapes: dim name -> size
    export_shape: Shape  # a shape with no 1-sized dim, to trace with
    dim_ranges: Mapping[str, tuple[int, int | None]] = field(default_factory=dict)  # dim -> (min, max or None)
    dim_multiples: Mapping[str, int] = field(default_factory=dict)  # dim -> required divisor
    # torch.export's conv meta-kernel guards every intermediate spatial size to be != 1, which
    # contradicts dims that may be 1 (or shrink to one patch). Tracing with
    # ``backed_size_oblivious`` avoids those guards; it is only set where it is needed, because
    # for the attention models it has the opposite effect (it adds seq != 1 guards).
    size_oblivious_export: bool = False
    description: str = ""

    def build(self, variant: str | None = None, seed: int = 0) -> nn.Module:
        return (self.factory if variant is None else self.variants[variant])(seed=seed)

    def inputs(self, shape: Shape, seed: int = 0) -> tuple:
        return self.example_inputs(**shape, seed=seed)

    def dim_range(self, dim: str) -> tuple[int, int | None]:
        return self.dim_ranges.get(dim, (1, None))

    def accepts(self, shape: Shape) -> bool:
        """Whether ``shape`` lies within the declared ranges and multiples."""
        for dim in self.dims:
            lo, hi = self.dim_range(dim)
            size = shape[dim]
            if size < lo or (hi is not None and size > hi) or size % self.dim_multiples.get(dim, 1):
                return False
        return True

    def export_dynamic_shapes(self) -> dict[str, dict[int, object]]:
        """``dynamic`` as ``torch.export`` wants it: one shared ``torch.export.Dim`` per dim name."""
        from torch.export import Dim

        made: dict[str, object] = {}
        for dim in self.dims:
            lo, hi = self.dim_range(dim)
            kwargs = {"min": lo} if hi is None else {"min": lo, "max": hi}
            made[dim] = Dim(dim, **kwargs)
        return {arg: {axis: made[dim] for axis, dim in axes.items()} for arg, axes in self.dynamic.items()}

    def export(self, model: nn.Module | None = None, shape: Shape | None = None, seed: int = 0):
        """``torch.export.export`` of ``model`` (default: ``factory()``) with every dim declared dynamic."""
        from torch.fx.experimental import _config as fx_config

        model = self.factory() if model is None else model
        args = self.inputs(self.export_shape if shape is None else shape, seed=seed)
        ctx = fx_config.patch(backed_size_oblivious=True) if self.size_oblivious_export else nullcontext()
        with ctx:
            return torch.export.export(model, args, dynamic_shapes=self.export_dynamic_shapes())


# --------------------------------------------------------------------------- inputs


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _token_ids(g: torch.Generator, vocab_size: int, batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (batch, seq), generator=g, dtype=torch.long)


def _padding_mask(g: torch.Generator, batch: int, seq: int) -> torch.Tensor:
    """1/0 mask with per-sample lengths in [ceil(seq/2), seq]; sample 0 is always padded when seq > 1."""
    lengths = torch.randint((seq + 1) // 2, seq + 1, (batch,), generator=g)
    if seq > 1:
        lengths[0] = min(int(lengths[0]), seq - 1)
    return (torch.arange(seq)[None, :] < lengths[:, None]).to(torch.long)


def _text_inputs(vocab_size: int, with_mask: bool) -> Callable[..., tuple]:
    def example_inputs(batch: int = 2, seq: int = 16, seed: int = 0) -> tuple:
        g = _generator(seed)
        ids = _token_ids(g, vocab_size, batch, seq)
        return (ids, _padding_mask(g, batch, seq)) if with_mask else (ids,)

    return example_inputs


def _seq2seq_inputs(vocab_size: int) -> Callable[..., tuple]:
    def example_inputs(batch: int = 2, seq: int = 16, dec_seq: int = 8, seed: int = 0) -> tuple:
        g = _generator(seed)
        ids = _token_ids(g, vocab_size, batch, seq)
        mask = _padding_mask(g, batch, seq)
        return ids, mask, _token_ids(g, vocab_size, batch, dec_seq)

    return example_inputs


def _image_inputs(channels: int) -> Callable[..., tuple]:
    def example_inputs(batch: int = 2, height: int = 32, width: int = 32, seed: int = 0) -> tuple:
        g = _generator(seed)
        return (torch.randn(batch, channels, height, width, generator=g),)

    return example_inputs


def _grid(dims: tuple[str, ...], rows: list[tuple[int, ...]]) -> tuple[Shape, ...]:
    return tuple(dict(zip(dims, row)) for row in rows)


# --------------------------------------------------------------------------- registry

_VOCAB = 1000
_TEXT_DIMS = ("batch", "seq")
_TEXT_DYNAMIC = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
_IMAGE_DIMS = ("batch", "height", "width")
_IMAGE_DYNAMIC = {"pixel_values": {0: "batch", 2: "height", 3: "width"}}

MODELS: dict[str, ModelEntry] = {}


def register(entry: ModelEntry) -> ModelEntry:
    if entry.name in MODELS:
        raise ValueError(f"model {entry.name!r} is already registered")
    MODELS[entry.name] = entry
    return entry


register(
    ModelEntry(
        name="bert",
        factory=bert_tiny,
        variants={"tiny": bert_tiny, "small": bert_small, "base": bert_base},
        example_inputs=_text_inputs(_VOCAB, with_mask=True),
        arg_names=("input_ids", "attention_mask"),
        dims=_TEXT_DIMS,
        dynamic=_TEXT_DYNAMIC,
        shapes=_grid(
            _TEXT_DIMS,
            [(1, 1), (1, 7), (2, 1), (2, 16), (3, 33), (4, 64), (1, 128), (8, 5), (5, 100), (2, 512), (7, 13)],
        ),
        export_shape={"batch": 3, "seq": 17},
        dim_ranges={"seq": (1, 512)},
        description="BERT encoder: (input_ids, attention_mask) -> (last_hidden_state, pooled_output)",
    )
)

register(
    ModelEntry(
        name="gpt2",
        factory=gpt2_tiny,
        variants={"tiny": gpt2_tiny, "small": gpt2_small, "base": gpt2_base},
        example_inputs=_text_inputs(_VOCAB, with_mask=False),
        arg_names=("input_ids",),
        dims=_TEXT_DIMS,
        dynamic={"input_ids": {0: "batch", 1: "seq"}},
        shapes=_grid(
            _TEXT_DIMS,
            [(1, 1), (1, 9), (2, 1), (2, 16), (3, 31), (4, 64), (1, 256), (8, 7), (5, 100), (2, 128), (6, 3)],
        ),
        export_shape={"batch": 3, "seq": 17},
        dim_ranges={"seq": (1, 256)},
        description="GPT-2 causal LM: (input_ids) -> logits",
    )
)

register(
    ModelEntry(
        name="t5",
        factory=t5_tiny,
        variants={"tiny": t5_tiny, "small": t5_small},
        example_inputs=_seq2seq_inputs(_VOCAB),
        arg_names=("input_ids", "attention_mask", "decoder_input_ids"),
        dims=("batch", "seq", "dec_seq"),
        dynamic={
            "input_ids": {0: "batch", 1: "seq"},
            "attention_mask": {0: "batch", 1: "seq"},
            "decoder_input_ids": {0: "batch", 1: "dec_seq"},
        },
        shapes=_grid(
            ("batch", "seq", "dec_seq"),
            [
                (1, 1, 1),
                (1, 8, 1),
                (2, 1, 5),
                (2, 16, 16),
                (3, 33, 7),
                (4, 64, 32),
                (1, 128, 1),
                (8, 5, 9),
                (5, 100, 20),
                (2, 200, 64),
                (6, 3, 3),
            ],
        ),
        export_shape={"batch": 3, "seq": 17, "dec_seq": 9},
        description="T5 encoder-decoder (teacher-forced): (input_ids, attention_mask, decoder_input_ids) -> logits",
    )
)

register(
    ModelEntry(
        name="t5_encoder",
        factory=t5_encoder_tiny,
        variants={"tiny": t5_encoder_tiny, "small": t5_encoder_small},
        example_inputs=_text_inputs(_VOCAB, with_mask=True),
        arg_names=("input_ids", "attention_mask"),
        dims=_TEXT_DIMS,
        dynamic=_TEXT_DYNAMIC,
        shapes=_grid(
            _TEXT_DIMS,
            [(1, 1), (1, 7), (2, 1), (2, 16), (3, 33), (4, 64), (1, 128), (8, 5), (5, 100), (2, 300), (7, 13)],
        ),
        export_shape={"batch": 3, "seq": 17},
        description="T5 encoder: (input_ids, attention_mask) -> last_hidden_state",
    )
)

register(
    ModelEntry(
        name="llama",
        factory=llama_tiny,
        variants={"tiny": llama_tiny, "small": llama_small},
        example_inputs=_text_inputs(_VOCAB, with_mask=False),
        arg_names=("input_ids",),
        dims=_TEXT_DIMS,
        dynamic={"input_ids": {0: "batch", 1: "seq"}},
        shapes=_grid(
            _TEXT_DIMS,
            [(1, 1), (1, 9), (2, 1), (2, 16), (3, 31), (4, 64), (1, 256), (8, 7), (5, 100), (2, 512), (6, 3)],
        ),
        export_shape={"batch": 3, "seq": 17},
        dim_ranges={"seq": (1, 2048)},
        description="Llama causal LM (RoPE, GQA, SwiGLU): (input_ids) -> logits",
    )
)

register(
    ModelEntry(
        name="vit",
        factory=vit_tiny,
        variants={"tiny": vit_tiny, "small": vit_small},
        example_inputs=_image_inputs(3),
        arg_names=("pixel_values",),
        dims=_IMAGE_DIMS,
        dynamic=_IMAGE_DYNAMIC,
        shapes=_grid(
            _IMAGE_DIMS,
            [
                (1, 8, 8),
                (2, 8, 8),
                (1, 16, 32),
                (3, 24, 40),
                (2, 32, 32),
                (1, 64, 8),
                (4, 56, 72),
                (2, 128, 128),
                (5, 40, 16),
                (1, 8, 128),
                (8, 32, 24),
            ],
        ),
        export_shape={"batch": 3, "height": 32, "width": 48},
        # vit_tiny: patch 8, position table for 16 x 16 patches. The ranges bound
        # each side; the product (H/8) * (W/8) must also stay <= 256.
        dim_ranges={"height": (8, 128), "width": (8, 128)},
        dim_multiples={"height": 8, "width": 8},
        size_oblivious_export=True,
        description="ViT classifier: (pixel_values) -> logits; sides multiples of the patch size",
    )
)

register(
    ModelEntry(
        name="resnet",
        factory=resnet_tiny,
        variants={"tiny": resnet_tiny, "small": resnet_small, "18": resnet18},
        example_inputs=_image_inputs(3),
        arg_names=("pixel_values",),
        dims=_IMAGE_DIMS,
        dynamic=_IMAGE_DYNAMIC,
        shapes=_grid(
            _IMAGE_DIMS,
            [
                (1, 1, 1),
                (1, 33, 47),
                (2, 32, 32),
                (3, 1, 1),
                (1, 7, 9),
                (4, 64, 64),
                (2, 224, 224),
                (5, 17, 3),
                (1, 100, 1),
                (8, 16, 16),
                (2, 96, 128),
            ],
        ),
        export_shape={"batch": 3, "height": 33, "width": 47},
        size_oblivious_export=True,
        description="ResNet CNN with basic blocks: (pixel_values) -> logits; any H, W >= 1",
    )
)


def get(name: str) -> ModelEntry:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None


def names() -> list[str]:
    return sorted(MODELS)


__all__ = [
    "MODELS",
    "BertConfig",
    "BertModel",
    "GPT2Config",
    "GPT2LMHeadModel",
    "LlamaConfig",
    "LlamaForCausalLM",
    "ModelEntry",
    "ResNet",
    "ResNetConfig",
    "T5Config",
    "T5EncoderModel",
    "T5ForConditionalGeneration",
    "ViTConfig",
    "VisionTransformer",
    "bert_base",
    "bert_small",
    "bert_tiny",
    "get",
    "gpt2_base",
    "gpt2_small",
    "gpt2_tiny",
    "llama_small",
    "llama_tiny",
    "names",
    "register",
    "resnet18",
    "resnet_small",
    "resnet_tiny",
    "t5_encoder_small",
    "t5_encoder_tiny",
    "t5_small",
    "t5_tiny",
    "vit_small",
    "vit_tiny",
]
