"""A T5-style encoder and encoder-decoder.

T5 specifics kept here: the scale-only RMS LayerNorm, relative position
biases (log-spaced buckets, computed in forward from the actual lengths,
shared by every layer of a stack), unscaled attention scores, a ReLU
feed-forward network, pre-norm residual blocks, a shared embedding, and
cross-attention in the decoder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from disc.models.seeded import build_seeded


@dataclass(frozen=True)
class T5Config:
    vocab_size: int = 1000
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_heads: int = 8
    num_layers: int = 6
    num_decoder_layers: int | None = None  # defaults to num_layers
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    dropout: float = 0.1


class T5LayerNorm(nn.Module):
    """Root-mean-square normalisation with a learned scale and no bias or mean subtraction."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(self.weight.dtype)


def relative_position_bucket(relative_position: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Map signed key-minus-query offsets to bucket ids.

    Half the buckets hold exact small offsets; the rest cover offsets up to
    ``max_distance`` on a log scale. Bidirectional attention splits the
    buckets between negative and positive offsets.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))

    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    large = max_exact + (
        torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, relative_position, large)


class T5Attention(nn.Module):
    def __init__(self, config: T5Config, has_relative_attention_bias: bool, is_decoder: bool) -> None:
        super().__init__()
        self.is_decoder = is_decoder
        self.has_relative_attention_bias = has_relative_attention_bias
        self.num_buckets = config.relative_attention_num_buckets
        self.max_distance = config.relative_attention_max_distance
        self.n_heads = config.num_heads
        self.key_value_proj_dim = config.d_kv
        self.inner_dim = config.num_heads * config.d_kv
        self.q = nn.Linear(config.d_model, self.inner_dim, bias=False)
        self.k = nn.Linear(config.d_model, self.inner_dim, bias=False)
        self.v = nn.Linear(config.d_model, self.inner_dim, bias=False)
        self.o = nn.Linear(self.inner_dim, config.d_model, bias=False)
        self.dropout = nn.Dropout(config.dropout)
        if has_relative_attention_bias:
            self.relative_attention_bias = nn.Embedding(self.num_buckets, self.n_heads)

    def compute_bias(self, query_length: int, key_length: int, device: torch.device) -> torch.Tensor:
        """Relative position bias ``[1, heads, query_length, key_length]``."""
        context_position = torch.arange(query_length, dtype=torch.long, device=device)[:, None]
        memory_position = torch.arange(key_length, dtype=torch.long, device=device)[None, :]
        relative_position = memory_position - context_position
        bucket = relative_position_bucket(
            relative_position,
            bidirectional=not self.is_decoder,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )
        values = self.relative_attention_bias(bucket)  # [q, k, heads]
        return values.permute(2, 0, 1).unsqueeze(0)

    def _shape(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], -1, self.n_heads, self.key_value_proj_dim).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        mask: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        position_bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``mask`` is additive and broadcastable to ``[batch, heads, q, k]``.

        Returns the attention output and the position bias (mask included), so
        later layers of the stack can reuse it.
        """
        batch, query_length = hidden_states.shape[:2]
        source = hidden_states if key_value_states is None else key_value_states
        key_length = source.shape[1]

        query = self._shape(self.q(hidden_states))
        key = self._shape(self.k(source))
        value = self._shape(self.v(source))

        # T5 folds the 1/sqrt(d) scale into the initialisation, so scores are not scaled
        scores = torch.matmul(query, key.transpose(3, 2))

        if position_bias is None:
            if self.has_relative_attention_bias:
                position_bias = self.compute_bias(query_length, key_length, scores.device)
            else:
                position_bias = torch.zeros((1, self.n_heads, query_length, key_length), device=scores.device, dtype=scores.dtype)
            position_bias = position_bias + mask

        scores = scores + position_bias
        probs = F.softmax(scores.float(), dim=-1).type_as(scores)
        probs = self.dropout(probs)

        out = torch.matmul(probs, value).transpose(1, 2).reshape(batch, -1, self.inner_dim)
        return self.o(out), position_bias


class T5SelfAttentionLayer(nn.Module):
    def __init__(self, config: T5Config, has_relative_attention_bias: bool, is_decoder: bool) -> None:
        super().__init__()
        self.attention = T5Attention(config, has_relative_attention_bias, is_decoder)
        self.layer_norm = T5LayerNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self, hidden_states: torch.Tensor, mask: torch.Tensor, position_bias: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, position_bias = self.attention(self.layer_norm(hidden_states), mask, position_bias=position_bias)
        return hidden_states + self.dropout(out), position_bias


class T5CrossAttentionLayer(nn.Module):
    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.attention = T5Attention(config, has_relative_attention_bias=False, is_decoder=True)
        self.layer_norm = T5LayerNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        mask: torch.Tensor,
        position_bias: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, position_bias = self.attention(
            self.layer_norm(hidden_states), mask, key_value_states=encoder_hidden_states, position_bias=position_bias
        )
        return hidden_states + self.dropout(out), position_bias


class T5FeedForward(nn.Module):
    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.wi = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wo = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.layer_norm = T5LayerNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.wi(self.layer_norm(hidden_states)))
        x = self.wo(self.dropout(x))
        return hidden_states + self.dropout(x)


class T5Block(nn.Module):
    def __init__(self, config: T5Config, has_relative_attention_bias: bool, is_decoder: bool) -> None:
        super().__init__()
        self.is_decoder = is_decoder
        self.self_attention = T5SelfAttentionLayer(config, has_relative_attention_bias, is_decoder)
        self.cross_attention = T5CrossAttentionLayer(config) if is_decoder else None
        self.feed_forward = T5FeedForward(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        mask: torch.Tensor,
        position_bias: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_mask: torch.Tensor | None = None,
        encoder_decoder_position_bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        hidden_states, position_bias = self.self_attention(hidden_states, mask, position_bias)
        if self.cross_attention is not None:
            hidden_states, encoder_decoder_position_bias = self.cross_attention(
                hidden_states, encoder_hidden_states, encoder_mask, encoder_decoder_position_bias
            )
        return self.feed_forward(hidden_states), position_bias, encoder_decoder_position_bias


def invert_attention_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[batch, key] 1/0 mask -> additive [batch, 1, 1, key] mask."""
    return (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


class T5Stack(nn.Module):
    def __init__(self, config: T5Config, embed_tokens: nn.Embedding, is_decoder: bool) -> None:
        super().__init__()
        self.is_decoder = is_decoder
        self.embed_tokens = embed_tokens
        num_layers = config.num_decoder_layers if is_decoder and config.num_decoder_layers is not None else config.num_layers
        # only the first layer owns the relative position table; the bias it produces is shared
        self.block = nn.ModuleList(T5Block(config, has_relative_attention_bias=(i == 0), is_decoder=is_decoder) for i in range(num_layers))
        self.final_layer_norm = T5LayerNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch, seq_len = input_ids.shape
        hidden_states = self.dropout(self.embed_tokens(input_ids))
        dtype = hidden_states.dtype

        if attention_mask is None:
            attention_mask = torch.ones(batch, seq_len, dtype=torch.long, device=input_ids.device)
        if self.is_decoder:
            positions = torch.arange(seq_len, device=input_ids.device)
            causal = positions[None, :] <= positions[:, None]  # [q, k]
            combined = causal[None, None, :, :] & attention_mask[:, None, None, :].bool()
            mask = (1.0 - combined.to(dtype)) * torch.finfo(dtype).min
        else:
            mask = invert_attention_mask(attention_mask, dtype)

        encoder_mask = None
        if encoder_hidden_states is not None:
            if encoder_attention_mask is None:
                encoder_attention_mask = torch.ones(encoder_hidden_states.shape[:2], dtype=torch.long, device=encoder_hidden_states.device)
            encoder_mask = invert_attention_mask(encoder_attention_mask, dtype)

        position_bias = None
        encoder_decoder_position_bias = None
        for layer in self.block:
            hidden_states, position_bias, encoder_decoder_position_bias = layer(
                hidden_states,
                mask,
                position_bias=position_bias,
                encoder_hidden_states=encoder_hidden_states,
                encoder_mask=encoder_mask,
                encoder_decoder_position_bias=encoder_decoder_position_bias,
            )
        return self.dropout(self.final_layer_norm(hidden_states))


class T5EncoderModel(nn.Module):
    """``forward(input_ids, attention_mask) -> last_hidden_state [batch, seq, d_model]``."""

    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.config = config
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = T5Stack(config, self.shared, is_decoder=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.encoder(input_ids, attention_mask)


class T5ForConditionalGeneration(nn.Module):
    """``forward(input_ids, attention_mask, decoder_input_ids) -> logits [batch, dec_seq, vocab]``.

    Teacher-forced: the whole decoder sequence is run at once (no KV cache).
    """

    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.config = config
        self.model_dim = config.d_model
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = T5Stack(config, self.shared, is_decoder=False)
        self.decoder = T5Stack(config, self.shared, is_decoder=True)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        decoder_input_ids: torch.Tensor,
    ) -> torch.Tensor:
        encoder_hidden_states = self.encoder(input_ids, attention_mask)
        hidden_states = self.decoder(
            decoder_input_ids,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=attention_mask,
        )
        # the tied LM head rescales the decoder output before projecting onto the embedding
        hidden_states = hidden_states * (self.model_dim**-0.5)
        return F.linear(hidden_states, self.shared.weight)


def _build(cls, config: T5Config, seed: int):
    return build_seeded(cls, config, seed)


_TINY = T5Config(d_model=64, d_kv=16, d_ff=128, num_heads=4, num_layers=2)
_SMALL = T5Config(d_model=256, d_kv=32, d_ff=1024, num_heads=8, num_layers=4)


def t5_tiny(seed: int = 0) -> T5ForConditionalGeneration:
    return _build(T5ForConditionalGeneration, _TINY, seed)


def t5_small(seed: int = 0) -> T5ForConditionalGeneration:
    return _build(T5ForConditionalGeneration, _SMALL, seed)


def t5_encoder_tiny(seed: int = 0) -> T5EncoderModel:
    return _build(T5EncoderModel, _TINY, seed)


def t5_encoder_small(seed: int = 0) -> T5EncoderModel:
    return _build(T5EncoderModel, _SMALL, seed)
