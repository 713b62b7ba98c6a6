"""``hvd replay TRACES...``: replay traces through the cache drafter and compare policies."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools

from ..errors import HvdInputError
from ..gate import Gate
from ..jsonl import atomic_output, dump_line, open_text, write_json
from ..replay.metrics import COLUMNS, table_row
from ..replay.policies import BASELINES, POLICY_FACTORIES, PolicyOptions, make_policies
from ..replay.simulate import DraftQuality, dense_quality, simulate
from ..report import format_table, progress
from ..trace import ReadReport, iter_traces, single_tokenizer
from .common import FILE, add_examples, add_json_flag, add_skip_invalid_flag, cli_entry, declare_outputs, positive_int
from .options import add_drafter_flags, add_verify_flags, drafter_from_flags, rule_thresholds, verify_model_from_flags


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hvd replay",
        description=(
            "Replay token traces through the cache drafter as a serving loop would and compare verify "
            "policies on the same traces, at one verify shape (SGLang's topk, steps and draft tokens): "
            "greedy (no speculation), eagle3_only, cache_only (SuffixDecoding: every non-empty cache draft "
            "as a chain), rule@C (cache chain when its score >= C, else EAGLE3), oracle (the choose-one "
            "oracle), hvd (a trained gate, --gate); at topk > 1 also cache_tree and tree_oracle (cache_only and the "
            "oracle with the row tree: the chain, then siblings from the cache tree draft, N-1 nodes). "
            "A cache draft's accepted length is its longest common "
            "prefix with the recorded output: what verify accepts, greedy or sampled, had the target produced that "
            "output (traces recorded at the serving temperature give served acceptance; README, Sampling); "
            "EAGLE3 follows the --eagle3-curve "
            "model. Requests run in file order; the global cache persists across them. --mode dense instead "
            "drafts at every output position and reports draft quality."
        ),
    )
    p.add_argument("traces", nargs="+", metavar="TRACES", help="token trace files (.jsonl or .jsonl.gz)")
    p.add_argument("--mode", choices=("serving", "dense"), default="serving",
                   help="serving: policy table; dense: draft quality at every position (default: %(default)s)")
    p.add_argument("--policies", metavar="P1,P2", default=",".join(BASELINES),
                   help=f"comma-separated policies from {', '.join(POLICY_FACTORIES)} (default: %(default)s)")
    p.add_argument("--rule-threshold", type=rule_thresholds, default="1,3,6", metavar="C[,C...]",
                   help="score threshold(s) of the rule policy, one rule@C row each (default: %(default)s)")
    p.add_argument("--gate", metavar="GATE_DIR",
                   help="a gate from `hvd train`, for the hvd policy; its decision rule, drafter settings, "
                        "verify shape "
                        "and EAGLE3 curve are the defaults")
    p.add_argument("--limit", type=positive_int, metavar="N", help="replay only the first N requests")
    p.add_argument("--steps", metavar="PATH", help="also write one JSON line per replayed step to PATH")
    add_drafter_flags(p)
    add_verify_flags(p, gate_default="gate if given")
    add_skip_invalid_flag(p)
    add_json_flag(p)
    declare_outputs(p, steps=FILE)
    add_examples(
        p,
        'hvd replay dev.jsonl.gz',
        'hvd replay dev.jsonl.gz --policies eagle3_only,cache_only,rule,oracle --verify-topk 1 '
        '--verify-steps 3 --verify-nodes 4',
        'hvd replay dev.jsonl.gz --gate gate --policies hvd,oracle --json replay.json',
        'hvd replay dev.jsonl.gz --mode dense',
    )
    return p


def _count_lines(paths) -> int:
    """Non-blank lines of the trace files: the requests to replay, for the progress total (a
    malformed line is reported by iter_traces, which reads the files next)."""
    n = 0
    for path in paths:
        try:
            with open_text(path) as f:
                n += sum(1 for line in f if line.strip())
        except (OSError, EOFError, UnicodeDecodeError, ValueError):
            pass  # iter_traces says what is wrong with the file, with its line
    return n


def _step_json(step) -> dict:
    if hasattr(step, "record"):
        d = {"req_id": step.record.req_id, "source": step.record.source, "pos": step.pos, "accept_len": step.accept_len}
    else:
        d = {"req_id": step.req_id, "source": step.source, "policy": step.policy, "pos": step.pos,
             "choice": step.choice,
             "cache_len": step.plan.cache_len, "eagle_nodes": step.plan.eagle_nodes, "accept_len": step.accept_len,
             "out_len": step.out_len}
    draft = step.draft
    d.update(draft=list(draft.tokens), score=draft.score, match_len=draft.match_len, tree=draft.tree)
    return d


@cli_entry("replay", build_parser)
def main(args: argparse.Namespace) -> int:
    gate = Gate(args.gate) if args.gate else None
    drafter = drafter_from_flags(args, gate.drafter_config if gate else None)
    model = verify_model_from_flags(args, gate.verify_model if gate else None)
    options = PolicyOptions(rule_thresholds=args.rule_threshold, eagle3_tokens=model.eagle3_tokens,
                            gate=gate)
    try:
        policies = make_policies([n.strip() for n in args.policies.split(",") if n.strip()], options)
    except ValueError as e:
        raise HvdInputError(f"--policies: {e}") from None
    report = ReadReport()
    records = single_tokenizer(iter_traces(args.traces, skip_invalid=args.skip_invalid, report=report))
    if args.limit:
        records = itertools.islice(records, args.limit)
    if gate is not None:
        records = _same_tokenizer(records, gate)

    with (atomic_output(args.steps) if args.steps else contextlib.nullcontext()) as steps_file:
        write_step = (lambda s: steps_file.write(dump_line(_step_json(s)))) if steps_file else None
        total = _count_lines(args.traces)
        bar = progress(total=min(total, args.limit) if args.limit else total, desc="replay", unit="req")
        with bar:
            if args.mode == "dense":
                quality, seconds = dense_quality(_ticking(records, bar), drafter, on_step=write_step)
            else:
                result = simulate(records, drafter, policies, model, on_step=write_step,
                                  on_request=lambda r: bar.update(1))
        if not (quality if args.mode == "dense" else result.sources):  # nothing written, no nonsense figures
            raise HvdInputError(f"no trace records in {', '.join(args.traces)}" +
                                (f" ({report.num_skipped} malformed lines skipped)" if report.num_skipped else ""))
    if args.mode == "dense":
        _print_dense(quality, seconds)
        result_json = {"mode": "dense", "sources": {s: q.to_json() for s, q in quality.items()}}
    else:
        _print_serving(result, model)
        result_json = {"mode": "serving", **result.to_json(), "seconds": result.seconds}
    mem = drafter.memory_stats()
    print(f"drafter {args.drafter}: {mem['global_tokens']:,.0f} cached response tokens, "
          f"{mem['bytes_per_token']:.0f} bytes per cached token, {mem['evicted_responses']:,.0f} responses evicted")
    if report.num_skipped:
        print(report.summary())
    if args.json:
        result_json.update(drafter={"name": args.drafter, **dataclasses.asdict(drafter.config)},
                           verify=model.to_json(), memory=mem, skipped_lines=report.num_skipped)
        write_json(args.json, result_json)
    return 0


def _same_tokenizer(records, gate):
    """The gate's token features index the ids of the tokenizer it was trained on."""
    want = gate.spec.tokenizer
    for r in records:
        if r.tokenizer.digest != want.digest:
            raise HvdInputError(f"the traces were tokenized with {r.tokenizer.name}@{r.tokenizer.digest}, but the gate "
                                f"{gate.gate_dir} was trained on {want.name}@{want.digest}")
        yield r


def _ticking(records, bar):
    for r in records:
        bar.update(1)
        yield r


def _print_serving(result, model) -> None:
    header = ("policy",) + COLUMNS
    for name, tally in sorted(result.sources.items()):
        rows = [table_row(p, t) for p, t in tally.policies.items()]
        print(format_table(header, rows,
                           title=f"\n{name}: {tally.requests:,} requests, {tally.tokens:,} output tokens"))
    if len(result.sources) > 1:
        total = result.overall
        rows = [table_row(p, t) for p, t in total.policies.items()]
        print(format_table(header, rows,
                           title=f"\noverall: {total.requests:,} requests, {total.tokens:,} output tokens"))
    tokens = result.overall.tokens
    print(f"\nverify rows of {model.shape.describe()}; EAGLE3 {model.eagle3_tokens:.3g} tokens per verify "
          f"(curve {model.eagle3.text()})")
    print(f"replayed {tokens:,} output tokens in {result.seconds:.1f} s "
          f"({tokens / max(result.seconds, 1e-9):,.0f} tokens/s, "
          f"{result.num_drafts:,} non-empty drafts)")


def _print_dense(quality: dict[str, DraftQuality], seconds: float) -> None:
    header = ("source", "positions", "draft rate", "mean draft len", "mean accept", "accept>=1", "accept>=6",
              "own tree")
    rows = []
    for name, q in sorted(quality.items()):
        j = q.to_json()
        rows.append((name, q.positions, f"{100 * j['draft_rate']:.1f}%", j["mean_draft_len"], j["mean_accept_len"],
                     f"{100 * j['accept_ge1_share']:.1f}%", f"{100 * j['accept_ge6_share']:.1f}%",
                     f"{100 * j['local_tree_share']:.1f}%"))
    print(format_table(header, rows,
                       title="draft quality at every output position (accept lengths over non-empty drafts)"))
    positions = sum(q.positions for q in quality.values())
    print(f"\nreplayed {positions:,} positions in {seconds:.1f} s ({positions / max(seconds, 1e-9):,.0f} drafts/s)")
