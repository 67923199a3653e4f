"""A GPT-2-style causal language model.

Pre-LN transformer blocks with a fused q/k/v projection, a causal mask built
for the actual sequence length, the tanh approximation of GELU ("gelu_new"),
a final LayerNorm and an LM head tied to the token embedding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from disc.models.seeded import build_seeded


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 1000
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None  # defaults to 4 * n_embd
    layer_norm_eps: float = 1e-5
    dropout: float = 0.1


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        if config.n_embd % config.n_head != 0:
            raise ValueError(f"n_embd {config.n_embd} is not a multiple of {config.n_head} heads")
        self.embed_dim = config.n_embd
        self.num_heads = config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        new_shape = x.shape[:-1] + (self.num_heads, self.head_dim)
        return x.view(new_shape).permute(0, 2, 1, 3)

    def _merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 1, 3).contiguous()
        return x.view(x.shape[:-2] + (self.embed_dim,))

    def forward(self, hidden_states: torch.Tensor, causal_mask: torch.Tensor) -> torch.Tensor:
        query, key, value = self.c_attn(hidden_states).split(self.embed_dim, dim=2)
        query = self._split_heads(query)
        key = self._split_heads(key)
        value = self._split_heads(value)

        scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(self.head_dim)
        mask_value = torch.finfo(scores.dtype).min
        scores = scores.masked_fill(~causal_mask, mask_value)
        probs = F.softmax(scores, dim=-1)
        probs = self.attn_dropout(probs)

        out = self._merge_heads(torch.matmul(probs, value))
        return self.resid_dropout(self.c_proj(out))


class GPT2MLP(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        inner = config.n_inner if config.n_inner is not None else 4 * config.n_embd
        self.c_fc = nn.Linear(config.n_embd, inner)
        self.c_proj = nn.Linear(inner, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(gelu_new(self.c_fc(hidden_states))))


class GPT2Block(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps)
        self.attn = GPT2Attention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps)
        self.mlp = GPT2MLP(config)

    def forward(self, hidden_states: torch.Tensor, causal_mask: torch.Tensor) -> torch.Tensor:
        hidden_states = hidden_states + self.attn(self.ln_1(hidden_states), causal_mask)
        return hidden_states + self.mlp(self.ln_2(hidden_states))


class GPT2LMHeadModel(nn.Module):
    """``forward(input_ids) -> logits [batch, seq, vocab]``."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(GPT2Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq_len = input_ids.shape[-1]
        position_ids = torch.arange(seq_len, dtype=torch.long, device=input_ids.device).unsqueeze(0)
        hidden_states = self.drop(self.wte(input_ids) + self.wpe(position_ids))

        # [seq, seq] lower-triangular "may attend" mask, broadcast over batch and heads
        causal_mask = torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool, device=input_ids.device))
        causal_mask = causal_mask[None, None, :, :]
        for block in self.h:
            hidden_states = block(hidden_states, causal_mask)
        hidden_states = self.ln_f(hidden_states)
        return hidden_states @ self.wte.weight.T


def gpt2(config: GPT2Config, seed: int = 0) -> GPT2LMHeadModel:
    return build_seeded(GPT2LMHeadModel, config, seed)


def gpt2_tiny(seed: int = 0) -> GPT2LMHeadModel:
    return gpt2(GPT2Config(n_positions=256, n_embd=64, n_layer=2, n_head=4), seed)


def gpt2_small(seed: int = 0) -> GPT2LMHeadModel:
    return gpt2(GPT2Config(n_positions=1024, n_embd=256, n_layer=4, n_head=4), seed)


def gpt2_base(seed: int = 0) -> GPT2LMHeadModel:
    return gpt2(GPT2Config(n_positions=1024, n_embd=768, n_layer=12, n_head=12), seed)
