"""The third-party model suite on a CUDA GPU: a device script, run by hand on a lent GPU machine.

    PYTHONPATH=tests/third_party python tests/third_party/gpu_check.py [--out results.json] [--archs bert,gpt2] [--dump DIR]

(``gpu_suite.sh`` runs every architecture in parallel, one process each.)

For each architecture of ``hf_zoo`` it runs ``torch.compile(model, backend="disc", dynamic=True)``
on CUDA over the first shapes of the stream (size-1 first), in inference and in training, and
compares outputs and every parameter's gradient with eager on CUDA (TF32 off on both sides, so
the comparison is in full float32), then inference in bfloat16, in float16 and in float32 with
TF32 allowed (on both sides), and inference and training under ``torch.autocast`` (bf16). Every architecture is tried
whatever happened to the previous one; the summary says, per architecture and mode, the worst
error or the exception, the compilations and the ops disc left to PyTorch.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import time
import traceback
from typing import Any

import torch
from hf_zoo import ARCHS, Arch, weighted_sum

import disc

POINTS = 3  # stream points per mode: the size-1 start, the first general shape, one more
DUMP = ""  # --dump: a folder for the IR of graphs left to the reference executor
# --device cpu: a dry run of this script without a GPU (with TRITON_INTERPRET=1 DISC_BACKEND=triton,
# the Triton programs in the interpreter)
DEVICE = "cuda"


def _to(value: Any, device: str, dtype: torch.dtype | None = None) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.to(device)
        return value.to(dtype) if dtype is not None and value.is_floating_point() else value
    return value


def _inputs(arch: Arch, b: int, n: int, seed: int, dtype: torch.dtype | None = None) -> tuple[tuple, dict]:
    args, kwargs = arch.inputs(b, n, seed)
    return tuple(_to(a, DEVICE, dtype) for a in args), {k: _to(v, DEVICE, dtype) for k, v in kwargs.items()}


def _error(outs: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max((o.double() - w.double()).abs().max().item() / max(w.double().abs().max().item(), 1e-30) for o, w in zip(outs, want))


def _grad_error(model: torch.nn.Module, ref: torch.nn.Module) -> float:
    """The largest gradient difference over every parameter, relative to that parameter's
    gradient (or to 1% of the largest gradient, for parameters whose gradient is near 0)."""
    grads = [(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters()) if q.grad is not None]
    top = max(q.abs().max().item() for _, q in grads)
    worst = 0.0
    for g, q in grads:
        if g is None:
            raise AssertionError("a parameter has a gradient in eager, none compiled")
        worst = max(worst, (g.float() - q.float()).abs().max().item() / max(q.float().abs().max().item(), 1e-2 * top))
    return worst


def _run(arch: Arch, mode: str) -> dict[str, Any]:
    torch._dynamo.reset()
    dtype = {"bf16-infer": torch.bfloat16, "f16-infer": torch.float16}.get(mode)
    # autocast: float32 weights, the matrix products in bf16 (how models are trained on GPUs)
    autocast = torch.autocast(DEVICE, torch.bfloat16) if mode.startswith("autocast") else contextlib.nullcontext()
    # PyTorch's defaults let cuDNN (not cuBLAS) use TF32; "tf32-infer" turns both on, the other
    # modes both off, and disc must follow whatever eager was given.
    tf32 = mode == "tf32-infer"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    model = arch.build().to(DEVICE)
    if dtype is not None:
        model = model.to(dtype)
    model.train(mode.endswith("train"))
    ref = copy.deepcopy(model)
    # In 16 bits eager itself is off float32 by its rounding: float32 eager on the same weights
    # measures that, the scale to read disc's error against eager by.
    reduced = dtype is not None or mode.startswith("autocast")
    full = copy.deepcopy(model).float() if reduced else None
    compiled = torch.compile(model, backend="disc", dynamic=True)
    before = len(disc.reports())
    worst, worst_grad, eager_off, eager_grad_off = 0.0, 0.0, 0.0, 0.0
    training = mode.endswith("train")
    for k, (b, n) in enumerate(arch.stream[:POINTS]):
        args, kwargs = _inputs(arch, b, n, k, dtype)
        if not training:
            with torch.no_grad(), autocast:
                want = arch.output(ref(*args, **kwargs))
                worst = max(worst, _error(arch.output(compiled(*args, **kwargs)), want))
            if full is not None:
                with torch.no_grad():
                    args32, kwargs32 = _inputs(arch, b, n, k)
                    eager_off = max(eager_off, _error(want, arch.output(full(*args32, **kwargs32))))
            continue
        outs, want = [], []
        for m, results, context in ((ref, want, autocast), (model, outs, autocast), (full, [], contextlib.nullcontext())):
            if m is None:
                continue
            m.zero_grad(set_to_none=True)
            with context:
                results += arch.output((compiled if m is model else m)(*args, **kwargs))
            weighted_sum([r.float().cpu() for r in results]).backward()  # the loss weights are drawn on the CPU
            if m is full:
                eager_off = max(eager_off, _error([w.detach() for w in want], [r.detach() for r in results]))
                eager_grad_off = max(eager_grad_off, _grad_error(ref, full))
        worst = max(worst, _error([o.detach() for o in outs], [w.detach() for w in want]))
        worst_grad = max(worst_grad, _grad_error(model, ref))
    reports = disc.reports()[before:]
    fallbacks: dict[str, int] = {}
    for r in reports:
        for op, count in r.fallbacks.items():
            fallbacks[op] = fallbacks.get(op, 0) + count
    if DUMP:  # the graphs the GPU backend gave up on, to reproduce on a CPU (TRITON_INTERPRET=1, build_triton)
        import os

        from disc.ir.printer import print_graph

        os.makedirs(DUMP, exist_ok=True)
        for k, r in enumerate(reports):
            if r.backend is not None and r.backend.name == "reference":
                stem = os.path.join(DUMP, f"{arch.name}-{mode}-{k}")
                with open(stem + ".disc", "w") as f:
                    f.write(f"// {r.backend.reason}\n" + print_graph(r.graph))
                torch.save({name: t.cpu() for name, t in r.graph.constants.items()}, stem + ".pt")
    # Why a graph was not compiled, or which executor runs it (the reference executor on a GPU is a finding).
    programs = sorted({r.name if "NOT compiled" in r.name else f"{r.backend.name}: {r.backend.reason}"[:300] for r in reports if r.backend is not None or "NOT compiled" in r.name})
    return {"worst_output": worst, "worst_gradient": worst_grad, "eager_vs_f32": eager_off, "eager_grad_vs_f32": eager_grad_off, "compilations": len(reports), "fallbacks": fallbacks, "programs": programs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument("--archs", default=",".join(sorted(ARCHS)))
    parser.add_argument("--modes", default="infer,bf16-infer,f16-infer,autocast-infer,tf32-infer,train,autocast-train")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dump", default="", help="write the IR (and constants) of graphs the GPU backend gave up on here")
    opts = parser.parse_args()
    global DUMP, DEVICE
    DUMP, DEVICE = opts.dump, opts.device
    results = []
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name() if DEVICE == 'cuda' else 'cpu'}", flush=True)
    for name in opts.archs.split(","):
        for mode in opts.modes.split(","):
            start = time.perf_counter()
            try:
                row = {"arch": name, "mode": mode, **_run(ARCHS[name], mode)}
            except Exception as e:  # the summary records it and goes on to the next architecture
                row = {"arch": name, "mode": mode, "error": f"{type(e).__name__}: {e}"[:400], "where": traceback.format_exc()[-1200:]}
            row["seconds"] = round(time.perf_counter() - start, 1)
            results.append(row)
            short = row.get("error") or f"out {row['worst_output']:.1e} grad {row['worst_gradient']:.1e} (eager vs f32: {row['eager_vs_f32']:.0e}, {row['eager_grad_vs_f32']:.0e}) compiled {row['compilations']} fb {row['fallbacks']}"
            print(f"{name:14s} {mode:10s} {row['seconds']:6.1f}s  {short}", flush=True)
            with open(opts.out, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
