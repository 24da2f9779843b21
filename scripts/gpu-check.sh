#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, in one run, on a machine with onnxruntime-gpu and torch (CUDA) installed
# (CI has no GPU: there these tests skip). Logs go to $OUT (default ./gpu-check):
#   gpu.txt          the GPU, its driver, onnxruntime's providers, host<->device copy rates (pageable, pinned)
#   cuda-tests.log   the CUDA tests: parity with I/O binding, llama3_1 B=1 S=8192 is 413 or 200, device memory
#                    after 20 mixed large requests, pinned shared memory and outputs copied into it
#   gpu-table.log    python -m bench infer --device cuda: the GPU table and its ratios
#   scripts/gpu-check.sh            # REPEAT=5 (rounds per bench column), PYTEST_TIMEOUT=300, BENCH_TIMEOUT=400
set -uo pipefail
out=${OUT:-gpu-check}
mkdir -p "$out"
status=0
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 - <<'PY'
import time

import onnxruntime as ort
import torch

print("onnxruntime", ort.__version__, ort.get_available_providers(), "| torch", torch.__version__)
size = 256 << 20
device = torch.empty(size, dtype=torch.uint8, device="cuda")
for name, host in (("pageable", torch.ones(size, dtype=torch.uint8)),
                   ("pinned", torch.ones(size, dtype=torch.uint8).pin_memory())):
    rates = {}
    for direction in ("host->device", "device->host"):
        best = float("inf")
        for _ in range(5):
            torch.cuda.synchronize()
            start = time.perf_counter()
            (device.copy_(host) if direction == "host->device" else host.copy_(device))
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        rates[direction] = size / best / 1e9
    print(f"{name}: " + ", ".join(f"{d} {r:.1f} GB/s" for d, r in rates.items()) + " (256 MiB, best of 5)")
PY
} 2>&1 | tee "$out/gpu.txt" || status=1
timeout "${PYTEST_TIMEOUT:-300}" python3 -m pytest -p no:cacheprovider -rA -s -W default \
  tests/inference/test_engine.py tests/inference/test_run_bound.py tests/inference/test_shared_memory_pinning.py \
  -k cuda 2>&1 | tee "$out/cuda-tests.log" || status=1
PYTHONUNBUFFERED=1 timeout "${BENCH_TIMEOUT:-400}" python3 -m bench infer --device cuda --repeat "${REPEAT:-5}" 2>&1 \
  | tee "$out/gpu-table.log" || status=1
exit $status
