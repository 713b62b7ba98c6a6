"""What every ``hvd`` subcommand shares: error handling and shared flags."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable

from ..errors import HvdInputError


def cli_entry(
    prog: str, build_parser: Callable[[], argparse.ArgumentParser]
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[..., int]]:
    """Wrap ``run(args) -> exit code`` as ``main(argv=None)`` with uniform error handling.

    Input errors print one line (``hvd CMD: error: ...``) and exit 2; Ctrl-C exits 130;
    other exceptions are bugs and keep their traceback.
    """

    def wrap(run: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
        @functools.wraps(run)
        def main(argv: list[str] | None = None) -> int:
            args = build_parser().parse_args(argv)
            try:
                return run(args)
            except HvdInputError as e:
                print(f"hvd {prog}: error: {e}", file=sys.stderr)
                return 2
            except KeyboardInterrupt:
                print(f"hvd {prog}: interrupted", file=sys.stderr)
                return 130

        return main

    return wrap


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")


def add_skip_invalid_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--skip-invalid",
        action="store_true",
        help="skip malformed trace lines (counted and reported) instead of stopping at the first",
    )


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def float_list(text: str) -> tuple[float, ...]:
    """``"0,0.5,1"`` -> (0.0, 0.5, 1.0) for argparse."""
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values
