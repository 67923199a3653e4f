"""A boolean-mask selection inside the native program, against the same graph cut at its ``nonzero``.

    python -m benchmarks.selection [--out PATH] [--rounds N] [--quick]

On the detector workload (conv backbone, then the locations scoring above their image's mean
kept: a data-dependent count), times three ways to run it over the image stream, interleaved in
a balanced order (``benchmarks.timing.interleaved``), median of ``--rounds``:

- eager PyTorch;
- disc's program, where the host flow runs the ``nonzero`` and binds the count mid-call;
- the same compiled graph cut at its ``nonzero``: two native segments with PyTorch's ``nonzero``
  between them, which is how the Triton backend still runs it (and how the CPU one did).

Every result is checked against eager first. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import disc
from benchmarks.timing import interleaved_medians
from benchmarks.workloads import get_workload
from disc.driver import _segmented_executor

SYSTEMS = ("eager", "native", "segments")


def measure(rounds: int, quick: bool) -> list[dict]:
    wl = get_workload("detector")
    torch.manual_seed(0)
    rows = []
    with torch.no_grad():
        model = wl.build().eval()
        cm = disc.compile(model, wl.make_inputs(wl.stream[0], 0), dynamic=wl.dynamic)
        if cm.report.backend.name != "native-cpu":
            raise SystemExit(f"the detector did not compile to one native program: {cm.report.backend.name} ({cm.report.backend.reason})")
        refused = {n: "cut here for the comparison" for n in cm.graph.nodes if n.op == "nonzero"}
        segments, _ = _segmented_executor(cm.graph, {}, refused, gpu=False)
        for shape in wl.stream[:3] if quick else wl.stream:
            (x,) = wl.make_inputs(shape, 1)
            fns = {"eager": lambda: model(x), "native": lambda: cm.executor.run([x]), "segments": lambda: segments.run([x])}
            want = model(x)
            for name in SYSTEMS[1:]:
                [got] = fns[name]()
                if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
                    raise AssertionError(f"{name} differs from eager at {shape}")
            ms = {k: v * 1e3 for k, v in interleaved_medians(fns, rounds, rotate=True).items()}
            rows.append({"shape": shape, **ms, "kept": int(want.shape[0])})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("selection.json"))
    parser.add_argument("--rounds", type=int, default=36)
    parser.add_argument("--quick", action="store_true", help="the first three shapes only")
    opts = parser.parse_args(argv)
    print(f"threads {torch.get_num_threads()}; ms, medians of {opts.rounds} interleaved rounds")
    print("| batch x H x W | kept | eager | one native program | two segments, nonzero in PyTorch | segments / native |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = measure(opts.rounds, opts.quick)
    for r in rows:
        s = r["shape"]
        print(f"| {s['batch']}x{s['height']}x{s['width']} | {r['kept']} | {r['eager']:.2f} | {r['native']:.2f} | {r['segments']:.2f} | {r['segments'] / r['native']:.2f}x |")
    opts.out.write_text(json.dumps({"threads": torch.get_num_threads(), "rounds": opts.rounds, "rows": rows}, indent=1))
    print(f"wrote {opts.out}")


if __name__ == "__main__":
    main()
