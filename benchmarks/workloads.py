"""The benchmark workloads: models with random weights (fixed seed) and their shape streams.

A workload is a model, how to make its inputs for a shape, which input axes
are dynamic, and the *stream*: the shapes in the order a user would send them.
Every system sees the same stream, in the same order, with the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from disc.models import MODELS

Shape = Mapping[str, int]


@dataclass(frozen=True, eq=False)
class Workload:
    name: str
    description: str
    build: Callable[[], nn.Module]  # model in eval mode, weights from a fixed seed
    make_inputs: Callable[[Shape, int], tuple]  # (shape, seed) -> positional args
    dynamic: Mapping[str, Mapping[int, str]]  # forward arg name -> {axis: dim name}
    stream: tuple[Shape, ...]
    x_dims: tuple[str, ...]  # latency is plotted against the product of these dims
    x_label: str
    repeats: int = 5  # steady-state repetitions per shape and system
    tags: frozenset[str] = field(default_factory=frozenset)  # e.g. "data-dependent"
    # Systems left out of the suite's default run, with the reason (run them with --systems).
    excluded: Mapping[str, str] = field(default_factory=dict)

    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(self.dynamic)

    def inputs(self, shape: Shape, seed: int = 0, device: str = "cpu", dtype: torch.dtype | None = None) -> tuple:
        args = self.make_inputs(shape, seed)
        return tuple(_to(a, device, dtype) for a in args)

    def x_of(self, shape: Shape) -> int:
        x = 1
        for d in self.x_dims:
            x *= shape[d]
        return x

    def shape_label(self, shape: Shape) -> str:
        return "x".join(str(v) for v in shape.values())


def _to(t: torch.Tensor, device: str, dtype: torch.dtype | None) -> torch.Tensor:
    if dtype is not None and t.is_floating_point():
        t = t.to(dtype)
    return t.to(device)


WORKLOADS: dict[str, Workload] = {}


def register(w: Workload) -> Workload:
    if w.name in WORKLOADS:
        raise ValueError(f"workload {w.name!r} is already registered")
    WORKLOADS[w.name] = w
    return w


def _pairs(dims: tuple[str, ...], rows: list[tuple[int, ...]]) -> tuple[Shape, ...]:
    return tuple(dict(zip(dims, r)) for r in rows)


def _zoo_inputs(model: str) -> Callable[[Shape, int], tuple]:
    entry = MODELS[model]
    return lambda shape, seed: entry.inputs(shape, seed=seed)


# 24 (batch, sequence) pairs, batch 1-8, sequence 8-384, in no particular order
# (a serving stream); batch 1 recurs so a 1-sized dim is hit early and often.
BERT_STREAM = _pairs(
    ("batch", "seq"),
    [
        (1, 8), (4, 64), (1, 128), (8, 16), (2, 384), (3, 33), (1, 256), (6, 96),
        (8, 8), (2, 200), (5, 48), (1, 384), (7, 24), (4, 160), (2, 12), (8, 128),
        (3, 300), (1, 64), (5, 9), (6, 192), (2, 77), (4, 384), (1, 17), (8, 256),
    ],
)  # fmt: skip

# inductor-static on bert-base costs ~2.5 of the CPU suite's 30 minutes (8 compilations cold, 8 again
# in the suite's process) and shows what bert-small already shows: it recompiles per shape until the limit.
_BASE_EXCLUDED = {"inductor-static": "left out of the default CPU suite for time (add --systems to run it); bert-small shows its recompilations"}

for _size, _reps, _desc, _excluded in (
    ("small", 5, "4 layers, hidden 256, 4 heads", {}),
    ("base", 2, "12 layers, hidden 768, 12 heads", _BASE_EXCLUDED),
):
    register(
        Workload(
            name=f"bert-{_size}",
            description=f"BERT-style encoder ({_desc}), 24 (batch, seq) pairs, batch 1-8, seq 8-384",
            build=lambda _size=_size: MODELS["bert"].build(_size),
            make_inputs=_zoo_inputs("bert"),
            dynamic=MODELS["bert"].dynamic,
            stream=BERT_STREAM,
            x_dims=("batch", "seq"),
            x_label="tokens (batch x seq)",
            repeats=_reps,
            excluded=_excluded,
        )
    )


def _gpt2_stream(prefill: tuple[int, ...], decode_steps: int) -> tuple[Shape, ...]:
    """Prefill at several lengths, then a decode without KV cache: the sequence grows by one each step."""
    rows = [(1, n) for n in prefill] + [(1, n) for n in range(1, decode_steps + 1)]
    return _pairs(("batch", "seq"), rows)


register(
    Workload(
        name="gpt2-decode",
        description="GPT-2-style decoder (4 layers, hidden 256): prefill at 16/64/160, then decode without KV cache at lengths 1..48",
        build=lambda: MODELS["gpt2"].build("small"),
        make_inputs=_zoo_inputs("gpt2"),
        dynamic=MODELS["gpt2"].dynamic,
        stream=_gpt2_stream((16, 64, 160), 48),
        x_dims=("seq",),
        x_label="sequence length (batch 1)",
        repeats=5,
    )
)

# 8 image sizes between 128 and 320, square and not, batch 1-4.
IMAGE_STREAM = _pairs(
    ("batch", "height", "width"),
    [(1, 128, 128), (1, 224, 224), (2, 160, 192), (1, 320, 320), (4, 128, 160), (1, 256, 256), (2, 288, 224), (1, 192, 320)],
)

register(
    Workload(
        name="resnet18",
        description="ResNet-18-style CNN (basic blocks), 8 image sizes 128-320",
        build=lambda: MODELS["resnet"].build("18"),
        make_inputs=_zoo_inputs("resnet"),
        dynamic=MODELS["resnet"].dynamic,
        stream=IMAGE_STREAM,
        x_dims=("batch", "height", "width"),
        x_label="pixels (batch x H x W)",
        repeats=5,
    )
)


def _detector() -> nn.Module:
    from benchmarks.models import detection_head

    return detection_head()


def _image_inputs(shape: Shape, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape["batch"], 3, shape["height"], shape["width"], generator=g),)


register(
    Workload(
        name="detector",
        description="detection-style head: conv backbone, then boxes selected by score (data-dependent count) and refined",
        build=_detector,
        make_inputs=_image_inputs,
        dynamic={"pixel_values": {0: "batch", 2: "height", 3: "width"}},
        stream=IMAGE_STREAM,
        x_dims=("batch", "height", "width"),
        x_label="pixels (batch x H x W)",
        repeats=5,
        tags=frozenset({"data-dependent"}),
    )
)


def smoke_workload() -> Workload:
    """A tiny BERT and two shapes (one with 1-sized dims): keeps the harness from rotting in CI."""
    return Workload(
        name="bert-tiny-smoke",
        description="BERT-style encoder (tiny), two shapes",
        build=lambda: MODELS["bert"].build("tiny"),
        make_inputs=_zoo_inputs("bert"),
        dynamic=MODELS["bert"].dynamic,
        stream=_pairs(("batch", "seq"), [(2, 16), (1, 1)]),
        x_dims=("batch", "seq"),
        x_label="tokens (batch x seq)",
        repeats=2,
    )


def get_workload(name: str) -> Workload:
    """A registered workload, or the smoke workload by its name."""
    if name == "bert-tiny-smoke":
        return smoke_workload()
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}, bert-tiny-smoke")
    return WORKLOADS[name]
