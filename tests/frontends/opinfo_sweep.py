"""PyTorch's OpInfo database through the plug-in: every float32 CPU op, its first samples,
``torch.compile(fn, backend="disc", dynamic=True)`` against eager. Run by hand (it takes a while):

    python tests/frontends/opinfo_sweep.py [--out sweep.json] [--start K] [--count N] [--samples S]

Each op is classed as: ok (disc compiled it and matches eager), fallback (right, but some op
ran in PyTorch: listed), wrong (a value differs: the worst failure), crash (disc raised where eager
did not), skipped (eager itself raised, or torch.compile with backend="eager" did, or the op draws
random numbers). Needs ``expecttest``, which PyTorch's test helpers import.
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from typing import Any

import torch

import disc

RANDOM = ("bernoulli", "normal", "rand", "randn", "randint", "uniform", "multinomial", "dropout", "empty", "new_empty")


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def _leaves(sample: Any) -> tuple[list[torch.Tensor], Any]:
    """The sample's tensors (the compiled function's inputs) and a function rebuilding the call from them."""
    tensors: list[torch.Tensor] = []

    def collect(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            tensors.append(x)
            return ("__tensor__", len(tensors) - 1)
        if isinstance(x, (list, tuple)):
            return type(x)(collect(v) for v in x)
        if isinstance(x, dict):
            return {k: collect(v) for k, v in x.items()}
        return x

    layout = collect((sample.input, tuple(sample.args), dict(sample.kwargs)))

    def fill(x: Any, values: list[torch.Tensor]) -> Any:
        if isinstance(x, tuple) and len(x) == 2 and x[0] == "__tensor__":
            return values[x[1]]
        if isinstance(x, (list, tuple)):
            return type(x)(fill(v, values) for v in x)
        if isinstance(x, dict):
            return {k: fill(v, values) for k, v in x.items()}
        return x

    return tensors, lambda values: fill(layout, values)


def _flat(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out.to_dense() if out.layout != torch.strided else out]  # to_sparse's result
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flat(o)]
    return []


def _dynamo_alone_raises(fn: Any, tensors: list[torch.Tensor]) -> bool:
    """Whether torch.compile without a compiler (backend="eager") raises on this call too."""
    torch._dynamo.reset()
    try:
        torch.compile(fn, backend="eager", dynamic=True)(*tensors)
    except Exception:
        return True
    return False


def check(op: Any, samples: int, seconds: int) -> dict[str, Any]:
    row: dict[str, Any] = {"op": op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")}
    if any(r in op.name for r in RANDOM):
        return {**row, "class": "skipped", "why": "draws random numbers"}
    try:
        cases = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[:samples]
    except Exception as e:
        return {**row, "class": "skipped", "why": f"no samples: {type(e).__name__}"}
    worst, fallbacks = 0.0, set()
    for sample in cases:
        tensors, rebuild = _leaves(sample)

        def fn(*values: torch.Tensor) -> Any:
            x, args, kwargs = rebuild(list(values))
            return op.op(x, *args, **kwargs)

        try:
            want = _flat(fn(*tensors))
        except Exception as e:
            return {**row, "class": "skipped", "why": f"eager raised {type(e).__name__}"}
        torch._dynamo.reset()
        before = len(disc.reports())
        signal.alarm(seconds)
        try:
            got = _flat(torch.compile(fn, backend="disc", dynamic=True)(*tensors))
        except _Timeout:
            return {**row, "class": "crash", "why": f"over {seconds} s"}
        except Exception as e:
            signal.alarm(0)
            if _dynamo_alone_raises(fn, tensors):
                return {**row, "class": "skipped", "why": f"dynamo itself raised (backend='eager' too): {type(e).__name__}"}
            return {**row, "class": "crash", "why": f"{type(e).__name__}: {e}"[:300]}
        finally:
            signal.alarm(0)
        for r in disc.reports()[before:]:
            fallbacks.update(r.fallbacks)
        if len(got) != len(want):
            return {**row, "class": "wrong", "why": f"{len(got)} outputs, eager {len(want)}"}
        for g, w in zip(got, want):
            if g.shape != w.shape or g.dtype != w.dtype:
                return {**row, "class": "wrong", "why": f"{tuple(g.shape)} {g.dtype}, eager {tuple(w.shape)} {w.dtype}"}
            try:
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, equal_nan=True)
            except AssertionError as e:
                return {**row, "class": "wrong", "why": str(e).splitlines()[-1][:300]}
            if w.is_floating_point() and w.numel():
                scale = max(w.abs().nan_to_num(0, 0, 0).max().item(), 1.0)
                worst = max(worst, ((g - w).abs().nan_to_num(0, 0, 0).max().item()) / scale)
    if not cases:
        return {**row, "class": "skipped", "why": "no samples"}
    cls = "fallback" if fallbacks else "ok"
    return {**row, "class": cls, "worst": worst, "fallbacks": sorted(fallbacks), "samples": len(cases)}


def main() -> None:
    from torch.testing._internal.common_methods_invocations import op_db

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="opinfo_sweep.json")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=120, help="per op, compile and run")
    opts = parser.parse_args()
    signal.signal(signal.SIGALRM, _alarm)
    ops = [o for o in op_db if torch.float32 in o.supported_dtypes("cpu")][opts.start : opts.start + opts.count]
    rows = []
    for op in ops:
        start = time.perf_counter()
        row = check(op, opts.samples, opts.seconds)
        row["seconds"] = round(time.perf_counter() - start, 1)
        rows.append(row)
        if row["class"] not in ("ok", "skipped"):
            print(f"{row['op']:40s} {row['class']:8s} {row.get('why') or row.get('fallbacks')}", flush=True)
        with open(opts.out, "w") as f:
            json.dump(rows, f, indent=1)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["class"]] = counts.get(r["class"], 0) + 1
    print(f"{len(rows)} ops: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), flush=True)


if __name__ == "__main__":
    main()
