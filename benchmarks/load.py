"""What ``disc.load`` costs beyond reading a saved program's constants, and that it runs no compiler.

Run as ``python -m benchmarks.load [--size base] [--out DIR] [--rounds 5]``. Compiles the zoo's
BERT (``--size``: tiny, small or base), saves it, then per round starts a fresh process that
(1) reads ``constants.bin`` into memory the way loading does (the floor: the bytes must be read)
and (2) runs ``disc.load`` on the folder with the C++ toolchain's ``build`` wrapped to raise when it
would compile (a build-cache hit, such as the RAL's, is fine), so a load that needed the compiler fails. The page cache is warm after the first
round for both, alike. Writes ``results.md`` and ``results.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = r"""
import json, os, sys, time
folder = sys.argv[1]
t0 = time.perf_counter()
blob = bytearray(os.path.getsize(folder + "/constants.bin"))
with open(folder + "/constants.bin", "rb") as f:
    f.readinto(blob)
read_s = time.perf_counter() - t0
del blob
import torch, disc
import disc.codegen.cpu.toolchain as toolchain
cached_build = toolchain.build
def no_compiler(*args, **kwargs):  # a library found in the build cache is fine; compiling one is not
    result = cached_build(*args, **kwargs)
    if not result.cached:
        raise AssertionError("disc.load ran the C++ compiler")
    return result
toolchain.build = no_compiler
t0 = time.perf_counter()
cm = disc.load(folder)
load_s = time.perf_counter() - t0
ids = torch.ones(1, 8, dtype=torch.int64)
cm(ids, torch.ones_like(ids))
print(json.dumps({"read_constants_s": read_s, "load_s": load_s, "backend": cm.report.backend.name}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="base", choices=("tiny", "small", "base"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="benchmarks/results/load")
    args = p.parse_args()

    import torch

    import disc
    import disc.models as zoo
    from benchmarks.machine import cpu_name

    entry = zoo.get("bert")
    model = entry.build(args.size)
    with torch.no_grad():
        cm = disc.compile(model, entry.inputs(entry.export_shape), dynamic=dict(entry.dynamic))
    with tempfile.TemporaryDirectory() as tmp:
        folder = disc.save(cm, Path(tmp) / "bert.disc")
        size_mb = (folder / "constants.bin").stat().st_size / 1e6
        rounds = []
        for _ in range(args.rounds):
            proc = subprocess.run([sys.executable, "-c", PROBE, str(folder)], capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"the load probe failed:\n{proc.stderr[-3000:]}")
            rounds.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    read = statistics.median(r["read_constants_s"] for r in rounds)
    load = statistics.median(r["load_s"] for r in rounds)
    result = {
        "cpu": cpu_name(),
        "model": f"bert-{args.size}",
        "constants_mb": round(size_mb, 1),
        "read_constants_s": read,
        "load_s": load,
        "beyond_reading_s": load - read,
        "backend": rounds[0]["backend"],
        "rounds": rounds,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    table = "\n".join(
        [
            f"disc.load of bert-{args.size} ({size_mb:.0f} MB of constants), {result['cpu']}, median of {args.rounds} fresh processes, no compiler run:",
            "",
            "| read constants.bin | disc.load | beyond reading |",
            "|---:|---:|---:|",
            f"| {read:.3f} s | {load:.3f} s | {load - read:.3f} s |",
        ]
    )
    (out / "results.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
