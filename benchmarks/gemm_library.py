"""GEMM and conv2d throughput of the CPU RAL (oneDNN and builtin) next to torch.

Run as ``python -m benchmarks.gemm_library [--out PATH] [--repeats N] [--quick]``. Shapes:
BERT projections (M = batch*seq in {1, 4, 16, 64, 512, 3072} by six (K, N), with B stored [K, N] and,
"W^T", as torch's Linear stores its weight), their weight gradients ("dW": dY^T @ X over
R = 64, 512 or 3072 rows), attention batched GEMMs
(8 x 12 heads, S in {128, 384}, D = 64, QK^T and PV on strided views of a fused QKV buffer,
as a compiled program sees them) and a few ResNet-18 convolutions (batch 1, 224 px). Systems
are timed interleaved (one call of each per round) and the median round is reported, so a
transient load on the machine hits every system alike. Prints a table and writes JSON.
``ral-onednn`` picks its GEMM routine by shape; ``ral-onednn-sgemm`` is the same library with
every GEMM forced to ``dnnl_sgemm``, and ``ral-onednn-packed`` the same library told that B is a
constant (as programs say of a model's weights), so it reads a copy packed once, run by oneDNN's
matmul; ``ral-onednn-panels`` runs GEMMs of few rows (up to the RAL's panel-kernel limit) on that
same copy with the RAL's own kernel, as programs do. All timed in the same rounds.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.timing import interleaved_medians
from disc.codegen.cpu import toolchain
from disc.runtime.ral import Ral, conv2d_args, gemm_args, load_ral, open_ral

BERT_M = (1, 4, 16, 64, 512, 3072)
QUICK_M = (1, 16, 64)
BERT_KN = ((256, 256), (256, 1024), (1024, 256), (768, 768), (768, 3072), (3072, 768))
# (name, ci, co, kernel, stride, padding, input spatial size at 224 px)
RESNET18_CONVS = (
    ("conv1 7x7/2", 3, 64, 7, 2, 3, 224),
    ("layer1 3x3", 64, 64, 3, 1, 1, 56),
    ("layer2 3x3/2", 64, 128, 3, 2, 1, 56),
    ("layer2 1x1/2", 64, 128, 1, 2, 0, 56),
    ("layer3 3x3", 256, 256, 3, 1, 1, 14),
    ("layer4 3x3", 512, 512, 3, 1, 1, 7),
)


def _rals() -> dict[str, Ral]:
    rals = {}
    if toolchain.have_dnnl():
        rals["ral-onednn"] = load_ral("dnnl")
        rals["ral-onednn-sgemm"] = _sgemm_only_ral(rals["ral-onednn"])
    rals["ral-builtin"] = load_ral("builtin")
    return rals


def _sgemm_only_ral(ral: Ral) -> Ral:
    """The oneDNN RAL with its GEMM routine forced to dnnl_sgemm (what it did before choosing by shape).

    A copy of the library at another path is a second instance with its own statics; the routine
    override (DISC_RAL_GEMM) is read at its first GEMM, made here while the variable is set.
    """
    copy = Path(tempfile.mkdtemp(prefix="disc-ral-sgemm-")) / ral.path.name
    shutil.copyfile(ral.path, copy)
    before = os.environ.get("DISC_RAL_GEMM")
    os.environ["DISC_RAL_GEMM"] = "sgemm"
    try:
        forced = open_ral(copy)
        args, _ = gemm_args(torch.ones(16, 64), torch.ones(32, 64).t(), torch.empty(16, 32))
        forced.call_gemm(args)
    finally:
        if before is None:
            os.environ.pop("DISC_RAL_GEMM")
        else:
            os.environ["DISC_RAL_GEMM"] = before
    return forced


def _gemm_fns(
    rals: dict[str, Ral], a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, weight: bool
) -> dict[str, Callable[[], object]]:
    fns: dict[str, Callable[[], object]] = {}
    for name, ral in rals.items():
        args, _ = gemm_args(a, b, out)  # built once: time the library, not the ctypes marshalling
        fns[name] = lambda ral=ral, args=args: ral.call_gemm(args)
    if weight and "ral-onednn" in rals:
        ral = rals["ral-onednn"]
        args, _ = gemm_args(a, b, out, b_is_constant=True)
        panel_rows = ral.cache_entries()["panel_gemm_rows"]

        def packed(ral: Ral = ral, args=args, rows: int = panel_rows) -> None:
            ral.set_small_m_rows(0)  # oneDNN's matmul on the packed copy, whatever m is
            ral.call_gemm(args)
            ral.set_small_m_rows(rows)

        fns["ral-onednn-packed"] = packed
        if a.shape[-2] <= panel_rows:
            fns["ral-onednn-panels"] = lambda ral=ral, args=args: ral.call_gemm(args)
    fns["torch"] = lambda: torch.matmul(a, b, out=out)
    return fns


def _held(rals: dict[str, Ral], b: torch.Tensor) -> Callable[[], None]:
    """Holds ``b`` as a program holds its constants; the returned function lets go, freeing its packed copy."""
    ral = rals.get("ral-onednn")
    if ral is None:
        return lambda: None
    pointer = (ctypes.c_void_p * 1)(b.data_ptr())
    ral.hold_constants(pointer, 1, True)
    return lambda: ral.hold_constants(pointer, 1, False)


def bench_gemm(rals: dict[str, Ral], repeats: int, quick: bool) -> list[dict]:
    rows = []
    cases = []
    for m in QUICK_M if quick else BERT_M:
        for k, n in BERT_KN:
            a = torch.randn(m, k)
            cases.append((f"bert M={m} K={k} N={n}", a, torch.randn(k, n), torch.empty(m, n), 2.0 * m * n * k, True))
            # B as torch's Linear stores its weight ([N, K], read transposed), as compiled models pass it
            cases.append((f"bert M={m} K={k} N={n} W^T", a, torch.randn(n, k).t(), torch.empty(m, n), 2.0 * m * n * k, True))
    # Training's weight gradients dW[N, K] = dY^T @ X over R = batch*seq rows: k runs along both
    # operands' rows.
    for r in (64, 512) if quick else BERT_M[3:]:
        for k, n in BERT_KN:
            dy, x = torch.randn(r, n), torch.randn(r, k)
            cases.append((f"dW R={r} K={k} N={n}", dy.t(), x, torch.empty(n, k), 2.0 * r * n * k, False))
    B, h, D = 8, 12, 64
    for S in (128,) if quick else (128, 384):
        qkv = torch.randn(B, S, 3 * h * D)
        q, k_, v = (t.view(B, S, h, D).transpose(1, 2) for t in qkv.split(h * D, dim=-1))
        cases.append((f"attn QK^T S={S}", q, k_.transpose(-1, -2), torch.empty(B, h, S, S), 2.0 * B * h * S * S * D, False))
        p = torch.softmax(torch.randn(B, h, S, S), dim=-1)
        ctx = torch.empty(B, S, h * D).view(B, S, h, D).transpose(1, 2)
        cases.append((f"attn PV S={S}", p, v, ctx, 2.0 * B * h * S * S * D, False))
    for label, a, b, out, flops, weight in cases:
        let_go = _held(rals, b)
        secs = interleaved_medians(_gemm_fns(rals, a, b, out, weight), repeats, 3.0, rotate=True, primed=True)
        let_go()
        rows.append({"case": label, "flops": flops, **{f"{name}_gflops": flops / s / 1e9 for name, s in secs.items()}})
        _print_row(rows[-1])
    return rows


def bench_conv(rals: dict[str, Ral], repeats: int) -> list[dict]:
    rows = []
    for label, ci, co, kern, stride, pad, hw in RESNET18_CONVS:
        x, w = torch.randn(1, ci, hw, hw), torch.randn(co, ci, kern, kern)
        oh = (hw + 2 * pad - kern) // stride + 1
        flops = 2.0 * co * oh * oh * ci * kern * kern
        fns: dict[str, Callable[[], object]] = {}
        for name, ral in rals.items():
            args, out = conv2d_args(x, w, stride, pad, weight_is_constant=True)
            fns[name] = lambda ral=ral, args=args, out=out: ral.call_conv2d(args)  # out: the args point into it
        fns["torch"] = lambda x=x, w=w, s=stride, p=pad: F.conv2d(x, w, None, s, p)
        secs = interleaved_medians(fns, repeats, 3.0, rotate=True, primed=True)
        rows.append(
            {"case": f"resnet18 {label} 1x{ci}x{hw}x{hw}", "flops": flops, **{f"{n}_gflops": flops / s / 1e9 for n, s in secs.items()}}
        )
        _print_row(rows[-1])
    return rows


COLUMNS = ("ral-onednn", "ral-onednn-sgemm", "ral-onednn-packed", "ral-onednn-panels", "ral-builtin", "torch")


def _print_header() -> None:
    print(f"{'case':44s}" + "".join(f"{c + ' GF/s':>24s}" for c in COLUMNS))


def _print_row(row: dict) -> None:
    cells = "".join(f"{row[c + '_gflops']:24.1f}" if c + "_gflops" in row else f"{'-':>24s}" for c in COLUMNS)
    print(f"{row['case']:44s}{cells}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/gemm_library.json", help="JSON results path")
    parser.add_argument("--repeats", type=int, default=9, help="interleaved rounds per case (median reported)")
    parser.add_argument("--quick", action="store_true", help="fewer shapes (smoke run)")
    opts = parser.parse_args(argv)
    rals = _rals()
    print(f"threads: torch {torch.get_num_threads()}, OpenMP/oneDNN {os.environ.get('OMP_NUM_THREADS', os.cpu_count())}")
    print("libraries: " + ", ".join(f"{n} = {r.gemm_library}" for n, r in rals.items()))
    _print_header()
    gemm_rows = bench_gemm(rals, opts.repeats, opts.quick)
    conv_rows = bench_conv({n: r for n, r in rals.items() if n != "ral-onednn-sgemm"}, opts.repeats)
    result = {
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "libraries": {n: r.gemm_library for n, r in rals.items()},
        "repeats": opts.repeats,
        "gemm": gemm_rows,
        "conv2d": conv_rows,
    }
    with open(opts.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {opts.out}")


if __name__ == "__main__":
    main()
