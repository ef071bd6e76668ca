#!/usr/bin/env bash
# A/B: sglang-router cache_aware (arm A) vs round_robin (arm B) over 3 CPU replicas
# (OMP_NUM_THREADS=1 each, scripts/serve-replicas), plus a single server hit directly (the
# ceiling) and a fault phase (cache_aware; the busiest worker SIGKILLed once 40 % of the agents' requests
# have finished, then the prefix phase runs on what is left). One ledger line per arm in
# $LEDGER (bench/runs/router.jsonl) and a plot (bench/out/router.png).
#
# Phases (bench/load/workloads.py, sent as text: the router refuses token ids):
#   agents  8 agents x 3 turns sharing a 2,048-token head (seeded)
#   prefix  shared-prefix: 3 groups x 3 prompts, 1,024-token heads, 3 at a time
# Override with PHASES, REPLICAS, MODEL (default: a demo model written to bench/out/router).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PYTHON="${PYTHON:-.venv/bin/python}"
OUT="${OUT:-bench/out/router}"
LEDGER="${LEDGER:-bench/runs/router.jsonl}"
REPLICAS="${REPLICAS:-3}"
PHASES="${PHASES:-agents=agents:agents=8,turns=3,head=2048,new=64,max_tokens=32,seed=100 prefix=shared-prefix:groups=3,per_group=3,head=1024,suffix=64,max_tokens=4,concurrency=3,seed=7}"
mkdir -p "$OUT"
MODEL="${MODEL:-$OUT/demo}"
[[ -f "$MODEL/config.json" ]] || "$PYTHON" -m tt_serve.cli demo-model "$MODEL" >/dev/null
WORKER_FLAGS=(--model "$MODEL" --served-model-name demo --kv-blocks 2048 --log-level warning)
PID=""

free_base() {  # a base port with $1 free ports after it, and two more for router/metrics
  "$PYTHON" - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1]) + 2
for _ in range(200):
    base = random.randrange(20000, 60000)
    socks = []
    try:
        for p in range(base, base + n):
            s = socket.socket(); s.bind(("127.0.0.1", p)); socks.append(s)
        print(base); break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
PY
}

stop_arm() {
  if [[ -n "$PID" ]]; then
    kill -INT "$PID" 2>/dev/null || true
    timeout 90 tail --pid="$PID" -f /dev/null || kill -KILL "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
    PID=""
  fi
}
trap stop_arm EXIT

# run_arm LABEL POLICY NREPLICAS [bench.load.router flags...]
run_arm() {
  local label="$1" policy="$2" n="$3"
  shift 3
  local base state="$OUT/$label.state.json"
  base="$(free_base "$n")"
  rm -f "$state"
  "$PYTHON" scripts/serve-replicas --replicas "$n" --policy "$policy" \
    --worker-base-port "$((base + 2))" --port "$base" --prometheus-port "$((base + 1))" \
    --threads 1 --state-file "$state" --log-dir "$OUT/logs-$label" -- "${WORKER_FLAGS[@]}" \
    >"$OUT/$label.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 600); do
    [[ -f "$state" ]] && break
    kill -0 "$PID" 2>/dev/null || { cat "$OUT/$label.log"; exit 1; }
    sleep 0.5
  done
  [[ -f "$state" ]] || { echo "router.sh: $label did not start" >&2; exit 1; }
  local phase_args=()
  for ph in $PHASES; do phase_args+=(--phase "$ph"); done
  timeout 900 "$PYTHON" -m bench.load.router --state "$state" --model "$MODEL" \
    --label "$label" --ledger "$LEDGER" "${phase_args[@]}" "$@"
  stop_arm
}

run_arm cache_aware cache_aware "$REPLICAS"
run_arm round_robin round_robin "$REPLICAS"
run_arm single cache_aware 1 --direct
run_arm fault cache_aware "$REPLICAS" --fault-after 0.4
"$PYTHON" -m bench.load.plot "$LEDGER" --out bench/out/router.png
