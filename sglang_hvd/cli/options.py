"""CLI flags generated from config dataclasses: the help text lives next to each field.

A field ``max_spec_tokens: int = field(default=64, metadata={"help": ...})`` becomes
``--max-spec-tokens N`` (or ``--PREFIX-max-spec-tokens``) with that help and default.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

from ..drafter.protocol import DrafterConfig
from ..errors import HvdInputError
from ..verify import VerifyModel
from ..verify import Eagle3Curve, VerifyShape

T = TypeVar("T")


def add_dataclass_flags(parser: argparse.ArgumentParser, cls: type, title: str, prefix: str = "",
                        skip: tuple[str, ...] = ()) -> None:
    group = parser.add_argument_group(title)
    for f in dataclasses.fields(cls):
        if f.name in skip or "help" not in f.metadata:
            continue
        flag = "--" + (prefix + "-" if prefix else "") + f.name.replace("_", "-")
        kind = type(f.default)
        if kind not in (int, float, str):
            continue
        group.add_argument(flag, dest=_dest(prefix, f.name), type=kind, default=f.default,
                           metavar={int: "N", float: "X", str: "TEXT"}[kind],
                           help=f.metadata["help"] + " (default: %(default)s)")


def _dest(prefix: str, name: str) -> str:
    return f"{prefix.replace('-', '_')}__{name}" if prefix else name


def dataclass_from_flags(cls: type[T], args: argparse.Namespace, prefix: str = "", **extra: Any) -> T:
    values = {f.name: getattr(args, _dest(prefix, f.name)) for f in dataclasses.fields(cls)
              if hasattr(args, _dest(prefix, f.name))}
    try:
        return cls(**values, **extra)
    except ValueError as e:
        raise HvdInputError(str(e)) from None


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
        group.add_argument(f"--verify-{name}", type=int, metavar="N", help=help_text + default(value))
    group.add_argument("--eagle3-curve", metavar="NODES:TOKENS,...",
                       help="EAGLE3 tokens per verify (bonus included) by the draft nodes it verifies, linear in "
                            "between; measure yours with an EAGLE3-only server at each --speculative-num-draft-tokens"
                            + default(curve.text() + ": 1.75 at a 3-token chain is the HVD paper's figure, the tree "
                                      "points are assumed; see sglang_hvd/verify.py"))
    group.add_argument("--eagle3-mean", type=float, metavar="TOKENS",
                       help="a flat EAGLE3 model instead of the curve: TOKENS per verify at any node count >= 1")


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
