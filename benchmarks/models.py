"""Benchmark-only models: a detection-style head whose shapes change inside the graph."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from disc.models.seeded import build_seeded


@dataclass(frozen=True)
class DetectionConfig:
    channels: int = 64
    hidden: int = 128


class DetectionHead(nn.Module):
    """A small conv backbone, per-location scores and boxes, then a data-dependent selection.

    The number of kept boxes depends on the scores (``scores > mean score``), so
    everything after the selection runs at a size known only at run time: the
    boxes are decoded and refined by an MLP over however many survived.
    """

    def __init__(self, config: DetectionConfig) -> None:
        super().__init__()
        channels, hidden = config.channels, config.hidden
        self.backbone = nn.Sequential(
            nn.Conv2d(3, channels, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, stride=2, padding=1),
            nn.ReLU(),
        )
        self.score = nn.Conv2d(channels, 1, 1)
        self.box = nn.Conv2d(channels, 4, 1)
        self.refine = nn.Sequential(nn.Linear(4 + channels, hidden), nn.GELU(), nn.Linear(hidden, 4))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        feats = self.backbone(pixel_values)  # [B, C, h, w]
        scores = self.score(feats).sigmoid().flatten(1)  # [B, h*w]
        boxes = self.box(feats).flatten(2).transpose(1, 2)  # [B, h*w, 4]
        feats = feats.flatten(2).transpose(1, 2)  # [B, h*w, C]
        # Keep the locations scoring above their image's mean: a data-dependent count.
        keep = scores > scores.mean(dim=1, keepdim=True)
        kept = torch.cat([boxes[keep], feats[keep]], dim=-1)  # [n, 4 + C]
        return (boxes[keep] + self.refine(kept)) * scores[keep].unsqueeze(-1)


def detection_head(seed: int = 0) -> DetectionHead:
    return build_seeded(DetectionHead, DetectionConfig(), seed)
