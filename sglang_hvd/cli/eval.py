"""``hvd eval TRACES... --gate GATE_DIR``: the learned gate against every baseline."""

from __future__ import annotations

import argparse
import dataclasses
import os

from ..decision import DecisionRule
from ..drafter import create_drafter
from ..drafter.native_drafter import default_drafter_name
from ..errors import HvdInputError
from ..gate import Gate
from ..jsonl import atomic_output, write_json
from ..replay.by_load import STATIC_FAMILIES, UNTIERED, parse_policy
from ..replay.metrics import COLUMNS, HIGH_PAYOFF_ACCEPT_LEN, table_row
from ..replay.policies import GatePolicy, PolicyOptions, make_policies
from ..replay.simulate import simulate
from ..replay.sweep import DEFAULT_GATE_THRESHOLDS, gate_metrics, sweep
from ..report import Ticking, format_table, progress
from ..trace import ReadReport, iter_traces, single_tokenizer
from . import eval_load
from .common import (
    FILE,
    add_examples,
    add_json_flag,
    add_skip_invalid_flag,
    cli_entry,
    declare_outputs,
)
from .eval_load import add_load_flags
from .options import (
    add_bound_flags,
    add_verify_flags,
    bounds_from_flags,
    bounds_of,
    gate_threshold,
    gate_thresholds,
    row_nodes,
    rule_threshold,
    verify_model_from_flags,
)

POLICIES = ("greedy", "eagle3_only", "cache_only", "rule", "hvd", "oracle")
TREE_POLICIES = ("cache_tree", "tree_oracle")  # at topk > 1, where rows hold trees
ON_REQUEST = ("hvd_online",)  # sequential policies run only when --policies names them


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hvd eval",
        description=(
            "Serving-mode replay of the learned gate (hvd: the serving decision, decision.decide) against greedy, "
            "eagle3_only, cache_only, the score rule (its constant as chosen at training) and the choose-one "
            "oracle (the cache chain exactly when its true accept_len + 1 beats EAGLE3's expected tokens) and, at "
            "topk > 1, cache_tree and the tree oracle (the same with the row tree: the chain, then siblings from the "
            "cache tree draft, N-1 nodes), per source and overall, plus the gate's precision and recall for "
            "high-payoff drafts (accept_len >= 6) "
            "and its mean absolute error. Drafter settings, verify shape, EAGLE3 curve and decision rule are the "
            "gate's own unless overridden; the fastest drafter built is used (all return identical drafts)."
        ),
    )
    p.add_argument("traces", nargs="+", metavar="TRACES", help="token trace files (.jsonl or .jsonl.gz)")
    p.add_argument("--gate", required=True, metavar="GATE_DIR", help="gate directory written by `hvd train`")
    p.add_argument("--held-out", action="store_true",
                   help="evaluate only the conversations the gate held out at training (hvd train --test-fraction)")
    p.add_argument("--sources", metavar="S,...",
                   help="evaluate only the records of these sources, e.g. tau-bench,swe-agent (default: all)")
    p.add_argument("--policies", type=policy_list, metavar="P,...",
                   help="only these policies. Sequential replay (default: " + ",".join(POLICIES) + ", and "
                        + ",".join(TREE_POLICIES) + " at topk > 1): any of those and hvd_online (hvd with online "
                        "calibration, cold at the first request); the oracle always runs, as the reference. With "
                        "--concurrency (default: greedy, eagle3_adaptive, eagle3@T, cache_only@T and hvd@T at each "
                        "static tier, and hvd): any of those, hvd_online, hvd_online@T and hvd_exact (hvd priced by "
                        "each cache chain's true accepted length: what a gate that knew it would buy, a reference)")
    p.add_argument("--threshold", type=gate_threshold, metavar="T",
                   help="override the gate's threshold on predicted accept_len")
    p.add_argument("--eagle-reserve", type=row_nodes, metavar="M",
                   help="override the EAGLE3 nodes the gate's decision keeps beside a cache draft (topk > 1)")
    p.add_argument("--cache-siblings", type=row_nodes, metavar="S",
                   help="override the tree-draft nodes the gate's decision adds to a cache chain (topk > 1)")
    p.add_argument("--rule-threshold", type=rule_threshold, metavar="C",
                   help="override the rule constant chosen at training")
    p.add_argument("--plot", type=plot_path, metavar="PATH.png",
                   help="also sweep the threshold and plot precision/recall and cycles per 1k against it, marking the "
                        "gate's threshold; the suffix gives the format: .png, .svg or .pdf (needs matplotlib)")
    p.add_argument("--plot-thresholds", type=gate_thresholds, default=DEFAULT_GATE_THRESHOLDS, metavar="T,...",
                   help="thresholds of the --plot sweep (default: %s)"
                   % ",".join(f"{t:g}" for t in DEFAULT_GATE_THRESHOLDS))
    add_verify_flags(p, gate_default="gate")
    add_bound_flags(p)
    add_load_flags(p)
    add_skip_invalid_flag(p)
    add_json_flag(p)
    declare_outputs(p, plot=FILE)
    add_examples(
        p,
        'hvd eval dev.jsonl.gz --gate gate --held-out',
        'hvd eval dev.jsonl.gz --gate gate --held-out --eagle3-mean 1.75 --plot thresholds.png',
        'hvd eval dev.jsonl.gz --gate gate --held-out --sources tau-bench,swe-agent --concurrency 1,8,32,64 '
        '--requests turns --json by_load.json',
        'hvd eval held_out.jsonl.gz --gate other_gate --policies hvd,hvd_online --concurrency 8 --json online.json',
    )
    return p


@cli_entry("eval", build_parser)
def main(args: argparse.Namespace) -> int:
    gate = Gate(args.gate, threshold=args.threshold)
    theirs = gate.drafter_config
    gate.spec = dataclasses.replace(gate.spec, drafter=bounds_from_flags(args, theirs))  # every drafter of the run's
    spec = gate.spec
    bounds, gates = bounds_of(spec.drafter), bounds_of(theirs)
    if bounds != gates:
        print("drafter bounds set by flags: " + ", ".join(f"{k} {v:,} (the gate's {gates[k]:,})"
                                                          for k, v in bounds.items() if v != gates[k]))
    decision = DecisionRule(gate.rule.threshold,
                            gate.rule.eagle_reserve if args.eagle_reserve is None else args.eagle_reserve,
                            gate.rule.cache_siblings if args.cache_siblings is None else args.cache_siblings)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise HvdInputError("--plot needs matplotlib: pip install matplotlib") from None
    model = verify_model_from_flags(args, gate.verify_model)
    if args.cache_siblings and not model.shape.allows_branches:
        raise HvdInputError(f"--cache-siblings {args.cache_siblings}: rows at topk {model.shape.topk} are chains, "
                            "with no "
                            "room for siblings; evaluate at --verify-topk 2 or more, or leave --cache-siblings out")
    rule = args.rule_threshold if args.rule_threshold is not None else spec.rule_threshold or 3.0
    profile = eval_load.check(args, model.shape)
    names = sequential_names(args.policies, model.shape) if not args.concurrency else None
    report = ReadReport()
    records = single_tokenizer(iter_traces(args.traces, skip_invalid=args.skip_invalid, report=report))
    if args.held_out:
        keep = set(spec.split.test_conversations)
        if not keep:
            raise HvdInputError(f"{args.gate} held out no conversations (train with --test-fraction to use --held-out)")
        records = (r for r in records if r.conv_id in keep)
    if args.sources:
        wanted = {x.strip() for x in args.sources.split(",") if x.strip()}
        records = (r for r in records if r.source in wanted)
    records = list(records)
    if not records:
        raise HvdInputError("no trace records to evaluate"
                            + (" (none of the held-out conversations are in these files)" if args.held_out else "")
                            + (f" (none of source {args.sources})" if args.sources else ""))
    if records[0].tokenizer.digest != spec.tokenizer.digest:
        raise HvdInputError("the traces were tokenized with "
                            f"{records[0].tokenizer.name}@{records[0].tokenizer.digest}, "
                            f"the gate was trained on {spec.tokenizer.name}@{spec.tokenizer.digest}")
    if args.concurrency:
        if args.plot:
            raise HvdInputError("--plot sweeps sequential replay; leave it out with --concurrency")
        gate.rule = decision  # the flags' overrides, served by every hvd policy
        out = eval_load.run(args, gate, model, profile, records,
                            {**decision.to_json(), "verify": model.to_json(), "drafter_bounds": bounds})
        if report.num_skipped:
            print(report.summary())
        eval_load.write(args.json, out)
        return 0
    options = PolicyOptions(rule_thresholds=(rule,), eagle3_tokens=model.eagle3_tokens, gate=gate, decision=decision,
                            draft_nodes=model.shape.draft_nodes)
    policies = make_policies(names, options)
    # the gate's precision and recall: of hvd's judgements (the same drafts and predictions as hvd_online's)
    hvd = next((p for p in policies if isinstance(p, GatePolicy) and p.calibration is None),
               next((p for p in policies if isinstance(p, GatePolicy)), None))
    with progress(total=len(records), desc="eval", unit="req") as bar:
        result = simulate(records, create_drafter(default_drafter_name(), gate.drafter_config), policies,
                          model, on_request=lambda r: bar.update(1))
    costs = spec.costs
    out = {"overall": {**result.overall.to_json(), **_gate_json(hvd, result.overall)}, "sources": {},
           **decision.to_json(), "rule_threshold": rule,
           "verify": model.to_json(), "drafter_bounds": bounds}
    header = ("policy",) + COLUMNS + ("time/1k",)
    for name, tally in sorted(result.sources.items()):
        out["sources"][name] = {**tally.to_json(), **_gate_json(hvd, tally, name)}
        _print(name, tally, header, costs, out["sources"][name].get("gate"), model.shape)
    if len(result.sources) > 1:
        _print("overall", result.overall, header, costs, out["overall"]["gate"], model.shape)
    print(f"\nverify rows of {model.shape.describe()} (cache drafts checked up to {model.shape.draft_nodes} tokens), "
          f"EAGLE3 {model.eagle3_tokens:.3g} tokens per verify; hvd threshold {decision.threshold:g}, EAGLE3 reserve "
          f"{decision.eagle_reserve}, cache siblings {decision.cache_siblings}; rule constant {rule:g}; "
          f"{result.overall.tokens:,} output tokens in {result.seconds:.1f} s")
    if args.plot:
        print(f"\nsweeping {len(args.plot_thresholds)} thresholds for the plot", flush=True)
        with progress(total=sum(len(r.output_ids) for r in records), desc="sweep", unit="tok", unit_scale=True) as bar:
            sw = sweep(Ticking(records, bar, lambda r: len(r.output_ids)), gate, default_drafter_name(), model, costs,
                       args.plot_thresholds, (), (decision.eagle_reserve,), (decision.cache_siblings,))
        _plot(args.plot, sw, decision.threshold,
              f"threshold sweep of gate {args.gate}: {result.overall.requests:,}"
              f"{' held-out' if args.held_out else ''} requests, {model.shape.describe()}")
        out["sweep"] = sw.to_json()
        print(f"plot: {args.plot}")
    if report.num_skipped:
        print(report.summary())
    if args.json:
        write_json(args.json, out)
    return 0


def policy_list(text: str) -> tuple[str, ...]:
    """An argparse type: comma-separated policy names (checked against the run's mode in ``main``)."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise argparse.ArgumentTypeError(f"expected policy names like hvd,hvd_online, got {text!r}")
    sequential = set(POLICIES + ON_REQUEST + TREE_POLICIES)
    for name in names:
        if name not in sequential:
            try:
                parse_policy(name)  # a policy of fleet replay by load
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"unknown policy {name!r}; sequential replay runs {', '.join(sorted(sequential))}; fleet replay "
                    f"by load (--concurrency) {', '.join(UNTIERED)} and {', '.join(f + '@T' for f in STATIC_FAMILIES)} "
                    f"(T: TOPK-STEPS-NODES)") from None
    return names


def sequential_names(wanted: tuple[str, ...] | None, shape) -> list[str]:
    """The sequential replay's policies: ``wanted`` (the oracle added, as the reference) or the default table."""
    trees = TREE_POLICIES if shape.allows_branches else ()
    known = list(POLICIES + ON_REQUEST + trees)
    if wanted is None:
        return list(POLICIES + trees)
    for name in wanted:
        if name not in known:
            extra = " (a tree policy: at topk > 1 only)" if name in TREE_POLICIES else ""
            by_load = " (a policy of fleet replay by load: add --concurrency C,...)" if "@" in name or name in (
                "eagle3_adaptive", "hvd_exact") else ""
            raise HvdInputError(f"--policies: unknown policy {name!r}{extra}{by_load}; sequential replay runs "
                                f"{', '.join(known)}")
    return list(wanted) + ([] if "oracle" in wanted else ["oracle"])


def _gate_json(hvd, tally, source: str | None = None) -> dict:
    """The gate's figures over ``tally`` (a source's, or overall): none without a gate policy."""
    if hvd is None:
        return {}
    return {"gate": {**gate_metrics(hvd.judged, source),
                     "cache_pick_rate": tally.policy(hvd.name).to_json()["cache_pick_rate"]}}


def at_6(shape, value: float) -> str:
    """precision@6 or recall@6, or n/a where a row checks fewer than 6 cache tokens (N - 1 < 6):
    no draft can be accepted that far, so both are 0 / 0."""
    return "n/a" if shape.draft_nodes < HIGH_PAYOFF_ACCEPT_LEN else f"{value:.3f}"


def _print(name, tally, header, costs, g, shape) -> None:
    rows = [table_row(p, t) + (costs.time_per_1k(t),) for p, t in tally.policies.items()]
    print(format_table(header, rows, title=f"\n{name}: {tally.requests:,} requests, {tally.tokens:,} output tokens"))
    if g is None:
        return
    print(f"gate: precision@6 {at_6(shape, g['precision_at_6'])}, recall@6 {at_6(shape, g['recall_at_6'])}, "
          f"MAE {g['mae']:.2f} "
          f"over {g['judged']:,} drafts judged; cache pick {100 * g['cache_pick_rate']:.1f}%")


PLOT_FORMATS = ("png", "svg", "pdf")


def plot_path(text: str) -> str:
    """An argparse type: a plot file name whose suffix says the format (png, svg or pdf)."""
    suffix = os.path.splitext(text)[1].lstrip(".").lower()
    if suffix not in PLOT_FORMATS:
        raise argparse.ArgumentTypeError(f"{text}: name the format by the suffix: .png, .svg or .pdf")
    return text


def _plot(path: str, sw, threshold: float, title: str) -> None:
    """Left: the gate's precision/recall@6 and cache pick rate by threshold; right: verify
    cycles per 1k tokens of hvd by threshold beside the baselines. A dotted line marks the
    calibrated (or --threshold) threshold on both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [e["threshold"] for e in sw.gate_curve]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.4))
    fig.suptitle(title)
    a.plot(t, [e["precision_at_6"] for e in sw.gate_curve], "o-", label="precision@6")
    a.plot(t, [e["recall_at_6"] for e in sw.gate_curve], "s-", label="recall@6")
    a.plot(t, [e["cache_pick_rate"] for e in sw.gate_curve], "^-", label="cache pick rate")
    a.set_xlabel("threshold on predicted accept_len")
    a.set_ylabel("share (0 to 1)")
    a.set_ylim(-0.05, 1.05)
    a.set_title("gate quality for drafts accepted >= 6", fontsize=10)
    b.plot(t, [e["cycles_per_1k"] for e in sw.gate_curve], "o-", label="hvd", color="C0")
    values = [e["cycles_per_1k"] for e in sw.gate_curve]
    for name, e in sw.baselines.items():
        if name != "greedy":
            values.append(e["cycles_per_1k"])
            b.axhline(e["cycles_per_1k"], linestyle="--", linewidth=1, label=name,
                      color={"eagle3_only": "C1", "cache_only": "C2", "oracle": "C3"}.get(name))
    low, high = min(values), max(values)
    pad = 0.08 * (high - low) if high > low else 0.05 * max(abs(high), 1.0)
    b.set_ylim(low - pad, high + pad)  # every line inside the frame, the oracle's too
    b.set_xlabel("threshold on predicted accept_len")
    b.set_ylabel("verify cycles per 1k tokens (lower is better)")
    b.set_title("decode cycles by threshold", fontsize=10)
    for ax in (a, b):
        ax.axvline(threshold, color="0.35", linestyle=":", linewidth=1.5, label=f"chosen threshold {threshold:g}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fmt = os.path.splitext(path)[1].lstrip(".").lower()
    with atomic_output(path, text=False) as f:  # nothing half-written if the run fails
        fig.savefig(f, dpi=110, format=fmt)
    plt.close(fig)
