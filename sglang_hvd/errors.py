"""Errors raised at the edges (bad files, bad flags), each naming the problem and the fix.

The CLI turns every `HvdInputError` into one line on stderr and exit code 2; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations


class HvdInputError(Exception):
    """Input the user can fix: a malformed file, a missing path, a bad option value."""


class FileFormatError(HvdInputError):
    """One malformed line of a JSON Lines file, reported as ``FILE:LINE: what is wrong``."""

    def __init__(self, path: str, line_no: int, what: str):
        self.path = path
        self.line_no = line_no
        self.what = what
        super().__init__(f"{path}:{line_no}: {what}")
