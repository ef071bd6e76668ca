#!/usr/bin/env bash
# On a CUDA machine: tt-serve (the CUDA defaults: graphs, residency, graphed prefill) beside HF
# transformers (+ flash-linear-attention when it imports) on the same random Qwen3.5-0.8B-shape
# checkpoint: bandwidth limit, decode at batch 1/8/32/64, prefill of 4,096 tokens, kernels per
# decode step, the 8-agent 31k-head workload. One ledger line to
# bench/runs/gpu-side-by-side.jsonl (and $OUT/gpu-side-by-side.jsonl when $OUT is set).
# Needs python3 with torch (CUDA), numpy and transformers. Extra arguments go to the driver:
#   bench/gpu/side_by_side.sh --device cpu --tiny    # the dry run, no GPU needed
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec timeout 360 "$PY" -m bench.gpu.side_by_side "$@"
