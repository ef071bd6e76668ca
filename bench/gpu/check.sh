#!/usr/bin/env bash
# On a CUDA machine: graph vs eager, warm vs cold and pipelined vs synchronous token equality;
# decode-step, engine decode (deviceResident pipelined vs synchronous) and TTFT timings
# of the torch backend on a random-weight ~0.75B Qwen3.5 model; appends one JSON ledger line to
# bench/runs/gpu-check.jsonl (and to $OUT/gpu-check.jsonl when $OUT is set).
# Needs python3 with torch (CUDA) and numpy only. Extra arguments go to the driver, e.g.
#   bench/gpu/check.sh --device cpu --tiny     # the dry run, no GPU needed
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
"$PY" - <<'PY'
import sys
import torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"cuda {torch.version.cuda}, devices {torch.cuda.device_count()}")
PY
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec timeout 560 "$PY" -m bench.gpu.check "$@"
