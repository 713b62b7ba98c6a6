#!/usr/bin/env bash
# Several HVD servers behind sglang-router (NOT RUN HERE ON GPUs: the same layout ran on the
# CPU test harness, tests/sglang_cpu/test_e2e_hvd.py and launch/bench/engine_eval.py --replicas).
#
#   GATE=path/to/gate REPLICAS=2 bash launch/serve_router.sh
#
# Starts REPLICAS servers with launch/serve_qwen3_8b.sh on ports PORT+1..PORT+REPLICAS (one
# GPU each: CUDA_VISIBLE_DEVICES=i), then sglang-router (pip install '.[router]' in the sglang-hvd checkout)
# on PORT with POLICY (default cache_aware: a conversation's turns go to the replica that
# served its prefix, whose HVD cache holds the earlier turns; see README "A fleet" for the
# measured difference to round_robin). Check that every replica serves the same gate with
# `hvd status http://127.0.0.1:$((PORT+1)) ...`.
#
# Rolling a new gate: restart one replica at a time with the new GATE; the router retries
# a request that hits a restarting replica on another one, so requests keep flowing.
set -euo pipefail
: "${GATE:?set GATE to a gate directory (hvd train -o GATE ...)}"
PORT=${PORT:-30000}
REPLICAS=${REPLICAS:-2}
POLICY=${POLICY:-cache_aware}
urls=()
for i in $(seq 1 "$REPLICAS"); do
  CUDA_VISIBLE_DEVICES=$((i - 1)) PORT=$((PORT + i)) GATE=$GATE bash "$(dirname "$0")/serve_qwen3_8b.sh" \
    > "replica-$i.log" 2>&1 &
  urls+=("http://127.0.0.1:$((PORT + i))")
done
for u in "${urls[@]}"; do
  until curl -sf "$u/health" > /dev/null; do sleep 5; done
done
exec python -m sglang_router.launch_router --worker-urls "${urls[@]}" --policy "$POLICY" --host 0.0.0.0 --port "$PORT"
