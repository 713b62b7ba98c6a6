"""CLI flags generated from config dataclasses: the help text lives next to each field.

A field ``max_spec_tokens: int = field(default=64, metadata={"help": ...})`` becomes
``--max-spec-tokens N`` (or ``--PREFIX-max-spec-tokens``) with that help and default.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from typing import Any, TypeVar

from ..drafter.protocol import DrafterConfig
from ..errors import HvdInputError
from ..verify import Eagle3Curve, VerifyModel, VerifyShape
from .common import float_in, float_list_in, int_in

T = TypeVar("T")

# Parse-time upper bounds of the numeric flags generated from config dataclasses, by field
# name: argparse refuses NaN, inf and absurd values, naming the flag; the lower bounds are the
# dataclasses' own checks (dataclass_from_flags names the flag too), run before any work.
BIG = 10**12
FIELD_MAX: dict[str, float] = {
    # DrafterConfig
    "max_depth": 4096, "max_spec_tokens": 4096, "max_spec_factor": 1024.0, "max_spec_offset": 4096.0,
    "min_token_prob": 1.0, "global_max_tokens": BIG, "max_occurrences": BIG, "max_scan": BIG,
    # CostModel (per verify cycle, 1.0 = one target forward)
    "greedy": 1e6, "eagle3": 1e6, "cache": 1e6, "cache_per_token": 1e6,
}
# The verify shape. SGLang serves topk and steps of a few (the worker's tree rows hold at most
# 63 draft nodes, verify.MAX_TREE_NODES); replay also studies wider chains (a 64-token draft needs 65 nodes).
MAX_TOPK, MAX_STEPS, MAX_VERIFY_NODES = 64, 64, 1025
MAX_EAGLE3_TOKENS = float(MAX_STEPS + 1)  # tokens per EAGLE3 verify, the bonus included: at most steps + 1
# Thresholds on the gate's predicted accept_len (its labels are clipped at 64) and constants of
# the score rule (a draft's score sums at most max_spec_tokens probabilities).
GATE_THRESHOLD_RANGE, RULE_THRESHOLD_RANGE = (0.0, 64.0), (0.0, 4096.0)
row_nodes = int_in(0, MAX_VERIFY_NODES - 1)  # nodes of a row given to one branch (--eagle-reserve, --cache-siblings)
gate_threshold = float_in(*GATE_THRESHOLD_RANGE, what="a threshold on predicted accept_len")
rule_threshold = float_in(*RULE_THRESHOLD_RANGE, what="a score-rule constant")
gate_thresholds = float_list_in(*GATE_THRESHOLD_RANGE)
rule_thresholds = float_list_in(*RULE_THRESHOLD_RANGE)


def _at_most(kind: type, high: float):
    """An argparse type: an integer, or a finite float, no larger than ``high``."""
    wanted = f"an integer <= {high:g}" if kind is int else f"a finite number <= {high:g}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        if not (abs(value) < math.inf and value <= high):  # NaN fails both
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {value:g}")
        return value

    parse.__name__ = f"{kind.__name__}_at_most"
    return parse


def add_dataclass_flags(parser: argparse.ArgumentParser, cls: type, title: str, prefix: str = "",
                        skip: tuple[str, ...] = ()) -> None:
    group = parser.add_argument_group(title)
    for f in dataclasses.fields(cls):
        if f.name in skip or "help" not in f.metadata:
            continue
        flag = _flag(prefix, f.name)
        kind = type(f.default)
        if kind not in (int, float, str):
            continue
        group.add_argument(flag, dest=_dest(prefix, f.name), type=_field_type(f.name, kind), default=f.default,
                           metavar={int: "N", float: "X", str: "TEXT"}[kind],
                           help=f.metadata["help"] + " (default: %(default)s)")


def _field_type(name: str, kind: type):
    return str if kind is str else _at_most(kind, FIELD_MAX.get(name, BIG))


def eagle3_curve_text(text: str) -> str:
    """An argparse type: a valid ``NODES:TOKENS,...`` curve (finite tokens in [1,
    MAX_EAGLE3_TOKENS], nodes in [1, MAX_VERIFY_NODES - 1]), returned as given."""
    try:
        curve = Eagle3Curve.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    for nodes, tokens in curve.points:
        if not 1 <= nodes < MAX_VERIFY_NODES:
            raise argparse.ArgumentTypeError(f"point {nodes}:{tokens:g}: nodes must be in [1, {MAX_VERIFY_NODES - 1}]")
        if not 1.0 <= tokens <= MAX_EAGLE3_TOKENS:  # NaN fails too
            raise argparse.ArgumentTypeError(f"point {nodes}:{tokens:g}: tokens must be a number in "
                                             f"[1, {MAX_EAGLE3_TOKENS:g}] (the bonus token included)")
    return text


def _dest(prefix: str, name: str) -> str:
    return f"{prefix.replace('-', '_')}__{name}" if prefix else name


def dataclass_from_flags(cls: type[T], args: argparse.Namespace, prefix: str = "", **extra: Any) -> T:
    values = {f.name: getattr(args, _dest(prefix, f.name)) for f in dataclasses.fields(cls)
              if hasattr(args, _dest(prefix, f.name))}
    try:
        return cls(**values, **extra)
    except ValueError as e:  # name the flags of the fields the message names
        flags = [_flag(prefix, f.name) for f in dataclasses.fields(cls)
                 if hasattr(args, _dest(prefix, f.name)) and re.search(rf"\b{f.name}\b", str(e))]
        raise HvdInputError(f"{'/'.join(flags)}: {e}" if flags else str(e)) from None


def _flag(prefix: str, name: str) -> str:
    return "--" + (prefix + "-" if prefix else "") + name.replace("_", "-")


def add_drafter_flags(parser: argparse.ArgumentParser) -> None:
    from ..drafter import available_drafters
    from ..drafter.native_drafter import default_drafter_name

    parser.add_argument("--drafter", default=default_drafter_name(), choices=available_drafters(),
                        help="cache drafter implementation; native and python return identical drafts "
                             "(default: %(default)s, the fastest one built)")
    add_dataclass_flags(parser, DrafterConfig, "cache drafter")


def drafter_from_flags(args: argparse.Namespace, base: DrafterConfig | None = None):
    """The drafter the flags describe. With ``base`` (a gate's settings), flags left at
    their defaults take the gate's values, and a flag set to another value than the
    gate's is refused: the gate's features describe drafts of its own settings."""
    from ..drafter import create_drafter

    config = dataclass_from_flags(DrafterConfig, args)
    if base is not None:
        default = DrafterConfig()
        for f in dataclasses.fields(DrafterConfig):
            mine, theirs = getattr(config, f.name), getattr(base, f.name)
            if mine != getattr(default, f.name) and mine != theirs:
                flag = "--" + f.name.replace("_", "-")
                raise HvdInputError(f"{flag} {mine}: the gate was trained with {f.name} {theirs}; drop {flag} "
                                    "(the gate's settings are used) or train a gate with it")
        config = base
    return create_drafter(args.drafter, config)


# The drafter's resource bounds (protocol.RESOURCE_BOUNDS), which a server may set apart from its gate's
# (--hvd-max-occurrences, ...): field -> (metavar, least value, what the flag does).
BOUND_FLAGS: dict[str, tuple[str, int, str]] = {
    "global_max_tokens": ("T", 0, "keep at most T tokens of responses in the global cache, the oldest evicted"),
    "max_occurrences": ("K", 1, "walk each occurrence set from its newest K occurrences"),
    "max_scan": ("M", 1, "look for patterns of two tokens and more among the newest M occurrences of the "
                         "context's last two tokens (at least K)"),
}


def add_bound_flags(parser: argparse.ArgumentParser) -> None:
    """The drafter's resource bounds as flags that replace a gate's values, as a server's flags do."""
    group = parser.add_argument_group("cache drafter bounds (in place of the gate's, as a server's "
                                      "--hvd-max-occurrences and the like)")
    for name, (metavar, least, text) in BOUND_FLAGS.items():
        group.add_argument(_flag("", name), dest=name, type=int_in(least, BIG), metavar=metavar,
                           help=f"{text} ({name}; default: the gate's)")


def bounds_from_flags(args: argparse.Namespace, base: DrafterConfig) -> DrafterConfig:
    """``base`` (a gate's drafter settings) with the bounds the flags set."""
    given = {name: getattr(args, name) for name in BOUND_FLAGS if getattr(args, name, None) is not None}
    return dataclasses.replace(base, **given) if given else base


def bounds_of(config: DrafterConfig) -> dict[str, int]:
    """The bounds a drafter of ``config`` works within (max_scan as searched: at least max_occurrences)."""
    return {"global_max_tokens": config.global_max_tokens, "max_occurrences": config.max_occurrences,
            "max_scan": config.scan_limit}


def add_verify_flags(parser: argparse.ArgumentParser, gate_default: str = "",
                     base_shape: VerifyShape | None = None) -> None:
    """The verify shape (SGLang's --speculative-* flags) and the EAGLE3 curve. Every flag
    defaults to None (verify_model_from_flags fills it in); ``gate_default`` says in the
    help where the default comes from: "" (the built-in), "gate" (the gate's), "gate if
    given" (the gate's with --gate, else the built-in). ``base_shape``: the built-in shape
    the help names (VerifyShape()'s unless given; pass the same as verify_model_from_flags'
    base)."""
    group = parser.add_argument_group(
        "verify shape and EAGLE3 model (replay has no EAGLE3 model and no GPU; the shape is the server's "
        "--speculative-eagle-topk / --speculative-num-steps / --speculative-num-draft-tokens)")
    shape, curve = base_shape or VerifyShape(), Eagle3Curve()

    def default(value) -> str:
        if gate_default == "gate":
            return " (default: the gate's)"
        if gate_default:
            return f" (default: the gate's with --gate, else {value})"
        return f" (default: {value})"

    for name, value, help_text in (
        ("topk", shape.topk, "EAGLE3 branches per step, SGLang --speculative-eagle-topk"),
        ("steps", shape.steps, "EAGLE3 draft steps, SGLang --speculative-num-steps"),
        ("nodes", shape.nodes, "tokens per verify row incl. the root, SGLang --speculative-num-draft-tokens; "
                               "a cache draft is checked up to N - 1 tokens per verify"),
    ):
        low = 2 if name == "nodes" else 1
        high = {"topk": MAX_TOPK, "steps": MAX_STEPS, "nodes": MAX_VERIFY_NODES}[name]
        group.add_argument(f"--verify-{name}", type=int_in(low, high), metavar="N",
                           help=help_text + f", {low} to {high}" + default(value))
    group.add_argument("--eagle3-curve", type=eagle3_curve_text, metavar="NODES:TOKENS,...",
                       help="EAGLE3 tokens per verify (bonus included) by the draft nodes it verifies, linear in "
                            "between; measure yours with an EAGLE3-only server at each --speculative-num-draft-tokens"
                            + default(curve.text() + ": 1.75 at a 3-token chain is the HVD paper's figure, the tree "
                                      "points are assumed; see sglang_hvd/verify.py"))
    group.add_argument("--eagle3-mean", type=float_in(1.0, MAX_EAGLE3_TOKENS, what="tokens per verify"),
                       metavar="TOKENS",
                       help="a flat EAGLE3 model instead of the curve: TOKENS per verify (1 to "
                            f"{MAX_EAGLE3_TOKENS:g}, the bonus token included) at any node count >= 1")


def verify_model_from_flags(args: argparse.Namespace, base: VerifyModel | None = None) -> VerifyModel:
    """The VerifyModel the flags describe; unset flags take ``base``'s values."""
    base = base or VerifyModel()
    try:
        shape = VerifyShape(topk=args.verify_topk if args.verify_topk is not None else base.shape.topk,
                            steps=args.verify_steps if args.verify_steps is not None else base.shape.steps,
                            nodes=args.verify_nodes if args.verify_nodes is not None else base.shape.nodes)
    except ValueError as e:
        raise HvdInputError(f"--verify-topk/--verify-steps/--verify-nodes: {e}") from None
    try:
        if args.eagle3_mean is not None:
            if args.eagle3_curve is not None:
                raise ValueError("give --eagle3-curve or --eagle3-mean, not both")
            curve = Eagle3Curve.constant(args.eagle3_mean)
        elif args.eagle3_curve is not None:
            curve = Eagle3Curve.parse(args.eagle3_curve)
        else:
            curve = base.eagle3
    except ValueError as e:
        raise HvdInputError(f"--eagle3-curve/--eagle3-mean: {e}") from None
    return VerifyModel(shape, curve)
