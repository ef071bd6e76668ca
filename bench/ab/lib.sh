# Shared A/B harness, sourced by bench/ab/*.sh.
#
# ab_run NAME LABEL_A FLAG_A LABEL_B FLAG_B
#   Boots arm A (tt-serve serve $COMMON_FLAGS $FLAG_A) and arm B ($COMMON_FLAGS $FLAG_B) on free
#   loopback ports, waits for /health, runs an unrecorded warm-up on each, then ROUNDS rounds in
#   the order A B, B A, A B, ... Each round runs every phase of PHASES on both arms and appends
#   one JSON line to $LEDGER_DIR/NAME.jsonl (python -m bench.load.ledger round). The arms are always
#   killed on exit (trap), and every wait is bounded.
#
# Environment:
#   PYTHON          interpreter with tt_serve and bench importable (default: .venv/bin/python
#                   when present, else python3)
#   TT_SERVE        server command (default: "$PYTHON -m tt_serve.cli")
#   COMMON_FLAGS    flags both arms get (e.g. --model DIR --kv-blocks 2048)
#   PHASES          space-separated NAME=kind:key=value,... (bench/load/workloads.py)
#   ROUNDS          rounds (default 2)
#   WARMUP          the unrecorded warm-up workload (default: 2 short random prompts)
#   LEDGER_DIR      where NAME.jsonl goes (default bench/runs)
#   OUT_DIR         server logs (default bench/out/NAME; git-ignored)
#   HEALTH_TIMEOUT  seconds to wait for /health (default 300)

set -euo pipefail

BENCH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$BENCH_ROOT"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
TT_SERVE="${TT_SERVE:-$PYTHON -m tt_serve.cli}"
ROUNDS="${ROUNDS:-2}"
LEDGER_DIR="${LEDGER_DIR:-bench/runs}"
HEALTH_TIMEOUT="${HEALTH_TIMEOUT:-300}"
COMMON_FLAGS="${COMMON_FLAGS:-}"
WARMUP="${WARMUP:-random:num=2,min_len=64,max_len=128,max_tokens=2}"
ARM_PIDS=()

ab_free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

ab_kill_arms() {
  local pid i
  for pid in "${ARM_PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${ARM_PIDS[@]}"; do
    for i in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  ARM_PIDS=()
}

# ab_boot LOG PORT FLAGS... : start one arm in the background, remember its pid.
ab_boot() {
  local log="$1" port="$2"
  shift 2
  # shellcheck disable=SC2086  # TT_SERVE is a command line on purpose
  $TT_SERVE serve --host 127.0.0.1 --port "$port" "$@" >"$log" 2>&1 &
  ARM_PIDS+=("$!")
}

# ab_wait_health URL PID LOG : bounded wait for 200 from /health; fail if the arm died.
ab_wait_health() {
  local url="$1" pid="$2" log="$3" deadline=$((SECONDS + HEALTH_TIMEOUT))
  while ((SECONDS < deadline)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "arm at $url exited during startup; log:" >&2
      tail -n 30 "$log" >&2
      return 1
    fi
    if "$PYTHON" -c 'import sys, httpx; sys.exit(httpx.get(sys.argv[1] + "/health", timeout=5).status_code != 200)' "$url" 2>/dev/null; then
      return 0
    fi
    sleep 1
  done
  echo "arm at $url not healthy after ${HEALTH_TIMEOUT}s" >&2
  return 1
}

ab_run() {
  local name="$1" label_a="$2" flag_a="$3" label_b="$4" flag_b="$5"
  local out="${OUT_DIR:-bench/out/$name}" ledger="$LEDGER_DIR/$name.jsonl"
  local port_a port_b url_a url_b r order phase_args=() p
  [[ -n "${PHASES:-}" ]] || { echo "PHASES is empty" >&2; return 2; }
  for p in $PHASES; do phase_args+=(--phase "$p"); done
  mkdir -p "$out" "$LEDGER_DIR"
  trap ab_kill_arms EXIT
  trap 'exit 130' INT TERM
  # The sources the arms run are the ones present when they boot: record those.
  "$PYTHON" -m bench.load.ledger git >"$out/boot-git.json"
  port_a="$(ab_free_port)"
  port_b="$(ab_free_port)"
  while [[ "$port_b" == "$port_a" ]]; do port_b="$(ab_free_port)"; done
  url_a="http://127.0.0.1:$port_a"
  url_b="http://127.0.0.1:$port_b"
  # shellcheck disable=SC2086  # flag strings are word-split on purpose
  ab_boot "$out/arm-A.log" "$port_a" $COMMON_FLAGS $flag_a
  # shellcheck disable=SC2086
  ab_boot "$out/arm-B.log" "$port_b" $COMMON_FLAGS $flag_b
  ab_wait_health "$url_a" "${ARM_PIDS[0]}" "$out/arm-A.log"
  ab_wait_health "$url_b" "${ARM_PIDS[1]}" "$out/arm-B.log"
  echo "arms up: A ($label_a) $url_a, B ($label_b) $url_b"
  "$PYTHON" -m bench.load.ledger warmup --url "$url_a" --workload "$WARMUP"
  "$PYTHON" -m bench.load.ledger warmup --url "$url_b" --workload "$WARMUP"
  for r in $(seq 1 "$ROUNDS"); do
    if ((r % 2)); then order=AB; else order=BA; fi
    "$PYTHON" -m bench.load.ledger round --name "$name" --ledger "$ledger" --round "$r" \
      --order "$order" \
      --url-a "$url_a" --flags-a "$COMMON_FLAGS $flag_a" --label-a "$label_a" \
      --pid-a "${ARM_PIDS[0]}" \
      --url-b "$url_b" --flags-b "$COMMON_FLAGS $flag_b" --label-b "$label_b" \
      --pid-b "${ARM_PIDS[1]}" --boot-git "$out/boot-git.json" \
      "${phase_args[@]}"
  done
  ab_kill_arms
  echo "ledger: $ledger"
}
