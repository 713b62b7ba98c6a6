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
from ..replay.acceptance import VerifyModel

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


def drafter_from_flags(args: argparse.Namespace):
    from ..drafter import create_drafter

    return create_drafter(args.drafter, dataclass_from_flags(DrafterConfig, args))


def add_verify_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("verify model (replay has no EAGLE3 model and no GPU)")
    group.add_argument("--eagle3-mean", type=float, default=1.75,
                       help="mean tokens per EAGLE3 verify, accepted + bonus (default: %(default)s, the HVD paper's figure)")
    group.add_argument("--eagle3-dist", metavar="TOKENS:PROB,...",
                       help="empirical tokens-per-verify distribution, e.g. 1:0.45,2:0.3,3:0.25 (overrides --eagle3-mean)")
    group.add_argument("--eagle3-seed", type=int, default=0, help="seed of --eagle3-dist draws (default: %(default)s)")
    group.add_argument("--max-cache-verify", type=int, default=0, metavar="N",
                       help="cache draft tokens one verify checks: SGLang with --speculative-eagle-topk 1 checks "
                            "num_draft_tokens - 1 (e.g. 3); 0 = no limit (default: %(default)s)")


def verify_model_from_flags(args: argparse.Namespace) -> VerifyModel:
    try:
        dist = VerifyModel.parse_distribution(args.eagle3_dist) if args.eagle3_dist else ()
        return VerifyModel(mean_tokens_per_cycle=args.eagle3_mean, distribution=dist, seed=args.eagle3_seed,
                           max_cache_tokens=args.max_cache_verify)
    except ValueError as e:
        raise HvdInputError(f"--eagle3-dist/--eagle3-mean: {e}") from None
