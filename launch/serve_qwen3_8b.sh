#!/usr/bin/env bash
# Serve Qwen3-8B with EAGLE3 + HVD on one GPU (NOT RUN HERE: written against sglang 0.5.23's
# flags; the development machine has no GPU).
#
#   GATE=path/to/gate bash launch/serve_qwen3_8b.sh
#
# GATE: a gate trained on traces of this model (hvd collect + hvd train). MODEL / DRAFT /
# PORT can be overridden. HVD needs chain drafts (topk 1) and the non-overlap scheduler.
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen3-8B}
DRAFT=${DRAFT:-Tengyunw/qwen3_8b_eagle3}
PORT=${PORT:-30000}
: "${GATE:?set GATE to a gate directory (hvd train -o GATE ...)}"
exec python -m sglang_hvd.launch_server \
  --model-path "$MODEL" --port "$PORT" \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path "$DRAFT" \
  --speculative-eagle-topk 1 --speculative-num-steps 3 --speculative-num-draft-tokens 4 \
  --disable-overlap-schedule \
  --hvd-gate "$GATE" ${RECORD:+--hvd-record-traces "$RECORD"} "$@"
