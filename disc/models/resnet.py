"""A ResNet-style CNN with basic (two 3x3 conv) residual blocks."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from disc.models.seeded import build_seeded


@dataclass(frozen=True)
class ResNetConfig:
    widths: tuple[int, ...] = (64, 128, 256, 512)
    blocks: tuple[int, ...] = (2, 2, 2, 2)
    num_channels: int = 3
    num_classes: int = 1000


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = conv3x3(in_planes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(conv1x1(in_planes, planes, stride), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class ResNet(nn.Module):
    """``forward(pixel_values [batch, C, H, W]) -> logits [batch, num_classes]``; any H, W >= 1."""

    def __init__(self, config: ResNetConfig) -> None:
        super().__init__()
        self.config = config
        stem = config.widths[0]
        self.conv1 = nn.Conv2d(config.num_channels, stem, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(stem)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

        stages = []
        in_planes = stem
        for i, (width, num_blocks) in enumerate(zip(config.widths, config.blocks)):
            stride = 1 if i == 0 else 2
            layers = [BasicBlock(in_planes, width, stride)]
            layers += [BasicBlock(width, width) for _ in range(num_blocks - 1)]
            stages.append(nn.Sequential(*layers))
            in_planes = width
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(in_planes, config.num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                # non-trivial affine parameters and running statistics, as a trained network would have
                nn.init.uniform_(m.weight, 0.5, 1.5)
                nn.init.normal_(m.bias, std=0.1)
                m.running_mean.normal_(std=0.1)
                m.running_var.uniform_(0.5, 1.5)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(pixel_values))))
        x = self.stages(x)
        x = F.adaptive_avg_pool2d(x, (1, 1))
        x = torch.flatten(x, 1)
        return self.fc(x)


def resnet(config: ResNetConfig, seed: int = 0) -> ResNet:
    return build_seeded(ResNet, config, seed)


def resnet_tiny(seed: int = 0) -> ResNet:
    return resnet(ResNetConfig(widths=(8, 16, 32, 64), blocks=(1, 1, 1, 1), num_classes=10), seed)


def resnet_small(seed: int = 0) -> ResNet:
    return resnet(ResNetConfig(widths=(32, 64, 128, 256), blocks=(2, 2, 2, 2), num_classes=100), seed)


def resnet18(seed: int = 0) -> ResNet:
    return resnet(ResNetConfig(), seed)
