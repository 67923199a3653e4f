"""What one call of a compiled program costs around its kernels, next to eager.

Run as ``python -m benchmarks.overhead [--out DIR] [--rounds N]``. Programs whose kernels take a
microsecond or two (a LayerNorm over 4 rows, an add of two small tensors), so a call's time is
almost all Python, ctypes and allocation: the floor under every small call a decoder makes.
Each case is timed with grad on (as a model is usually called) and under ``torch.no_grad()``,
disc and eager alternating round by round; a round is the mean of ``CALLS`` calls and the table
gives the median of the rounds. Writes ``results.md`` and ``results.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import disc

CALLS = 2000  # calls per round


class Add(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


def _cases() -> list[tuple[str, nn.Module, tuple[torch.Tensor, ...], dict]]:
    g = torch.Generator().manual_seed(0)
    norm = nn.LayerNorm(768).eval()
    rows = {"input": {0: "rows"}}
    pair = {"x": {0: "n"}, "y": {0: "n"}}
    return [
        ("LayerNorm, 4x768", norm, (torch.randn(4, 768, generator=g),), rows),
        ("LayerNorm, 1x768", norm, (torch.randn(1, 768, generator=g),), rows),
        ("add, 8x16", Add(), (torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)), pair),
    ]


def _round(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    return (time.perf_counter() - start) / CALLS


def run(rounds: int) -> dict:
    rows = []
    for name, model, args, dynamic in _cases():
        compiled = disc.compile(model, args, dynamic=dynamic)
        torch.testing.assert_close(compiled(*args), model(*args))
        for grad in (True, False):
            with torch.set_grad_enabled(grad):
                ours, eager = [], []
                for fn in (lambda: compiled(*args), lambda: model(*args)):  # warm up both
                    for _ in range(CALLS // 10):
                        fn()
                for _ in range(rounds):
                    ours.append(_round(lambda: compiled(*args)))
                    eager.append(_round(lambda: model(*args)))
            disc_us, eager_us = statistics.median(ours) * 1e6, statistics.median(eager) * 1e6
            rows.append({"case": name, "grad": grad, "disc_us": disc_us, "eager_us": eager_us, "disc_rounds_s": ours, "eager_rounds_s": eager})
    return {
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "calls_per_round": CALLS,
        "rows": rows,
    }


def _markdown(result: dict) -> str:
    lines = [
        f"Per-call cost, median of rounds of {result['calls_per_round']} calls; torch {result['torch']}, {result['threads']} threads.",
        "",
        "| program | grad | disc (us) | eager (us) | disc - eager (us) |",
        "|---|---|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['case']} | {'on' if r['grad'] else 'off'} | {r['disc_us']:.1f} | {r['eager_us']:.1f} | {r['disc_us'] - r['eager_us']:+.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/disc-overhead", help="folder for results.md and results.json")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    result = run(args.rounds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2))
    (out / "results.md").write_text(_markdown(result))
    print(_markdown(result))
    print(f"wrote {out / 'results.md'} and {out / 'results.json'}")


if __name__ == "__main__":
    main()
