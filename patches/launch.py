"""Run SGLang's own HTTP server launcher (the body of ``python -m sglang.launch_server``)."""

from __future__ import annotations

import os


def parse_server_args(argv: list[str]):
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(argv)


def print_sglang_help() -> None:
    import argparse

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
