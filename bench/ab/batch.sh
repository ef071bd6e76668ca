#!/usr/bin/env bash
# A/B: the torch backend's default max batch (0 = 32 running requests) against the old fixed 16,
# under 32 concurrent requests (256-token prompts, 64 new tokens), everything else equal.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COMMON_FLAGS="${COMMON_FLAGS:---log-level warning}"
PHASES="${PHASES:-c32=random:num=32,min_len=256,max_len=256,max_tokens=64,seed=400}"
ab_run "${NAME:-batch}" "batch16" "--max-batch-size 16" "default" "--max-batch-size 0"
