"""``disc-run``: run a saved disc program on .npy files, with numpy alone.

    disc-run model.disc --input ids=ids.npy --input mask=mask.npy --output out/
    disc-run model.disc ids.npy mask.npy --bench 100
    disc-run model.disc --info

Each output is written as ``out/output<k>.npy``. ``--bench N`` runs N more calls after one warm-up
and prints latency percentiles with the CPU they ran on.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import disc_runtime
from disc.codegen.cpu.toolchain import cpu_model
from disc.errors import DiscError


def _read(path: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)  # nothing is executed from data files
    except (OSError, ValueError) as e:
        raise SystemExit(f"disc-run: cannot read {path}: {e}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="disc-run", description="Run a saved disc program (a folder written by disc.save) on .npy inputs.")
    parser.add_argument("folder", help="the saved program")
    parser.add_argument("files", nargs="*", help="inputs in the program's order (.npy)")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input by name")
    parser.add_argument("--output", metavar="DIR", help="write each output to DIR/output<k>.npy")
    parser.add_argument("--bench", type=int, default=0, metavar="N", help="time N calls and print latency percentiles")
    parser.add_argument("--info", action="store_true", help="print the program's inputs and outputs and stop")
    args = parser.parse_args(argv)
    try:
        model = disc_runtime.load(args.folder)
    except DiscError as e:
        print(f"disc-run: {e}", file=sys.stderr)
        return 1
    if args.info or not (args.files or args.input):
        print(f"{model.name}: {args.folder}")
        for kind, infos in (("input", model.inputs), ("output", model.outputs)):
            for t in infos:
                print(f"  {kind} {t.name}: {t.dtype}[{', '.join(str(d) for d in t.dims)}]")
        return 0
    named = {}
    for item in args.input:
        name, sep, path = item.partition("=")
        if not sep:
            parser.error(f"--input takes NAME=FILE.npy, got {item!r}")
        named[name] = _read(path)
    if args.files and named:
        parser.error("give the inputs by position or with --input, not both")
    inputs = [_read(p) for p in args.files]
    try:
        outputs = model.run(named) if named else model.run(*inputs)
        if args.bench > 0:
            times = []
            for _ in range(args.bench):
                start = time.perf_counter()
                model.run(named) if named else model.run(*inputs)
                times.append((time.perf_counter() - start) * 1e3)
            p50, p90, p99 = np.percentile(times, [50, 90, 99])
            print(f"{args.bench} calls on {cpu_model()}: p50 {p50:.3f} ms, p90 {p90:.3f} ms, p99 {p99:.3f} ms, mean {np.mean(times):.3f} ms")
    except DiscError as e:
        print(f"disc-run: {e}", file=sys.stderr)
        return 2 if isinstance(e, (disc_runtime.InputError, disc_runtime.ShapeError)) else 1
    for k, out in enumerate(outputs):
        print(f"output{k}: {out.dtype.name if model.outputs[k].dtype != 'bf16' else 'bf16 (as uint16 bits)'}{list(out.shape)}")
        if args.output:
            Path(args.output).mkdir(parents=True, exist_ok=True)
            np.save(Path(args.output) / f"output{k}.npy", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
