#!/usr/bin/env bash
# A saved program runs where PyTorch is not installed: `pip install -e .` into a fresh environment
# without torch gives disc_runtime and disc-run, and their outputs equal the PyTorch host's.
# Run by .ci/run after the test suite (it needs the suite's .venv, with torch, to save the program).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv .venv-notorch
.venv-notorch/bin/pip install -q -e .
if .venv-notorch/bin/python -c "import torch" 2>/dev/null; then echo "torch is importable in .venv-notorch" >&2; exit 1; fi
.venv/bin/python - "$work" <<'PY'
import sys, numpy as np, torch, disc, disc.models as zoo
work = sys.argv[1]
e = zoo.get("bert")
cm = disc.compile(e.build(), e.inputs(e.export_shape), dynamic=dict(e.dynamic))
disc.save(cm, f"{work}/bert")
for k, shape in enumerate([{"batch": 1, "seq": 1}, {"batch": 3, "seq": 13}]):
    ids, mask = e.inputs(shape, seed=k)
    np.save(f"{work}/ids{k}.npy", ids.numpy()); np.save(f"{work}/mask{k}.npy", mask.numpy())
    with torch.no_grad():
        for j, out in enumerate(cm(ids, mask)):
            np.save(f"{work}/want{k}.{j}.npy", out.numpy())
PY
for k in 0 1; do
  .venv-notorch/bin/disc-run "$work/bert" --input "input_ids=$work/ids$k.npy" --input "attention_mask=$work/mask$k.npy" --output "$work/got$k"
done
.venv-notorch/bin/python - "$work" <<'PY'
import sys, numpy as np
work = sys.argv[1]
for k in (0, 1):
    for j in (0, 1):
        np.testing.assert_allclose(np.load(f"{work}/got{k}/output{j}.npy"), np.load(f"{work}/want{k}.{j}.npy"), rtol=1e-6, atol=1e-6)
print("standalone without torch: disc-run outputs equal the PyTorch host's")
PY
