#!/usr/bin/env bash
# The third-party suite on a lent GPU machine, one process per architecture (16 cores there):
#   bash tests/third_party/gpu_suite.sh OUT_DIR [SECONDS_PER_ARCH]
# Writes OUT_DIR/gpu.json (every row), OUT_DIR/graphs.tar (the IR of graphs the GPU backend left to
# the reference executor, to reproduce on a CPU) and prints one line per architecture and mode.
set -u
out=${1:?output folder}; limit=${2:-270}
work=$(mktemp -d)
export PYTHONPATH=$PWD:$PWD/tests/third_party PYTHONUNBUFFERED=1
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
archs=$(python3 -c "from hf_zoo import ARCHS; print(' '.join(a for a in sorted(ARCHS) if a != 'swin'))")
for a in $archs; do
  timeout "$limit" python3 tests/third_party/gpu_check.py --archs "$a" --out "$work/$a.json" --dump "$work/graphs" >"$work/$a.log" 2>&1 &
done
wait
python3 - "$work" "$out" <<'PY'
import glob, json, sys
work, out = sys.argv[1], sys.argv[2]
rows = []
for f in sorted(glob.glob(f"{work}/*.json")):
    rows += json.load(open(f))
json.dump(rows, open(f"{out}/gpu.json", "w"), indent=1)
for r in rows:
    what = r.get("error", "")[:160] or f"out {r['worst_output']:.1e} grad {r['worst_gradient']:.1e} (eager vs f32: {r['eager_vs_f32']:.0e}, {r['eager_grad_vs_f32']:.0e}) graphs {r['compilations']} fb {r['fallbacks']}"
    print(f"{r['arch']:13s} {r['mode']:10s} {r['seconds']:6.1f}s {what}")
    for p in r.get("programs", []):
        if "NOT compiled" in p or p.startswith("reference"):
            print("      ", p[:240].replace("\n", " "))
PY
[ -d "$work/graphs" ] && tar -cf "$out/graphs.tar" -C "$work" graphs
tar -cf "$out/logs.tar" -C "$work" $(cd "$work" && ls *.log)
for f in "$work"/*.log; do grep -q "^[a-z_0-9]* *autocast-train " "$f" || echo "did not finish: $(basename "$f" .log)"; done
