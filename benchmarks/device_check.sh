#!/usr/bin/env bash
# The GPU checks on a lent H100/H200, in one command and under 8 minutes, with only what that
# machine has (torch, Triton, transformers; no package registry):
#   bash benchmarks/device_check.sh            # writes under $OUT, or ./device-check
# 1. the GPU benchmark's quick mode, timed alone on the GPU (bf16; eager, disc, inductor with CUDA
#    graphs): Hugging Face BERT-base over 8 shapes of its serving stream, then the Llama-style
#    decoder's prefill (128, 512 tokens) and 32-step decodes at batch 1 and 8 (results are
#    written after each part, so a run cut short by BENCH_SECONDS keeps the stream's);
# 2. the third-party model suite on CUDA (tests/third_party/gpu_suite.sh): every architecture in
#    fp32 (TF32 off and on), bf16, f16 and autocast, inference and training, against eager;
#    beside it, the Triton backend's and the CUDA graphs' own tests on the GPU, and the fused
#    attention's (PyTorch's attention forms, the Llama decode step) on real attention kernels.
# BENCH_ARGS replaces the benchmark's --quick (e.g. "--parts profile --dtype bf16"); SUITE_SECONDS is
# the suite's wall time (pairs not started by then are "not reached"), PAIR_SECONDS one pair's limit.
set -u
out=${OUT:-device-check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout "${BENCH_SECONDS:-330}" python3 -m benchmarks.gpu ${BENCH_ARGS:---quick} --out "$out/bench" 2>&1 | tee "$out/bench.log"
timeout "${SUITE_SECONDS:-150}" python3 -m pytest -q -n 4 -p no:cacheprovider tests/codegen/test_triton.py tests/runtime/test_cuda_graphs.py tests/runtime/test_devices.py tests/passes/test_attention.py "tests/third_party/test_hf_decode.py::test_the_gpu_program_of_a_decode_step_matches_eager" >"$out/pytest.txt" 2>&1 &
JOBS=${JOBS:-12} bash tests/third_party/gpu_suite.sh "$out" "${PAIR_SECONDS:-150}" "${SUITE_SECONDS:-150}" 2>&1 | tee "$out/suite.txt"
wait
tail -30 "$out/pytest.txt"
