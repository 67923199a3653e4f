"""Memory bandwidth reached by disc's fused memory-bound kernels, next to a STREAM-like copy.

Run as ``python -m benchmarks.bandwidth [--out DIR] [--repeats N] [--mb SIZES]``. For each
tensor size (default: one that fits this machine's last-level cache and one several times
larger), it times, interleaved round by round so a transient load hits all alike:

- ``copy``: ``out.copy_(x)``, the STREAM copy kernel (reads and writes each byte once);
- ``disc`` and ``eager`` versions of the kernels a transformer spends its memory-bound time in:
  residual add + LayerNorm (one stitch kernel), masked softmax (one stitch kernel) and
  bias + GELU (one loop kernel). ``disc out=`` is the same compiled program writing into
  preallocated outputs, as the copy does: a fresh output bigger than malloc's mmap threshold
  arrives as untouched pages that the kernel faults in and the OS zeroes first, which costs
  the call (and eager) a second write of every output byte.

Bandwidth counts the bytes a kernel must move at least (each input read once, each output
written once), divided by the median time; ``vs copy`` is that over the copy's bandwidth in
the same run. Writes ``results.md`` and ``results.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch
from torch import nn

import disc
from benchmarks.timing import interleaved_medians
from disc.runtime.native import NativeExecutor

HIDDEN = 1024  # row length of the LayerNorm and GELU cases
KEYS = 512  # row length of the softmax case


class ResidualLayerNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return self.norm(x + r)


class MaskedSoftmax(nn.Module):
    def forward(self, s: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.softmax(s * 0.125 + mask, dim=-1)


class BiasGelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(x + self.bias)


def _cases(nbytes: int) -> list[tuple[str, nn.Module, tuple, dict, int]]:
    """(name, model, inputs, dynamic dims, bytes moved at least) with each big tensor of ``nbytes``."""
    rows = max(nbytes // (4 * HIDDEN), 1)
    x, r = torch.randn(rows, HIDDEN), torch.randn(rows, HIDDEN)
    srows = max(nbytes // (4 * KEYS), 1)
    s = torch.randn(srows // 64, 64, KEYS) if srows >= 64 else torch.randn(1, srows, KEYS)
    mask = torch.where(torch.rand(s.shape[0], 1, KEYS) > 0.2, 0.0, -1e9)
    return [
        ("add+LayerNorm", ResidualLayerNorm().eval(), (x, r), {"x": {0: "n"}, "r": {0: "n"}}, 3 * x.numel() * 4),
        ("masked softmax", MaskedSoftmax(), (s, mask), {"s": {0: "b", 1: "q"}, "mask": {0: "b"}}, 2 * s.numel() * 4),
        ("bias+GELU", BiasGelu().eval(), (x,), {"x": {0: "n"}}, 2 * x.numel() * 4),
    ]


def _llc_bytes() -> int:
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
        return int(text[:-1]) * {"K": 2**10, "M": 2**20}[text[-1]]
    except (OSError, ValueError, KeyError):
        return 32 * 2**20


def run(sizes_mb: list[int], repeats: int) -> dict:
    rows = []
    with torch.no_grad():
        for mb in sizes_mb:
            nbytes = mb * 2**20
            src, dst = torch.randn(nbytes // 4), torch.empty(nbytes // 4)
            for name, model, args, dynamic, moved in _cases(nbytes):
                compiled = disc.compile(model, args, dynamic=dynamic)
                backend = compiled.report.backend.name if compiled.report.backend else "reference"
                fns = {"copy": lambda: dst.copy_(src), "disc": lambda: compiled(*args), "eager": lambda: model(*args)}
                if isinstance(compiled.executor, NativeExecutor):
                    ex, inputs = compiled.executor, list(args)
                    outs = [torch.empty_like(o) for o in ex.run(inputs)]
                    fns["disc_out"] = lambda: ex.run(inputs, out=outs)
                t = interleaved_medians(fns, repeats)
                copy_gbs = 2 * nbytes / t["copy"] / 1e9
                row = {
                    "size_mb": mb,
                    "kernel": name,
                    "backend": backend,
                    "bytes_moved": moved,
                    "copy_gbs": copy_gbs,
                    "disc_ms": t["disc"] * 1e3,
                    "eager_ms": t["eager"] * 1e3,
                    "disc_gbs": moved / t["disc"] / 1e9,
                    "eager_gbs": moved / t["eager"] / 1e9,
                }
                row["disc_vs_copy"] = row["disc_gbs"] / copy_gbs
                row["eager_vs_copy"] = row["eager_gbs"] / copy_gbs
                if "disc_out" in t:
                    row["disc_out_ms"] = t["disc_out"] * 1e3
                    row["disc_out_gbs"] = moved / t["disc_out"] / 1e9
                    row["disc_out_vs_copy"] = row["disc_out_gbs"] / copy_gbs
                rows.append(row)
                out_part = f"   disc out= {row['disc_out_gbs']:6.1f} GB/s ({row['disc_out_vs_copy']:.0%})" if "disc_out" in t else ""
                print(
                    f"{mb:6d} MB  {name:15} copy {copy_gbs:6.1f} GB/s   disc {row['disc_gbs']:6.1f} GB/s "
                    f"({row['disc_vs_copy']:.0%}){out_part}   eager {row['eager_gbs']:6.1f} GB/s ({row['eager_vs_copy']:.0%})",
                    flush=True,
                )
    return {
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(), "llc_bytes": _llc_bytes()},
        "repeats": repeats,
        "rows": rows,
    }


def _markdown(result: dict) -> str:
    llc = result["machine"]["llc_bytes"] / 2**20
    lines = [
        f"Fused memory-bound kernels vs a STREAM-like copy ({result['machine']['threads']} threads, "
        f"last-level cache {llc:.0f} MiB, median of {result['repeats']} interleaved rounds).",
        "",
        "| tensor | kernel | copy GB/s | disc out= ms | disc out= GB/s | vs copy | disc ms | disc GB/s | vs copy "
        "| eager ms | eager GB/s | vs copy |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        out = (
            f"{r['disc_out_ms']:.2f} | {r['disc_out_gbs']:.1f} | {r['disc_out_vs_copy']:.0%}" if "disc_out_ms" in r else "— | — | —"
        )
        lines.append(
            f"| {r['size_mb']} MB | {r['kernel']} | {r['copy_gbs']:.1f} | {out} | {r['disc_ms']:.2f} | {r['disc_gbs']:.1f} | "
            f"{r['disc_vs_copy']:.0%} | {r['eager_ms']:.2f} | {r['eager_gbs']:.1f} | {r['eager_vs_copy']:.0%} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/disc-bandwidth", help="folder for results.md and results.json")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--mb", default="", help="comma-separated tensor sizes in MiB (default: 1/4 and 3x the LLC)")
    args = parser.parse_args(argv)
    llc_mb = _llc_bytes() // 2**20
    sizes = [int(x) for x in args.mb.split(",") if x] or [max(llc_mb // 4, 4), 3 * llc_mb]
    result = run(sizes, args.repeats)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2))
    (out / "results.md").write_text(_markdown(result))
    print(f"wrote {out / 'results.md'} and {out / 'results.json'}")


if __name__ == "__main__":
    main()
