"""Plain-text summary tables and progress bars for the CLI."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any


def format_value(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_table(header: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None) -> str:
    """Right-aligned columns (first column left-aligned), one line per row."""
    cells = [[format_value(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]

    def line(values: Sequence[str]) -> str:
        first = values[0].ljust(widths[0])
        return "  ".join([first] + [v.rjust(w) for v, w in zip(values[1:], widths[1:])])

    out = [title] if title else []
    out += [line(list(header)), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    return "\n".join(out)


PROGRESS_LINE_EVERY_S = 5.0


class LineProgress:
    """Progress where stderr is not a terminal (a log file, a pipe, CI): one plain line
    every ``every_s`` seconds, ``import: 1,200/5,000 conv (24%), 12 s, ~38 s left``, and
    a last line with the total if any line was written (a run shorter than ``every_s``
    stays silent). The subset of tqdm's interface the CLI uses."""

    def __init__(self, iterable=None, *, total: int | None = None, desc: str = "", unit: str = "it",
                 every_s: float = PROGRESS_LINE_EVERY_S, stream=None, clock=time.monotonic):
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.every_s, self.stream, self.clock = every_s, stream if stream is not None else sys.stderr, clock
        self.n = 0
        self.postfix = ""
        self.start = self.last = clock()
        self.lines = 0

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update(1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def set_postfix(self, **values) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if now - self.last >= self.every_s and not (self.total and self.n >= self.total):  # the end: close says it
            self.last = now
            self._write(now, done=False)

    def close(self) -> None:
        if self.lines:
            self._write(self.clock(), done=True)
            self.lines = 0

    def _write(self, now: float, done: bool) -> None:
        elapsed = now - self.start
        count = f"{self.n:,}" + (f"/{self.total:,}" if self.total else "") + f" {self.unit}"
        if self.total:
            count += f" ({100 * self.n / self.total:.0f}%)"
        text = f"{self.desc}: {count}, {elapsed:.0f} s"
        if not done and self.total and self.n:
            text += f", ~{elapsed * (self.total - self.n) / self.n:.0f} s left"
        if done:
            text += ", done"
        if self.postfix:
            text += f" [{self.postfix}]"
        print(text, file=self.stream, flush=True)
        self.lines += 1


def progress(iterable=None, *, total: int | None = None, desc: str = "", unit: str = "it"):
    """A tqdm bar on stderr when it is a terminal, else a line every few seconds (LineProgress)."""
    if not sys.stderr.isatty():
        return LineProgress(iterable, total=total, desc=desc, unit=unit)
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=False)
