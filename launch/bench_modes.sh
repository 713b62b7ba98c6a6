#!/usr/bin/env bash
# Compare EAGLE3, cache-only, the score rule and HVD on the same requests (NOT RUN HERE: needs a GPU).
#
#   GATE=gate CONVERSATIONS=convs.jsonl TOKENIZER=tok_dir bash launch/bench_modes.sh
#
# For each mode it starts launch/serve_qwen3_8b.sh and runs SGLang's serving benchmark
# (python -m sglang.bench_serving) on every assistant turn of CONVERSATIONS, rendered with
# the model's chat template (launch/to_sharegpt.py), then sends the same turns through
# `hvd collect` (temperature 0) and prints wall time, output tokens/s and SGLang's mean
# accept length with HVD's cache pick rate from /server_info:
#   eagle3      --hvd-disable (plain SGLang EAGLE3)
#   cache_only  --hvd-threshold -1 --hvd-eagle-reserve 0 --hvd-cache-siblings 0 (every
#               non-empty cache draft is verified as a chain; at topk > 1 EAGLE3 keeps the
#               nodes a short cache draft leaves)
#   rule        --hvd-score-rule C: a cache row when the cache draft's score >= C
#               (RULE_SCORE, default the gate's calibrated rule_threshold from gate.json)
#   hvd         the gate's calibrated threshold
set -euo pipefail
: "${GATE:?}" "${CONVERSATIONS:?}" "${TOKENIZER:?}"
PORT=${PORT:-30000}
CONCURRENCY=${CONCURRENCY:-16}
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
python "$(dirname "$0")/to_sharegpt.py" "$CONVERSATIONS" --tokenizer "$TOKENIZER" -o "$OUT/prompts.json"
RULE_SCORE=${RULE_SCORE:-$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["rule_threshold"])' "$GATE/gate.json")}
for mode in eagle3 cache_only rule hvd; do
  case $mode in
    eagle3) extra=(--hvd-disable) ;;
    cache_only) extra=(--hvd-threshold -1 --hvd-eagle-reserve 0 --hvd-cache-siblings 0) ;;
    rule) extra=(--hvd-score-rule "$RULE_SCORE") ;;
    hvd) extra=() ;;
  esac
  GATE=$GATE PORT=$PORT bash "$(dirname "$0")/serve_qwen3_8b.sh" "${extra[@]}" > "$OUT/server-$mode.log" 2>&1 &
  pid=$!
  until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do sleep 5; done
  python -m sglang.bench_serving --backend sglang --port "$PORT" --dataset-name sharegpt \
      --dataset-path "$OUT/prompts.json" --num-prompts "${NUM_PROMPTS:-500}" --max-concurrency "$CONCURRENCY" \
      --output-file "$OUT/bench-serving-$mode.jsonl" > "$OUT/bench-serving-$mode.txt"
  start=$(date +%s.%N)
  hvd collect "$CONVERSATIONS" --server "http://127.0.0.1:$PORT" --tokenizer "$TOKENIZER" \
      -o "$OUT/traces-$mode.jsonl" --concurrency "$CONCURRENCY" --json "$OUT/collect-$mode.json" > /dev/null
  end=$(date +%s.%N)
  curl -s "http://127.0.0.1:$PORT/server_info" > "$OUT/server-info-$mode.json"
  python - "$mode" "$start" "$end" "$OUT" <<'PY'
import json, sys
mode, start, end, out = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
c = json.load(open(f"{out}/collect-{mode}.json"))
info = json.load(open(f"{out}/server-info-{mode}.json"))
acc = [(s.get("avg_spec_accept_length"), s.get("hvd", {}).get("cache_pick_rate")) for s in info.get("internal_states", []) if isinstance(s, dict)]
print(f"{mode:10s} {end - start:8.1f} s  {c['output_tokens'] / (end - start):9.1f} output tok/s  (accept length, HVD cache pick rate) {acc}")
PY
  kill "$pid"; wait "$pid" || true
done
