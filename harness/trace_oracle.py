"""Model folders for the trace oracle (stubs/hvd_trace_oracle): a target whose greedy
output is the recorded traces, and its EAGLE3 stand-in draft.

``write_oracle_models(out_dir, records, draft=DraftErrorModel(...))`` builds the table
(stubs/hvd_trace_oracle/table.py), writes ``out_dir/target`` and ``out_dir/draft``
(config.json + the Qwen3 tokenizer; no weights: serve with ``ORACLE_ARGS``) and returns
their paths with the build report. ``ORACLE_ENV`` selects the package in the server.

``calibrated_draft_model(curve, topk, steps, nodes)``: the stand-in's error model for a
verify shape. Its per-depth accuracy reproduces the curve on chains exactly
(``DraftErrorModel.from_curve``); for topk > 1 the runner-up probability is then set by
bisection so that the tree SGLang grows from its proposals (``emulated_tokens_per_verify``:
EAGLE's beam expansion, top N-1 candidates by path score, greedy verify) yields the
curve's tokens at N-1 nodes. Only numpy and the standard library are imported here.
"""

from __future__ import annotations

import dataclasses
import json
import os
from types import SimpleNamespace

import numpy as np

# table.py is numpy only: the harness reads it as a subpackage; the servers load the same
# file as the top-level package hvd_trace_oracle (stubs/ on their sys.path).
from .stubs.hvd_trace_oracle import table as T
from .stubs.hvd_trace_oracle.table import (
    LOGIT_OFF,
    RANK_LOGITS,
    WRONG_TOKEN_SPAN,
    BuildReport,
    DraftErrorModel,
    OracleTable,
)
from .tiny_models import VOCAB_SIZE, _copy_tokenizer, draft_config, target_config

ORACLE_ENV = {"SGLANG_EXTERNAL_MODEL_PACKAGE": "hvd_trace_oracle"}
# no weights to read; the draft follows --load-format
ORACLE_ARGS = ["--load-format", "dummy"]
QWEN3_EOS = 151645
# 1 layer, 1 KV head of 4 floats: the prefix hash of each KV slot (32 B per token)
SHAPE = {"hidden": 8, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate": 8}




def _rank_probs(topk: int, choices: int) -> np.ndarray:
    """The softmax SGLang applies to the stand-in's logits (``choices`` ranked tokens,
    every other at LOGIT_OFF), at its first ``topk`` ranks."""
    ranked = np.exp(np.array(RANK_LOGITS[:choices]))
    return ranked[:topk] / (ranked.sum() + (VOCAB_SIZE - choices) * np.exp(LOGIT_OFF))


def emulated_tokens_per_verify(model: DraftErrorModel, topk: int, steps: int, nodes: int, roots: int = 1500,
                               seed: int = 0) -> float:
    """Mean tokens per verify (bonus included) of the stand-in on a random sequence: at
    every root SGLang's EAGLE tree is grown (``topk`` beams, ``steps`` steps, every
    expansion a candidate, the best ``nodes - 1`` candidates by path score kept) and
    verified greedily against the sequence."""
    rng = np.random.default_rng(seed)
    seq = rng.integers(0, 1000, roots + steps + 2)
    table, _ = OracleTable.build([SimpleNamespace(req_id="seq", prompt_ids=seq[:1], output_ids=seq[1:])])
    prefix = T.prefix_hashes(seq)
    probs = _rank_probs(topk, model.choices)
    total = 0
    for root in range(1, roots + 1):
        cands = []  # (score, parent candidate or -1, token)
        beams = [(1.0, -1, prefix[root])]
        for depth in range(1, steps + 1):
            hashes = np.array([h for _, _, h in beams], dtype=np.uint64)
            props = model.proposals(table, hashes, np.full(len(beams), depth), WRONG_TOKEN_SPAN)[:, :topk]
            layer = []
            for (score, idx, h), row in zip(beams, props):
                layer += [(score * probs[c], idx, int(tok), T.roll(h, np.int64(tok))) for c, tok in enumerate(row)]
            layer.sort(key=lambda x: -x[0])
            start = len(cands)
            cands += [(sc, idx, tok) for sc, idx, tok, _ in layer]
            beams = [(sc, start + i, h) for i, (sc, _, _, h) in enumerate(layer[:topk])]
        keep = sorted(range(len(cands)), key=lambda i: -cands[i][0])[: nodes - 1]
        children: dict[int, dict[int, int]] = {}
        for i in keep:
            children.setdefault(cands[i][1], {}).setdefault(cands[i][2], i)
        accepted, node = 0, -1
        while int(seq[root + accepted]) in children.get(node, {}):
            node = children[node][int(seq[root + accepted])]
            accepted += 1
        total += accepted + 1
    return total / roots


def calibrated_draft_model(curve, topk: int, steps: int, nodes: int, seed: int = 0,
                           iterations: int = 12) -> DraftErrorModel:
    """The stand-in for a verify shape and an EAGLE3 curve (``curve.tokens(k)``); see the
    module doc."""
    if topk > len(RANK_LOGITS):
        raise ValueError(f"the stand-in ranks at most {len(RANK_LOGITS)} proposals; topk {topk} asks for more")
    chain = DraftErrorModel.from_curve([curve.tokens(k) for k in range(1, steps + 1)], seed=seed, runner_up_prob=0.0,
                                       choices=max(4, topk))
    if topk == 1:
        return chain
    want = curve.tokens(nodes - 1)
    lo, hi = 0.0, 1.0
    for _ in range(iterations):  # tokens per verify rise with the runner-up probability
        mid = (lo + hi) / 2
        got = emulated_tokens_per_verify(dataclasses.replace(chain, runner_up_prob=mid), topk, steps, nodes, seed=seed)
        lo, hi = (mid, hi) if got < want else (lo, mid)
    return dataclasses.replace(chain, runner_up_prob=round((lo + hi) / 2, 4))


@dataclasses.dataclass(frozen=True, slots=True)
class OracleModels:
    target: str
    draft: str
    table: str
    report: BuildReport
    max_context_tokens: int


def write_oracle_models(out_dir: str, records, draft: DraftErrorModel, *,
                        eos_token_id: int = QWEN3_EOS) -> OracleModels:
    records = list(records)
    table, report = OracleTable.build(records, eos_token_id=eos_token_id)
    os.makedirs(out_dir, exist_ok=True)
    table_path = os.path.abspath(os.path.join(out_dir, "oracle_table.npz"))
    table.save(table_path)
    longest = max((len(r.prompt_ids) + len(r.output_ids) for r in records), default=0)
    context = max(4096, 1 << (longest + 64).bit_length())
    tcfg = target_config("llama", hidden=SHAPE["hidden"], layers=SHAPE["layers"], heads=SHAPE["heads"],
                         kv_heads=SHAPE["kv_heads"], intermediate=SHAPE["intermediate"], vocab=VOCAB_SIZE,
                         max_positions=context)
    tcfg["architectures"] = ["HvdTraceOracleForCausalLM"]
    tcfg["hvd_trace_oracle"] = {"table": table_path}
    dcfg = draft_config(tcfg)
    dcfg["architectures"] = ["HvdTraceOracleEagle3"]
    dcfg["hvd_trace_oracle"] = {"table": table_path, "draft": draft.to_json()}
    paths = {}
    for name, cfg in (("target", tcfg), ("draft", dcfg)):
        d = os.path.abspath(os.path.join(out_dir, name))
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump({"do_sample": False, "eos_token_id": eos_token_id}, f)
        _copy_tokenizer(d)
        paths[name] = d
    return OracleModels(paths["target"], paths["draft"], table_path, report, context)
