"""Hugging Face models as the GPU benchmark runs them (random weights, built from configs).

- ``hf_bert``: ``transformers.BertModel`` (BERT-base's config, or a tiny one) called on
  (ids, mask), returning the last hidden state: the serving stream's model.
- ``llama``: ``transformers.LlamaForCausalLM`` with grouped-query attention and rotary
  positions (4 layers at a 1B model's width, or a tiny one), and ``DecodeStep``, one
  generation step on tensors: (new ids, mask, *past keys and values) -> (last logits, *grown
  keys and values). Prefill is the step with an empty past; each decode step feeds the grown
  cache back, so the cache's length is a dynamic dim like the batch. Every system of the
  benchmark runs the same step, so they compute the same thing: the cache grows by
  concatenation, as ``DynamicCache`` (``generate``'s default) grows it in eager.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn


class LastHidden(nn.Module):
    """A Hugging Face encoder called on (ids, mask), returning the last hidden state."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def hf_bert(tiny: bool = False, seed: int = 0) -> LastHidden:
    """BERT-base (12 layers, hidden 768, 12 heads), or 2 layers of hidden 64 with ``tiny``."""
    import transformers as hf

    size = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128) if tiny else {}
    torch.manual_seed(seed)
    config = hf.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **size)
    return LastHidden(hf.BertModel(config, add_pooling_layer=False)).eval()


def bert_inputs(batch: int, seq: int, seed: int, vocab: int = 30522) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and a padding mask: the last row is padded to 3/4 of the length (at least 1 token)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[-1, max(1, (3 * seq) // 4) :] = 0
    return ids, mask


def llama(tiny: bool = False, seed: int = 0) -> nn.Module:
    """A Llama-style decoder: 4 layers at Llama-3.2-1B's width (hidden 2048, MLP 8192, 32 query
    heads over 8 key/value heads, head dim 64, rotary), vocabulary 32000; or 2 layers of hidden
    64 (4 query heads over 2 key/value heads) with ``tiny``."""
    import transformers as hf

    if tiny:
        size = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    else:
        size = dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=8)
    torch.manual_seed(seed)
    config = hf.LlamaConfig(max_position_embeddings=4096, rope_theta=500000.0, **size)
    return hf.LlamaForCausalLM(config).eval()


class DecodeStep(nn.Module):
    """One step of a causal LM on tensors: (new ids, mask over past + new, *past) -> (logits of
    the last position, *grown past), ``past`` being each layer's keys then values,
    [batch, kv heads, cached, head dim]. An empty past (``cached`` 0) is the prefill."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        params = inspect.signature(model.forward).parameters
        # transformers renamed past_key_values to cache (5.2x); the GPU machine's may be older.
        self.cache_arg = "cache" if "cache" in params else "past_key_values"

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        import transformers as hf

        cache = hf.DynamicCache()
        for layer in range(len(past) // 2):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, logits_to_keep=1, **{self.cache_arg: cache})
        # The model grew the cache in place.
        return (out.logits, *[t for layer in cache.layers for t in (layer.keys, layer.values)])


def empty_past(model: nn.Module, batch: int, dtype: torch.dtype, device: str | torch.device) -> list[torch.Tensor]:
    """Every layer's keys and values with nothing cached: the prefill's past."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    shape = (batch, c.num_key_value_heads, 0, head_dim)
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(2 * c.num_hidden_layers)]


# The dims that vary over a generation: the batch, the new tokens, the mask's total length, the cache's length.
DECODE_DYNAMIC = {"input_ids": {0: "batch", 1: "new"}, "attention_mask": {0: "batch", 1: "total"}, "past": {0: "batch", 2: "cached"}}
