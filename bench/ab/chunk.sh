#!/usr/bin/env bash
# A/B: two prefill chunk sizes (CHUNK_A vs CHUNK_B, default 256 vs 512), everything else equal.
# Both must be multiples of the block size and of 64 while prefix caching is on.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHUNK_A="${CHUNK_A:-256}"
CHUNK_B="${CHUNK_B:-512}"
COMMON_FLAGS="${COMMON_FLAGS:---kv-blocks 2048 --max-num-batched-tokens 2048 --log-level warning}"
PHASES="${PHASES:-prefix=shared-prefix:groups=2,per_group=3,head=2048,suffix=64,max_tokens=8 random=random:num=8,min_len=256,max_len=2048,max_tokens=8,seed=300}"
ab_run "${NAME:-chunk}" "chunk$CHUNK_A" "--prefill-chunk $CHUNK_A" \
  "chunk$CHUNK_B" "--prefill-chunk $CHUNK_B"
