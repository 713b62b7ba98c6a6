"""Plain-text summary tables and progress bars for the CLI."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sequence
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


def _scaled(n: float) -> str:
    """1234 -> 1.2k, 5_600_000 -> 5.6M (tqdm's unit_scale)."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= factor:
            return f"{n / factor:.1f}{suffix}"
    return f"{n:,.0f}"


class LineProgress:
    """Progress where stderr is not a terminal (a log file, a pipe, CI): one plain line
    every ``every_s`` seconds, ``import: 1,200/5,000 conv (24%), 12 s, ~38 s left``, and
    a last line with the total if any line was written (a run shorter than ``every_s``
    stays silent). No last line when the work fails or is interrupted: its "done" would
    be untrue. ``eta=False`` leaves out the time left (for a total that is only a bound,
    such as epochs under early stopping). The subset of tqdm's interface the CLI uses."""

    def __init__(self, iterable=None, *, total: int | None = None, desc: str = "", unit: str = "it",
                 every_s: float = PROGRESS_LINE_EVERY_S, stream=None, clock=time.monotonic,
                 unit_scale: bool = False, eta: bool = True):
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.unit_scale, self.eta = unit_scale, eta
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

    def __exit__(self, kind, value, traceback):
        if kind is None:
            self.close()
        else:  # failed or interrupted: not "done"
            self.lines = 0

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
        num = _scaled if self.unit_scale else (lambda n: f"{n:,}")
        count = num(self.n) + (f"/{num(self.total)}" if self.total else "") + f" {self.unit}"
        if self.total:
            count += f" ({100 * self.n / self.total:.0f}%)"
        text = f"{self.desc}: {count}, {elapsed:.0f} s"
        if not done and self.eta and self.total and self.n:
            text += f", ~{elapsed * (self.total - self.n) / self.n:.0f} s left"
        if done:
            text += ", done"
        if self.postfix:
            text += f" [{self.postfix}]"
        print(text, file=self.stream, flush=True)
        self.lines += 1


def progress(iterable=None, *, total: int | None = None, desc: str = "", unit: str = "it", unit_scale: bool = False,
             eta: bool = True):
    """A tqdm bar on stderr when it is a terminal, else a line every few seconds (LineProgress).
    ``unit_scale``: counts as 1.2k, 3.4M; ``eta=False``: no time left (``total`` is a bound)."""
    if not sys.stderr.isatty():
        return LineProgress(iterable, total=total, desc=desc, unit=unit, unit_scale=unit_scale, eta=eta)
    from tqdm.auto import tqdm

    bar_format = None if eta else "{l_bar}{bar}| {n_fmt}/{total_fmt} {unit} [{elapsed}{postfix}]"
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=False,
                unit_scale=unit_scale, bar_format=bar_format)


class Ticking(Sequence):
    """A read-only view of ``items`` that advances ``bar`` as each item is iterated over
    (``weight(item)`` at a time, 1 by default): progress for a loop inside code that takes
    a sequence and no callback (replay.sweep)."""

    def __init__(self, items: Sequence, bar, weight: Callable[[Any], int] | None = None):
        self.items, self.bar, self.weight = items, bar, weight

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def __iter__(self):
        for item in self.items:
            yield item
            self.bar.update(self.weight(item) if self.weight else 1)
