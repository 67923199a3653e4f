"""Would one GEMM for Q, K and V beat three? GFLOP/s through the CPU RAL, side by side.

    python -m benchmarks.qkv_merge [--out PATH] [--rounds N]

For BERT-small and BERT-base hidden sizes and several token counts, times (interleaved as in
``benchmarks.gemm_library``, median of ``--rounds``) three projections reading torch's ``[N, K]`` weights as stored, which is what
compiled programs do, against one GEMM on the concatenated weight, stored ``[3N, K]`` or
``[K, 3N]``. Twelve layers' weights are cycled so that they come from memory, as in a model.
Prints a table and writes JSON. A probe for a pass not (yet) built: merging needs a copy of
the Q/K/V weights.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks.timing import interleaved_medians
from disc.runtime.ral import Ral, gemm_args, load_ral

LAYERS = 12
CASES = ((256, (8, 64, 256, 1024)), (768, (16, 64, 256, 3072)))
VARIANTS = ("3 GEMMs [N, K]", "merged [3N, K]", "merged [K, 3N]")


def measure(hidden: int, m: int, rounds: int) -> dict[str, float]:
    ral = load_ral("dnnl")
    weights = [[torch.randn(hidden, hidden) for _ in range(3)] for _ in range(LAYERS)]  # [N, K], as nn.Linear stores them
    a, outs, merged_out = torch.randn(m, hidden), [torch.empty(m, hidden) for _ in range(3)], torch.empty(m, 3 * hidden)
    separate = [[gemm_args(a, w.t(), o)[0] for w, o in zip(layer, outs)] for layer in weights]
    # The args hold raw pointers: the merged weights must outlive them.
    merged = [torch.cat(layer) for layer in weights]  # [3N, K]
    merged_kn = [w.t().contiguous() for w in merged]  # [K, 3N]
    stacked = [gemm_args(a, w.t(), merged_out)[0] for w in merged]
    stacked_kn = [gemm_args(a, w, merged_out)[0] for w in merged_kn]
    _check_same_products(ral, separate[-1], [stacked[-1], stacked_kn[-1]], outs, merged_out)
    calls = dict(zip(VARIANTS, ([x for layer in separate for x in layer], stacked, stacked_kn)))
    seconds = interleaved_medians({v: lambda args=args: [ral.call_gemm(x) for x in args] for v, args in calls.items()}, rounds, 5.0, rotate=True, primed=True)
    flops = 2.0 * m * hidden * 3 * hidden * LAYERS
    return {v: flops / s / 1e9 for v, s in seconds.items()}


def _check_same_products(ral: Ral, separate: list, merged: list, outs: list[torch.Tensor], merged_out: torch.Tensor) -> None:
    """Each merged GEMM computes what the three ``separate`` ones write into ``outs``, or the probe compares unlike work."""
    for x in separate:
        ral.call_gemm(x)
    expected = torch.cat(outs, dim=1)
    for x in merged:
        ral.call_gemm(x)
        if not torch.allclose(merged_out, expected, rtol=1e-4, atol=1e-4):
            raise AssertionError(f"merged GEMM differs from three GEMMs by {(merged_out - expected).abs().max().item():.3g}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("qkv_merge.json"))
    parser.add_argument("--rounds", type=int, default=15)
    opts = parser.parse_args(argv)
    rows = []
    print(f"threads {torch.get_num_threads()}; GFLOP/s")
    print(f"{'hidden':>6} {'tokens':>6}" + "".join(f"{v:>18}" for v in VARIANTS))
    for hidden, ms in CASES:
        for m in ms:
            row = {"hidden": hidden, "tokens": m, **measure(hidden, m, opts.rounds)}
            rows.append(row)
            print(f"{hidden:6d} {m:6d}" + "".join(f"{row[v]:18.0f}" for v in VARIANTS), flush=True)
    opts.out.write_text(json.dumps({"threads": torch.get_num_threads(), "rows": rows}, indent=1))
    print(f"wrote {opts.out}")


if __name__ == "__main__":
    main()
