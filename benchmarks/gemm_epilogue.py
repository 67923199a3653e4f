"""Should a GEMM's bias (+ GELU) epilogue run inside the GEMM library? Measured, not assumed.

Run as ``python -m benchmarks.gemm_epilogue [--out DIR] [--rounds N] [--quick]``. For the
projections of the BERT-style encoders (A [M, K] @ W^T with W stored [N, K], as torch's Linear
keeps it, plus a bias, then GELU on the FFN up-projections), it times, interleaved round by
round in one process (``gemm_epilogue.cc``, compiled with disc's toolchain and prelude):

- ``sgemm + kernel``: what compiled programs do today: ``dnnl_sgemm``, then a generated
  elementwise kernel (disc's own ``disc_gelu``) over the result;
- ``matmul + post-op``: oneDNN's matmul primitive with the bias argument and a ``gelu_erf``
  post-op, the epilogue applied to each tile while it is in registers;
- ``matmul + kernel``: the same primitive without the epilogue, then the kernel (separates the
  routine's speed from the fusion's);
- ``sgemm alone``: the GEMM with no epilogue at all, the floor any fusion could reach.

``fused/today`` above 1.0 means the fused epilogue is slower. Writes ``results.md`` and
``results.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
from pathlib import Path

import torch

from disc.codegen.cpu import toolchain
from disc.codegen.cpu.ops import PRELUDE

HERE = Path(__file__).resolve().parent
VARIANTS = ("sgemm + kernel", "matmul + post-op", "matmul + kernel", "sgemm alone")
# (label, K, N, GELU after the bias): bert-small and bert-base FFN up-projections, then their
# attention projections (bias only; disc fuses the three Q/K/V bias adds into one kernel).
SHAPES = (
    ("bert-small FFN up", 256, 1024, True),
    ("bert-base FFN up", 768, 3072, True),
    ("bert-small QKV", 256, 256, False),
    ("bert-base QKV", 768, 768, False),
)
ROWS = (32, 128, 512, 3072)  # M = batch * seq


def load_probe() -> ctypes.CDLL:
    if not toolchain.have_dnnl():
        raise SystemExit("gemm_epilogue: oneDNN is not installed (pip install onednn-cpu-gomp onednn-devel-cpu-gomp); nothing to compare")
    flags, libs = toolchain.dnnl_build_args()
    source = PRELUDE + "\n" + (HERE / "gemm_epilogue.cc").read_text()
    lib = ctypes.CDLL(str(toolchain.build(source, "gemm_epilogue_probe", flags=flags, libs=libs).path))
    lib.disc_epilogue_probe.restype = ctypes.c_int
    i64, i32 = ctypes.c_int64, ctypes.c_int32
    lib.disc_epilogue_probe.argtypes = [i64, i64, i64, i32, i32, ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_double), ctypes.c_char_p, i64]
    return lib


def measure(lib: ctypes.CDLL, m: int, k: int, n: int, gelu: bool, rounds: int) -> dict:
    ms = (ctypes.c_double * len(VARIANTS))()
    max_rel = ctypes.c_double()
    impl = ctypes.create_string_buffer(256)
    if lib.disc_epilogue_probe(m, k, n, int(gelu), rounds, ms, ctypes.byref(max_rel), impl, len(impl)) != 0:
        raise RuntimeError(f"gemm_epilogue probe failed at M={m} K={k} N={n}: {impl.value.decode()}")
    times = dict(zip(VARIANTS, ms))
    return {
        "m": m,
        "k": k,
        "n": n,
        "gelu": gelu,
        "ms": times,
        "fused_over_today": times["matmul + post-op"] / times["sgemm + kernel"],
        "epilogue_share": 1 - times["sgemm alone"] / times["sgemm + kernel"],
        "max_rel_diff": max_rel.value,
        "fused_impl": impl.value.decode(),
    }


def table(rows: list[dict]) -> str:
    head = "| case | M | " + " | ".join(f"{v} (ms)" for v in VARIANTS) + " | fused/today | epilogue share today | max diff / max value |"
    lines = [head, "|" + "---|" * (len(VARIANTS) + 5)]
    for r in rows:
        cells = " | ".join(f"{r['ms'][v]:.3f}" for v in VARIANTS)
        lines.append(
            f"| {r['label']} | {r['m']} | {cells} | {r['fused_over_today']:.2f} | {100 * r['epilogue_share']:.0f}% | {r['max_rel_diff']:.1e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/benchmarks/gemm_epilogue", help="folder for results.md and results.json")
    parser.add_argument("--rounds", type=int, default=41, help="interleaved rounds per case (median reported)")
    parser.add_argument("--quick", action="store_true", help="two shapes, small M (smoke run)")
    opts = parser.parse_args(argv)
    lib = load_probe()
    rows = []
    for label, k, n, gelu in SHAPES[::2] if opts.quick else SHAPES:
        for m in ROWS[:2] if opts.quick else ROWS:
            rounds = opts.rounds if m * k * n < 2**30 else max(5, opts.rounds // 4)  # the largest cases take ~50 ms a call
            row = {"label": label, **measure(lib, m, k, n, gelu, rounds)}
            rows.append(row)
            print(f"{label:20s} M={m:5d}  " + "  ".join(f"{v} {row['ms'][v]:.3f}" for v in VARIANTS) + f"  fused/today {row['fused_over_today']:.2f}", flush=True)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "machine": {"threads": torch.get_num_threads(), "platform": platform.platform(), "processor": platform.processor()},
        "rows": rows,
    }
    (out / "results.json").write_text(json.dumps(result, indent=2))
    note = "Medians of interleaved rounds, ms per call; fused/today = matmul + post-op over sgemm + kernel (above 1: fusing is slower)."
    (out / "results.md").write_text(f"# GEMM epilogue: in the library or as a kernel\n\n{note}\n\n{table(rows)}\n")
    print(table(rows))
    print(f"wrote {out / 'results.md'} and {out / 'results.json'}")


if __name__ == "__main__":
    main()
