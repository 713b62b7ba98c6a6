"""``python -m sglang_hvd.launch_server``: SGLang's server with Hybrid Verified Decoding.

Reached through the thin door ``sglang_hvd/launch_server.py`` (the entry point
``sglang_hvd.launchers: launch_server``). Takes SGLang's own arguments plus ``--hvd-*``
flags. The HVD flags become environment variables (sglang_hvd/serving/config.py declares
them) so SGLang's spawned scheduler processes see them; the gate, the drafter settings,
the verify shape and the server arguments are checked before any model is loaded, and a
problem exits with one line naming it (exit code 2).
"""

from __future__ import annotations

import argparse
import os
import sys

from sglang_hvd.drafter.protocol import RESOURCE_BOUNDS
from sglang_hvd.errors import HvdInputError
from sglang_hvd.serving.config import DRAFTER_OPTIONS, OPTIONS, SERVING_OPTIONS, HVDServingConfig
from sglang_hvd.serving.options import add_flags, values_from_flags

EXAMPLE = ("python -m sglang_hvd.launch_server --model-path Qwen/Qwen3-8B --speculative-algorithm EAGLE3 "
           "--speculative-draft-model-path EAGLE3_DIR --speculative-eagle-topk 4 --speculative-num-steps 3 "
           "--speculative-num-draft-tokens 16 --disable-overlap-schedule --hvd-gate GATE_DIR")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sglang_hvd.launch_server", add_help=False, allow_abbrev=False,
        description=(
            "SGLang's server with Hybrid Verified Decoding: each decode step the gate decides, per request, whether "
            "its verify row holds EAGLE3's draft, a cache draft (suffix trees over the prompt, the output and earlier "
            "responses) or both as two branches. All SGLang arguments work as usual; HVD needs "
            "--speculative-algorithm EAGLE3 --disable-overlap-schedule and the verify shape the gate was trained for "
            "(--speculative-eagle-topk / --speculative-num-steps / --speculative-num-draft-tokens). "
            "Example:\n  " + EXAMPLE
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("HVD (each flag sets the SGLANG_HVD_* variable in parentheses; "
                             "sglang_hvd/serving/config.py declares them)")
    g.add_argument("-h", "--help", action="store_true", help="show this help and SGLang's own arguments")
    add_flags(g, SERVING_OPTIONS)
    bounds = ", ".join(opt.flag for opt in DRAFTER_OPTIONS if opt.name in RESOURCE_BOUNDS)
    d = p.add_argument_group(f"HVD cache drafter (the gate's settings; only the resource bounds {bounds} "
                             "may differ from the gate's)")
    add_flags(d, DRAFTER_OPTIONS)
    return p


def config_from_args(args: argparse.Namespace) -> HVDServingConfig:
    return HVDServingConfig(**values_from_flags(args, OPTIONS))


def check_tokenizer(gate, tokenizer_dir: str | None) -> None:
    """The gate's features index token ids: refuse a server whose tokenizer differs.

    Only checkable when the model (or --tokenizer-path) is a local folder with
    tokenizer.json and tokenizer_config.json; hub ids are not downloaded here.
    """
    if not tokenizer_dir or not os.path.isfile(os.path.join(tokenizer_dir, "tokenizer.json")):
        return
    from sglang_hvd.tokenizer import ChatTokenizer

    try:
        served = ChatTokenizer(tokenizer_dir).identity
    except HvdInputError:
        return  # not a tokenizer folder we can read; SGLang will judge it
    want = gate.spec.tokenizer
    if want.digest != served.digest:
        raise HvdInputError(
            f"the gate was trained on tokenizer {want.name}@{want.digest}, but the server's tokenizer "
            f"({tokenizer_dir}) is {served.name}@{served.digest}: the gate's token features would be wrong; "
            "train a gate on traces of this model (hvd collect / hvd import with its tokenizer, then hvd train)"
        )


def validate(config: HVDServingConfig, server_args) -> None:
    """Everything that can be checked before SGLang loads a model."""
    if not config.enable:
        return
    from sglang_hvd.serving.factory import check_shape, cost_rule, load_gate

    from .checks import check_server_args, check_sglang_version, served_shape

    check_sglang_version(config)
    check_server_args(server_args, config)
    gate = load_gate(config)  # missing, corrupt or schema-mismatched gates stop here
    shape = served_shape(server_args)
    check_shape(gate, shape)
    cost_rule(config, gate, shape, getattr(server_args, "model_path", None))  # the profile and tiers
    check_tokenizer(gate, getattr(server_args, "tokenizer_path", None) or getattr(server_args, "model_path", None))
    config.drafter_config(gate.drafter_config)
    if config.drafter is not None:
        from sglang_hvd.drafter import available_drafters

        if config.drafter not in available_drafters():
            raise HvdInputError(f"--hvd-drafter {config.drafter}: not built here "
                                f"(available: {', '.join(available_drafters())})")
    if config.record_traces:
        folder = os.path.dirname(os.path.abspath(config.record_traces))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise HvdInputError(f"--hvd-record-traces {config.record_traces}: "
                                f"folder {folder} is missing or not writable")


def parse_server_args(argv: list[str]):
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(argv)


def print_sglang_help() -> None:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="python -m sglang_hvd.launch_server", add_help=False,
                                     description="SGLang's server arguments (unchanged):")
    ServerArgs.add_cli_args(parser)
    parser.print_help()


def run(server_args) -> None:
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        import sglang  # noqa: F401
    except ImportError:
        print("sglang_hvd.launch_server: error: needs the sglang extra: pip install '.[sglang]' in the sglang-hvd "
              "checkout", file=sys.stderr)
        return 2
    if args.help:
        parser.print_help()
        print()
        print_sglang_help()
        return 0
    try:
        config = config_from_args(args)
        server_args = parse_server_args(rest)
        validate(config, server_args)
    except HvdInputError as e:
        print(f"sglang_hvd.launch_server: error: {e}", file=sys.stderr)
        return 2
    # Only now, with everything checked: SGLang's spawned processes inherit these.
    os.environ.update(config.to_env())
    run(server_args)
    return 0
