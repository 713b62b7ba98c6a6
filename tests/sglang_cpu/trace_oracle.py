"""Model folders for the trace oracle (stubs/hvd_trace_oracle): a target whose greedy
output is the recorded traces, and its EAGLE3 stand-in draft.

``write_oracle_models(out_dir, records, draft=DraftErrorModel(...))`` builds the table
(stubs/hvd_trace_oracle/table.py), writes ``out_dir/target`` and ``out_dir/draft``
(config.json + the Qwen3 tokenizer; no weights: serve with ``ORACLE_ARGS``) and returns
their paths with the build report. ``ORACLE_ENV`` selects the package in the server.
Only numpy and the standard library are imported here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from .tiny_models import VOCAB_SIZE, _copy_tokenizer, draft_config, target_config

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "stubs"))
from hvd_trace_oracle.table import BuildReport, DraftErrorModel, OracleTable  # noqa: E402

ORACLE_ENV = {"SGLANG_EXTERNAL_MODEL_PACKAGE": "hvd_trace_oracle"}
# no weights to read; the draft follows --load-format
ORACLE_ARGS = ["--load-format", "dummy"]
QWEN3_EOS = 151645
# 1 layer, 1 KV head of 4 floats: the prefix hash of each KV slot (32 B per token)
SHAPE = {"hidden": 8, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate": 8}


@dataclasses.dataclass(frozen=True, slots=True)
class OracleModels:
    target: str
    draft: str
    table: str
    report: BuildReport
    max_context_tokens: int


def write_oracle_models(out_dir: str, records, draft: DraftErrorModel, *, eos_token_id: int = QWEN3_EOS) -> OracleModels:
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
