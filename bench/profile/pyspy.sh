#!/usr/bin/env bash
# py-spy profiles of one cold and one warm request on a prefix-caching server.
#
# Boots `tt-serve serve` on a free loopback port, waits for /health, then for each of
# cold (HEAD + suffix 1: nothing cached) and warm (HEAD + suffix 2: the head is cached) records
# the server with py-spy while that single request runs: a flame graph (SVG) and a speedscope
# JSON per request, in $OUT_DIR (default bench/profile/out, git-ignored). The server is always
# killed on exit.
#
# Environment: PYTHON, TT_SERVE (as in bench/ab/lib.sh), SERVE_FLAGS (default: demo model),
# HEAD (default 2048), SUFFIX (64), MAX_TOKENS (4), VOCAB (0: Qwen ids), PY_SPY (py-spy),
# RATE (samples/s, default 100), HEALTH_TIMEOUT (300).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
TT_SERVE="${TT_SERVE:-$PYTHON -m tt_serve.cli}"
PY_SPY="${PY_SPY:-$(dirname "$PYTHON")/py-spy}"
[[ -x "$PY_SPY" ]] || PY_SPY=py-spy
OUT_DIR="${OUT_DIR:-bench/profile/out}"
HEAD="${HEAD:-2048}" SUFFIX="${SUFFIX:-64}" MAX_TOKENS="${MAX_TOKENS:-4}" VOCAB="${VOCAB:-0}"
RATE="${RATE:-100}" HEALTH_TIMEOUT="${HEALTH_TIMEOUT:-300}"
SERVE_FLAGS="${SERVE_FLAGS:---log-level warning}"
mkdir -p "$OUT_DIR"

PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 1
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
url="http://127.0.0.1:$port"
# shellcheck disable=SC2086  # command and flag strings are word-split on purpose
$TT_SERVE serve --host 127.0.0.1 --port "$port" $SERVE_FLAGS >"$OUT_DIR/server.log" 2>&1 &
server=$!
PIDS+=("$server")
deadline=$((SECONDS + HEALTH_TIMEOUT))
until "$PYTHON" -c 'import sys, httpx; sys.exit(httpx.get(sys.argv[1] + "/health", timeout=5).status_code != 200)' "$url" 2>/dev/null; do
  kill -0 "$server" 2>/dev/null || { tail -n 30 "$OUT_DIR/server.log" >&2; exit 1; }
  ((SECONDS < deadline)) || { echo "server not healthy after ${HEALTH_TIMEOUT}s" >&2; exit 1; }
  sleep 1
done

# request NAME SUFFIX_SEED: one completion of HEAD + a suffix; prints cached tokens and time.
request() {
  "$PYTHON" - "$url" "$HEAD" "$SUFFIX" "$MAX_TOKENS" "$VOCAB" "$2" <<'PY'
import sys, time, random, httpx
from bench.load.workloads import token_range
url, head, suffix, max_tokens, vocab, seed = sys.argv[1], *map(int, sys.argv[2:])
lo, hi = token_range(vocab)
h = random.Random("pyspy-head")
prompt = [h.randrange(lo, hi) for _ in range(head)]
s = random.Random(f"pyspy-suffix-{seed}")
prompt += [s.randrange(lo, hi) for _ in range(suffix)]
t = time.perf_counter()
r = httpx.post(f"{url}/v1/completions", timeout=1800, json={
    "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
r.raise_for_status()
cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
print(f"prompt {len(prompt)} cached {cached} seconds {time.perf_counter() - t:.3f}")
PY
}

for phase in cold warm; do
  seed=1
  [[ "$phase" == warm ]] && seed=2
  "$PY_SPY" record --nonblocking --rate "$RATE" --pid "$server" --format flamegraph \
    --output "$OUT_DIR/$phase.svg" >"$OUT_DIR/$phase-svg.log" 2>&1 &
  svg=$!
  "$PY_SPY" record --nonblocking --rate "$RATE" --pid "$server" --format speedscope \
    --output "$OUT_DIR/$phase.speedscope.json" >"$OUT_DIR/$phase-speedscope.log" 2>&1 &
  ss=$!
  PIDS+=("$svg" "$ss")
  sleep 1
  echo "$phase: $(request "$phase" "$seed")"
  kill -INT "$svg" "$ss" 2>/dev/null || true
  wait "$svg" "$ss" || true
done
ls -l "$OUT_DIR"
