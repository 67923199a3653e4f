"""3x3 convolutions of stride 1 through the CPU RAL: oneDNN's direct kernels against Winograd's F(2x2, 3x3).

    python -m benchmarks.conv_library [--out PATH] [--rounds N] [--images 1x224x224,2x288x224]

ResNet-18 spends ~80% of its multiply-adds in 3x3 convolutions of stride 1 (13 of its 20
layers). For each image size of the CPU suite's ResNet stream it times (interleaved, median of
``--rounds``) those layers' problems as compiled programs run them (NHWC, constant weights,
bias and ReLU fused) through the RAL three ways: oneDNN's direct kernel (Winograd off), the
RAL's Winograd kernel (forced on) and the RAL's default choice between them; torch's
``F.conv2d`` on channels-last tensors beside them. Every product is checked against float64
first. Prints a table (GFLOP/s counted as the direct convolution's work) and the stream's total
weighted by how many such layers ResNet-18 has at each width, and writes JSON with the CPU model.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.machine import cpu_name
from benchmarks.timing import interleaved_medians
from disc.runtime.ral import Ral, conv2d_args, load_ral

# The CPU suite's ResNet image stream (benchmarks.workloads.IMAGE_STREAM) as batch x height x width.
IMAGES = ((1, 128, 128), (1, 224, 224), (2, 160, 192), (1, 320, 320), (4, 128, 160), (1, 256, 256), (2, 288, 224), (1, 192, 320))
# ResNet-18's stride-1 3x3 layers: (channels, layers of that width, downsampling before them).
STAGES = ((64, 4, 4), (128, 3, 8), (256, 3, 16), (512, 3, 32))
SYSTEMS = {"oneDNN direct": 0, "Winograd F(2x2,3x3)": 1, "RAL default": 2}


def _ceil_halvings(size: int, factor: int) -> int:
    """A side after the stem's and each stage's stride-2 steps (every one rounds up)."""
    while factor > 1:
        size, factor = -(-size // 2), factor // 2
    return size


def problems(images: tuple[tuple[int, int, int], ...]) -> list[dict]:
    return [
        {"image": f"{n}x{h}x{w}", "n": n, "c": c, "h": _ceil_halvings(h, down), "w": _ceil_halvings(w, down), "layers": layers}
        for n, h, w in images
        for c, layers, down in STAGES
    ]


def _calls(ral: Ral, p: dict) -> tuple[dict[str, Callable[[], None]], Callable[[], None], list[torch.Tensor]]:
    """(a call per system, a check of the RAL's output, what the args point into)."""
    x = torch.randn(p["n"], p["h"], p["w"], p["c"])
    weight = torch.randn(p["c"], p["c"], 3, 3) / (3 * p["c"] ** 0.5)
    bias = torch.randn(p["c"])
    args, out = conv2d_args(x, weight, 1, 1, weight_is_constant=True, channels_last=True, bias=bias, relu=True)
    x_cl = x.permute(0, 3, 1, 2)  # NCHW view of the NHWC buffer: torch's channels-last tensor

    def through(mode: int) -> Callable[[], None]:
        def run() -> None:
            ral.set_winograd(mode)
            ral.call_conv2d(args)

        return run

    fns = {name: through(mode) for name, mode in SYSTEMS.items()}
    fns["torch F.conv2d"] = lambda: F.relu(F.conv2d(x_cl, weight, bias, 1, 1))

    def check() -> None:
        expected = F.relu(F.conv2d(x_cl.double(), weight.double(), bias.double(), 1, 1)).permute(0, 2, 3, 1)
        err = ((out.double() - expected).abs().max() / expected.abs().max()).item()
        assert err < 1e-5, f"{p['image']}, {p['c']} channels at {p['h']}x{p['w']}: the RAL's output differs from float64's by {err:.1e}"

    return fns, check, [x, weight, bias, out]


def measure(rounds: int, images: tuple[tuple[int, int, int], ...] = IMAGES) -> list[dict]:
    ral = load_ral("dnnl")
    default = ral.set_winograd(2)
    rows = []
    try:
        for p in problems(images):
            fns, check, _keep = _calls(ral, p)
            for name, fn in fns.items():
                fn()  # builds plans, transforms the weights
                if name in SYSTEMS:
                    check()
            before = ral.cache_entries()["winograd_calls"]
            fns["RAL default"]()
            picked = "Winograd" if ral.cache_entries()["winograd_calls"] > before else "direct"
            medians = interleaved_medians(fns, rounds)
            flops = 2 * p["n"] * p["h"] * p["w"] * p["c"] * p["c"] * 9
            for system, s in medians.items():
                rows.append({**p, "system": system, "ms": s * 1e3, "gflop_s": flops / s / 1e9, "default_picks": picked})
    finally:
        ral.set_winograd(default)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/conv_library.json", help="JSON results path")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per problem (median reported)")
    parser.add_argument("--images", help="comma-separated NxHxW image sizes (default: the CPU suite's ResNet stream)")
    args = parser.parse_args(argv)
    images = tuple(tuple(int(v) for v in s.split("x")) for s in args.images.split(",")) if args.images else IMAGES
    cpu = cpu_name()
    rows = measure(args.rounds, images)  # type: ignore[arg-type]
    systems = list(dict.fromkeys(r["system"] for r in rows))
    print(f"ResNet-18's stride-1 3x3 convolutions (NHWC, bias + ReLU, constant weights); {cpu}, {torch.get_num_threads()} threads")
    print("ms a call (GFLOP/s as direct work)\n")
    print("| image | channels | side | " + " | ".join(systems) + " | default picks | direct / default |")
    print("|---|---:|---|" + "---:|" * len(systems) + "---|---:|")
    by_problem: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        by_problem.setdefault((r["image"], r["c"], r["h"], r["w"]), {})[r["system"]] = r
    totals = dict.fromkeys(systems, 0.0)
    for (image, c, h, w), cells in by_problem.items():
        for system in systems:
            totals[system] += cells[system]["ms"] * cells[system]["layers"]
        shown = " | ".join(f"{cells[s]['ms']:.3f} ({cells[s]['gflop_s']:.0f})" for s in systems)
        ratio = cells["oneDNN direct"]["ms"] / cells["RAL default"]["ms"]
        print(f"| {image} | {c} | {h}x{w} | {shown} | {cells['RAL default']['default_picks']} | {ratio:.2f}x |")
    print("\nThe stream's stride-1 3x3 layers, each size once (ms): " + ", ".join(f"{s} {t:.1f}" for s, t in totals.items()))
    print(f"oneDNN direct / RAL default: {totals['oneDNN direct'] / totals['RAL default']:.2f}x")
    Path(args.out).write_text(json.dumps({"cpu": cpu, "threads": torch.get_num_threads(), "rows": rows, "stream_ms": totals}, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
