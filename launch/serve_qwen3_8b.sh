#!/usr/bin/env bash
# Serve Qwen3-8B with EAGLE3 + HVD on one GPU (NOT RUN HERE: written against sglang 0.5.23's
# flags; the development machine has no GPU).
#
#   GATE=path/to/gate bash launch/serve_qwen3_8b.sh
#
# GATE: a gate trained on traces of this model (hvd collect + hvd train) for the verify shape
# below (hvd train --verify-topk/--verify-steps/--verify-nodes; the server refuses a gate
# trained for another shape). MODEL / DRAFT / PORT / TOPK / STEPS / NODES / ATTENTION can be
# overridden. The recommended shape: EAGLE3 trees of topk 4, 3 steps, 16 tokens per verify
# row, so a cache draft is verified 15 tokens at a time (README: "Serving with SGLang").
# Tree rows need an attention backend that reads SGLang's tree mask (flashinfer, fa3,
# triton; not trtllm_mha). HVD needs the non-overlap scheduler.
# More GPUs: TP=2 (tensor parallelism: rank 0 decides, every rank verifies its rows) and/or
# DP=2 (data parallelism: each rank its own HVD worker and cache; RECORD=t.jsonl then writes
# t.dp0.jsonl, t.dp1.jsonl). Both ran on the CPU test harness only, never on GPUs.
# PROFILE: cost-aware verification, each step's verify tier (off, 4-1-2, 4-1-4, 4-2-8, 4-3-16,
# with or without EAGLE3's draft) picked under a step-time profile: qwen3-8b-h200 (the default,
# a roofline estimate), qwen3-8b-h100, or a file measured with `hvd profile`; PROFILE= (empty)
# serves the static shape (docs/serving.md: "Cost-aware verification").
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen3-8B}
DRAFT=${DRAFT:-Tengyunw/qwen3_8b_eagle3}
PORT=${PORT:-30000}
TOPK=${TOPK:-4}
STEPS=${STEPS:-3}
NODES=${NODES:-16}
ATTENTION=${ATTENTION:-flashinfer}
PROFILE=${PROFILE-qwen3-8b-h200}
: "${GATE:?set GATE to a gate directory (hvd train -o GATE ...)}"
exec python -m sglang_hvd.launch_server \
  --model-path "$MODEL" --port "$PORT" --attention-backend "$ATTENTION" \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path "$DRAFT" \
  --speculative-eagle-topk "$TOPK" --speculative-num-steps "$STEPS" --speculative-num-draft-tokens "$NODES" \
  --disable-overlap-schedule --tp-size "${TP:-1}" --dp-size "${DP:-1}" \
  --hvd-gate "$GATE" ${PROFILE:+--hvd-profile "$PROFILE"} ${RECORD:+--hvd-record-traces "$RECORD"} "$@"
