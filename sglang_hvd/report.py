"""Plain-text summary tables and progress bars for the CLI."""

from __future__ import annotations

import sys
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


def progress(iterable=None, *, total: int | None = None, desc: str = "", unit: str = "it"):
    """A tqdm bar on stderr; hidden automatically when stderr is not a terminal."""
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, disable=None, dynamic_ncols=True, leave=False)
