#!/usr/bin/env bash
# A/B: prefix caching on (arm A) vs off (arm B), everything else equal.
#
# Default phases (the sizes of the project's targets):
#   prefix4k  shared-prefix, 1 group x 3 prompts, 4,096-token head + 64-token suffix, one at a
#             time: the first is cold, the others warm (warm/cold TTFT, warm-tail speed);
#   agents    8 agents x 3 turns sharing a 2,048-token head (makespan on/off);
#   nohead    the same request lengths with no shared head: all-miss (cold-path cost).
# Override with PHASES, ROUNDS, COMMON_FLAGS (see bench/ab/lib.sh). Summarize with
#   python -m bench.cache.report bench/runs/prefix-cache.jsonl
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COMMON_FLAGS="${COMMON_FLAGS:---kv-blocks 2048 --log-level warning}"
PHASES="${PHASES:-prefix4k=shared-prefix:groups=1,per_group=3,head=4096,suffix=64,max_tokens=4 agents=agents:agents=8,turns=3,head=2048,new=64,max_tokens=8,seed=100 nohead=nohead:agents=8,turns=3,head=2048,new=64,max_tokens=8,seed=200}"
ab_run "${NAME:-prefix-cache}" on --prefix-caching off --no-prefix-caching
