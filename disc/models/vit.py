"""A ViT-style image classifier.

Non-overlapping patches from a strided Conv2d, a prepended class token, a
learned position embedding sized for the largest supported image and sliced
to the actual token count (so any image whose sides are multiples of the
patch size works, without interpolation), pre-LN encoder blocks and a linear
head on the class token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from disc.models.seeded import build_seeded


@dataclass(frozen=True)
class ViTConfig:
    image_size: int = 224  # the largest side supported; sets the position table size
    patch_size: int = 16
    num_channels: int = 3
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    num_classes: int = 1000
    layer_norm_eps: float = 1e-6
    dropout: float = 0.0

    @property
    def max_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


class PatchEmbed(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.proj = nn.Conv2d(config.num_channels, config.hidden_size, kernel_size=config.patch_size, stride=config.patch_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        # [batch, C, H, W] -> [batch, hidden, H/p, W/p] -> [batch, num_patches, hidden]
        return self.proj(pixel_values).flatten(2).transpose(1, 2)


class ViTAttention(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        if config.hidden_size % config.num_heads != 0:
            raise ValueError("hidden_size must be a multiple of num_heads")
        self.num_heads = config.num_heads
        self.head_dim = config.hidden_size // config.num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.attn_drop = nn.Dropout(config.dropout)
        self.proj_drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, channels = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each [batch, heads, tokens, head_dim]

        attn = (q * self.scale) @ k.transpose(-2, -1)
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)

        x = (attn @ v).transpose(1, 2).reshape(batch, tokens, channels)
        return self.proj_drop(self.proj(x))


class ViTMLP(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        hidden = int(config.hidden_size * config.mlp_ratio)
        self.fc1 = nn.Linear(config.hidden_size, hidden)
        self.fc2 = nn.Linear(hidden, config.hidden_size)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(F.gelu(self.fc1(x)))))


class ViTBlock(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attn = ViTAttention(config)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = ViTMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """``forward(pixel_values [batch, C, H, W]) -> logits [batch, num_classes]``.

    H and W must be multiples of the patch size with (H/p) * (W/p) no larger
    than ``config.max_patches``.
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbed(config)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size))
        self.pos_embed = nn.Parameter(torch.zeros(1, config.max_patches + 1, config.hidden_size))
        self.pos_drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(ViTBlock(config) for _ in range(config.num_layers))
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.head = nn.Linear(config.hidden_size, config.num_classes)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(pixel_values)
        batch, num_patches, _ = x.shape
        cls_tokens = self.cls_token.expand(batch, -1, -1)
        x = torch.cat((cls_tokens, x), dim=1)
        x = self.pos_drop(x + self.pos_embed[:, : num_patches + 1])
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        return self.head(x[:, 0])


def vit(config: ViTConfig, seed: int = 0) -> VisionTransformer:
    return build_seeded(VisionTransformer, config, seed)


def vit_tiny(seed: int = 0) -> VisionTransformer:
    return vit(ViTConfig(image_size=128, patch_size=8, hidden_size=64, num_layers=2, num_heads=4, num_classes=10), seed)


def vit_small(seed: int = 0) -> VisionTransformer:
    return vit(ViTConfig(image_size=224, patch_size=16, hidden_size=384, num_layers=12, num_heads=6, num_classes=1000), seed)
