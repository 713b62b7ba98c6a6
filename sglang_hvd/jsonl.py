"""Streaming JSON Lines I/O: plain or gzip in, atomic writes out.

Readers never load a whole file: they yield ``(line_no, obj)`` one line at a time.
Writers write to a temporary file beside the target and rename it into place only when
the whole job succeeded, so a failed or interrupted command leaves nothing half-written.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, Any

from .errors import FileFormatError, HvdInputError

_GZIP_MAGIC = b"\x1f\x8b"


def open_text(path: str) -> IO[str]:
    """Open ``path`` for reading text; gzip is detected by its magic bytes, not the name."""
    if not os.path.exists(path):
        raise HvdInputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise HvdInputError(f"{path}: is a directory, expected a JSON Lines file")
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == _GZIP_MAGIC:
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def iter_json_lines(
    path: str, on_error: Callable[[FileFormatError], None] | None = None
) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_no, parsed)`` for each non-blank line.

    A line that is not JSON raises FileFormatError, or, with ``on_error``, is handed to it
    and skipped. An unreadable file (bad gzip, bad UTF-8) always raises.
    """
    with open_text(path) as f:
        line_no = 0
        while True:
            try:
                line = f.readline()
            except (UnicodeDecodeError, EOFError, gzip.BadGzipFile, OSError) as e:
                raise FileFormatError(path, line_no + 1, f"unreadable ({e.__class__.__name__}: {e})") from e
            if not line:
                return
            line_no += 1
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                err = FileFormatError(path, line_no, f"invalid JSON ({e.msg} at column {e.colno})")
                if on_error is None:
                    raise err from e
                on_error(err)
                continue
            yield line_no, obj


@contextlib.contextmanager
def atomic_output(path: str, *, text: bool = True) -> Iterator[IO]:
    """Write to a temp file in the target's folder; rename onto ``path`` only on success.

    A path ending in ``.gz`` is gzip-compressed. Parent folders are created.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".partial", dir=folder)
    os.close(fd)
    try:
        if path.endswith(".gz"):
            raw = gzip.open(tmp, "wb", compresslevel=6)
            f = io.TextIOWrapper(raw, encoding="utf-8") if text else raw
        else:
            f = open(tmp, "w" if text else "wb", **({"encoding": "utf-8"} if text else {}))
        with f:
            yield f
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def dump_line(obj: Any) -> str:
    """One compact JSON line (UTF-8 kept as is, no spaces), newline-terminated."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


def write_json(path: str, obj: Any) -> None:
    """Write a pretty JSON document atomically (used by every ``--json PATH`` flag)."""
    with atomic_output(path) as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
