"""What every ``hvd`` subcommand shares: error handling and shared flags."""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
from collections.abc import Callable

from ..errors import HvdInputError

# Output kinds a command declares (declare_outputs): checked before any work starts.
FILE, FOLDER, GATE_FOLDER = "file", "folder", "gate folder"
GATE_FILES = ("gate.onnx", "gate.json", "token_flags.npy", "metrics.json", "calibration.png")


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
            parser = build_parser()
            args = parser.parse_args(argv)
            try:
                check_outputs(parser, args)
                return run(args)
            except HvdInputError as e:
                print(f"hvd {prog}: error: {e}", file=sys.stderr)
                return 2
            except KeyboardInterrupt:
                print(f"hvd {prog}: interrupted", file=sys.stderr)
                return 130
            except BrokenPipeError:
                # `hvd ... | head`: the reader left. End quietly, as a shell tool would
                # (exit status 128 + SIGPIPE), without a traceback at interpreter exit.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 141

        return main

    return wrap


def declare_outputs(parser: argparse.ArgumentParser, **kinds: str) -> None:
    """Declare the parser's output flags (dest -> FILE, FOLDER or GATE_FOLDER): each is
    checked before the command does any work (cli_entry)."""
    outputs = dict(parser.get_default("_hvd_outputs") or {})
    outputs.update(kinds)
    parser.set_defaults(_hvd_outputs=outputs)


def _flag(parser: argparse.ArgumentParser, dest: str) -> str:
    for action in parser._actions:
        if action.dest == dest and action.option_strings:
            return max(action.option_strings, key=len)
    return dest


def check_outputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for dest, kind in (getattr(args, "_hvd_outputs", None) or {}).items():
        path = getattr(args, dest, None)
        if path:
            check_output(path, kind, _flag(parser, dest))


def check_output(path: str, kind: str, flag: str) -> None:
    """Fail with one line before long work starts if ``path`` cannot be written as ``kind``."""
    where = f"{flag} {path}"
    if kind == FILE and os.path.isdir(path):
        raise HvdInputError(f"{where}: is a directory; give a file path")
    if kind != FILE and os.path.exists(path):
        if not os.path.isdir(path):
            raise HvdInputError(f"{where}: exists and is not a folder; give a new folder")
        if kind == GATE_FOLDER:
            other = sorted(set(os.listdir(path)) - set(GATE_FILES))
            if other:
                raise HvdInputError(f"{where}: exists and holds other files ({', '.join(other[:3])}"
                                    f"{' ...' if len(other) > 3 else ''}); "
                                    "choose a new folder or an earlier gate folder")
    folder = path if kind != FILE and os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    probe = folder
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise HvdInputError(f"{where}: {probe} is a file, not a folder")
    try:  # os.access does not know every file system (/proc, read-only mounts as root)
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".hvd-write-check."):
            pass
    except OSError as e:
        raise HvdInputError(f"{where}: cannot write in {probe} ({e.strerror or e}); choose another path") from None


class _ExamplesFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that the examples epilog keeps one command per line."""

    def _fill_text(self, text, width, indent):
        if text.startswith("examples:"):
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


def add_examples(parser: argparse.ArgumentParser, *commands: str) -> None:
    """Show ``commands`` under "examples:" at the end of ``--help`` (tests parse each one)."""
    parser.epilog = "examples:\n" + "\n".join(f"  {c}" for c in commands)
    parser.formatter_class = _ExamplesFormatter


def help_examples(parser: argparse.ArgumentParser) -> list[list[str]]:
    """The argv (after ``hvd COMMAND``) of every example in ``parser``'s help."""
    lines = (parser.epilog or "").splitlines()[1:]
    return [line.split()[2:] for line in lines if line.strip()]


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    declare_outputs(parser, json=FILE)


def add_skip_invalid_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--skip-invalid",
        action="store_true",
        help="skip malformed trace lines (counted and reported) instead of stopping at the first",
    )


def _int_at_least(text: str, minimum: int, wanted: str, maximum: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {value}")
    return value


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "an integer >= 0")


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


MAX_SESSIONS, MAX_EPOCHS = 100_000, 10_000  # hvd synth/demo sessions; training epochs
SEED_MAX = 2**32 - 1  # numpy's and torch's seeds


def seed(text: str) -> int:
    return _int_at_least(text, 0, f"a seed in [0, {SEED_MAX}]", SEED_MAX)


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]."""
    def parse(text: str) -> int:
        return _int_at_least(text, low, f"an integer in [{low}, {high}]", high)

    parse.__name__ = f"int_in_{low}_{high}"
    return parse


def _wanted(low: float, high: float, low_open: bool, high_open: bool, what: str = "a number") -> str:
    return f"{what} in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def _float_in(text: str, low: float, high: float, low_open: bool, wanted: str, high_open: bool = False) -> float:
    """``text`` as a finite float in the range (NaN and inf fail every comparison or the bound)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
    if not (value > low if low_open else value >= low) or not (value < high if high_open else value <= high):
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {value:g}")
    return value


def float_in(low: float, high: float, low_open: bool = False, high_open: bool = False,
             what: str = "a number") -> Callable[[str], float]:
    """An argparse type: a finite float in the range; NaN, inf and values outside it are
    refused at parse time (argparse names the flag)."""
    wanted = _wanted(low, high, low_open, high_open, what)

    def parse(text: str) -> float:
        return _float_in(text, low, high, low_open, wanted, high_open)

    parse.__name__ = f"float_in_{low:g}_{high:g}"
    return parse


def temperature(text: str) -> float:
    return _float_in(text, 0.0, 100.0, False, "a temperature in [0, 100]")


def top_p(text: str) -> float:
    return _float_in(text, 0.0, 1.0, True, "a top-p in (0, 1]")


def server_url(text: str) -> str:
    """``http(s)://HOST:PORT`` for argparse (checked before any work)."""
    if not text.startswith(("http://", "https://")) or len(text.split("://", 1)[1]) == 0:
        raise argparse.ArgumentTypeError(f"expected a server URL like http://127.0.0.1:30000, got {text!r}")
    return text


def seconds(text: str) -> float:
    return _float_in(text, 0.0, 86400.0, True, "seconds in (0, 86400]")


def float_list(text: str, low: float = -1e9, high: float = 1e9) -> tuple[float, ...]:
    """``"0,0.5,1"`` -> (0.0, 0.5, 1.0) for argparse: finite numbers in [low, high]."""
    wanted = _wanted(low, high, False, False, "comma-separated numbers")
    values = tuple(_float_in(v.strip(), low, high, False, wanted) for v in text.split(",") if v.strip())
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def float_list_in(low: float, high: float) -> Callable[[str], tuple[float, ...]]:
    """An argparse type: comma-separated finite numbers, each in [low, high]."""
    def parse(text: str) -> tuple[float, ...]:
        return float_list(text, low, high)

    parse.__name__ = "float_list"
    return parse


def int_list_in(low: int, high: int) -> Callable[[str], tuple[int, ...]]:
    """An argparse type: comma-separated integers, each in [low, high], without repeats (in order)."""
    wanted = f"comma-separated integers in [{low}, {high}]"

    def parse(text: str) -> tuple[int, ...]:
        values = tuple(dict.fromkeys(_int_at_least(v.strip(), low, wanted, high) for v in text.split(",") if v.strip()))
        if not values:
            raise argparse.ArgumentTypeError(f"expected {wanted}")
        return values

    parse.__name__ = "int_list"
    return parse
