#!/usr/bin/env bash
# The third-party suite on a lent GPU machine: one process per (architecture, mode) pair, a pool of
# JOBS at a time (16 cores there), training modes first (they were the least measured):
#   bash tests/third_party/gpu_suite.sh OUT_DIR [SECONDS_PER_PAIR] [WALL_SECONDS]
# Writes OUT_DIR/gpu.json (every row), OUT_DIR/graphs.tar (the IR of graphs the GPU backend left to
# the reference executor, to reproduce on a CPU) and prints one line per architecture and mode; a
# pair not started before WALL_SECONDS is listed as "not reached".
set -u
out=${1:?output folder}; limit=${2:-150}; wall=${3:-330}
jobs=${JOBS:-14}
work=$(mktemp -d)
export PYTHONPATH=$PWD:$PWD/tests/third_party PYTHONUNBUFFERED=1
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
archs=${ARCHS:-$(python3 -c "from hf_zoo import ARCHS; print(' '.join(a for a in sorted(ARCHS) if a != 'swin'))")}
modes=${MODES:-train autocast-train infer bf16-infer f16-infer autocast-infer tf32-infer}
deadline=$(( $(date +%s) + wall ))
for m in $modes; do for a in $archs; do echo "$a $m"; done; done |
  DEADLINE=$deadline LIMIT=$limit WORK=$work xargs -P "$jobs" -L 1 sh -c '
    [ "$(date +%s)" -lt "$DEADLINE" ] || exit 0
    left=$(( DEADLINE + LIMIT / 2 - $(date +%s) )); [ "$left" -lt "$LIMIT" ] && t=$left || t=$LIMIT
    timeout "$t" python3 tests/third_party/gpu_check.py --archs "$0" --modes "$1" --device "${DEVICE:-cuda}" --out "$WORK/$0-$1.json" --dump "$WORK/graphs" >"$WORK/$0-$1.log" 2>&1 || echo "$0 $1: exit $? after at most ${t}s"'
python3 - "$work" "$out" "$archs" "$modes" <<'PY'
import glob, json, sys
work, out, archs, modes = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
rows = []
for f in sorted(glob.glob(f"{work}/*.json")):
    rows += json.load(open(f))
done = {(r["arch"], r["mode"]) for r in rows}
json.dump(rows, open(f"{out}/gpu.json", "w"), indent=1)
for r in sorted(rows, key=lambda r: (r["arch"], modes.index(r["mode"]))):
    what = r.get("error", "")[:160] or f"out {r['worst_output']:.1e} grad {r['worst_gradient']:.1e} (eager vs f32: {r['eager_vs_f32']:.0e}, {r['eager_grad_vs_f32']:.0e}) graphs {r['compilations']} fb {r['fallbacks']}"
    print(f"{r['arch']:13s} {r['mode']:14s} {r['seconds']:6.1f}s {what}")
    for p in r.get("programs", []):
        if "NOT compiled" in p or p.startswith("reference"):
            print("      ", p[:240].replace("\n", " "))
missing = [f"{a}/{m}" for m in modes for a in archs if (a, m) not in done]
print(f"{len(rows)} of {len(archs) * len(modes)} pairs finished; not finished: {' '.join(missing) or 'none'}")
PY
[ -d "$work/graphs" ] && tar -cf "$out/graphs.tar" -C "$work" graphs
tar -cf "$out/logs.tar" -C "$work" $(cd "$work" && ls *.log)
