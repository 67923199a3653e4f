"""Few-row GEMMs on weights that come from memory: BERT-base's 72 GEMM weights, one pass.

    python -m benchmarks.weight_stream [--out PATH] [--rounds N] [--rows 1,8,24,64]

At a handful of tokens a large model's GEMMs are bound by reading the weights (BERT-base:
340 MB a call, more than any cache here), so what matters is how close a pass over all of them
comes to the machine's read bandwidth. Through the CPU RAL, on the weights packed once as
compiled programs use them, it times (interleaved, median of ``--rounds``) one pass over the
twelve layers' projections at several row counts: the RAL's panel kernel, oneDNN's matmul on
the same packed copy (the panel kernel turned off), and torch's ``F.linear`` on the weights as
stored. The same pass over one layer's weights repeated twelve times (in cache) gives the
compute ceiling. Prints a table and writes JSON with the CPU model.
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
from disc.runtime.ral import Ral, gemm_args, load_ral

HIDDEN, FFN, LAYERS = 768, 3072, 12
ROWS = (1, 8, 24, 64)


def _layer() -> list[torch.Tensor]:
    """One BERT-base layer's GEMM weights, [out, in] as nn.Linear stores them."""
    return [torch.randn(HIDDEN, HIDDEN) for _ in range(4)] + [torch.randn(FFN, HIDDEN), torch.randn(HIDDEN, FFN)]


def _passes(ral: Ral, weights: list[torch.Tensor], m: int) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None], list[torch.Tensor]]:
    """(one pass through the RAL, one pass through torch, a check of the RAL's last product, what
    the RAL's args point into)."""
    inputs = {HIDDEN: torch.randn(m, HIDDEN), FFN: torch.randn(m, FFN)}
    outs = {HIDDEN: torch.empty(m, HIDDEN), FFN: torch.empty(m, FFN)}
    args = [gemm_args(inputs[w.shape[1]], w.t(), outs[w.shape[0]], b_is_constant=True)[0] for w in weights]

    def through_ral() -> None:
        for a in args:
            ral.call_gemm(a)

    def through_torch() -> None:
        for w in weights:
            F.linear(inputs[w.shape[1]], w)

    def check() -> None:
        # The last GEMM writes [m, HIDDEN] from the FFN activations: the pass computed it, not junk.
        expected = F.linear(inputs[FFN], weights[-1])
        err = ((outs[HIDDEN] - expected).abs().max() / expected.abs().max()).item()
        assert err < 1e-4, f"{m} rows: the RAL's product differs from torch's by {err:.1e}"

    return through_ral, through_torch, check, [*inputs.values(), *outs.values()]  # the args hold raw pointers


def measure(rounds: int, row_counts: tuple[int, ...] = ROWS) -> list[dict]:
    ral = load_ral("dnnl")
    panel_rows = ral.cache_entries()["panel_gemm_rows"]
    streamed = [w for _ in range(LAYERS) for w in _layer()]
    cached = _layer() * LAYERS  # the same six weights twelve times: in cache after the first layer
    nbytes = sum(w.numel() for w in streamed) * 4
    rows = []
    for where, weights in (("memory", streamed), ("cache", cached)):
        for m in row_counts:
            ral_pass, torch_pass, check, _keep = _passes(ral, weights, m)

            def with_rows(limit: int) -> Callable[[], None]:
                def run() -> None:
                    ral.set_small_m_rows(limit)
                    ral_pass()

                return run

            fns = {"panel kernel": with_rows(panel_rows), "oneDNN (panel kernel off)": with_rows(0), "torch F.linear": torch_pass}
            if panel_rows == 0:
                del fns["panel kernel"]  # no AVX-512: oneDNN runs them all
            for name, fn in fns.items():
                fn()  # packs the weights, builds plans
                if name != "torch F.linear":
                    check()
            medians = interleaved_medians(fns, rounds)
            ral.set_small_m_rows(panel_rows)
            flops = 2 * m * nbytes / 4
            for system, s in medians.items():
                rows.append({"weights": where, "rows": m, "system": system, "ms": s * 1e3, "weight_gb_s": nbytes / s / 1e9, "gflop_s": flops / s / 1e9})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/weight_stream.json", help="JSON results path")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per case (median reported)")
    parser.add_argument("--rows", help="comma-separated row counts (default: %(default)s)", default=",".join(map(str, ROWS)))
    args = parser.parse_args(argv)
    cpu = cpu_name()
    rows = measure(args.rounds, tuple(int(r) for r in args.rows.split(",")))
    print(f"BERT-base's 72 GEMM weights ({LAYERS} layers), one pass; {cpu}, {torch.get_num_threads()} threads\n")
    print("| weights | rows | system | ms a pass | weights GB/s | GFLOP/s |")
    print("|---|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['weights']} | {r['rows']} | {r['system']} | {r['ms']:.2f} | {r['weight_gb_s']:.1f} | {r['gflop_s']:.0f} |")
    Path(args.out).write_text(json.dumps({"cpu": cpu, "threads": torch.get_num_threads(), "rows": rows}, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
