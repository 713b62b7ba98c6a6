"""Token traces: the contract between collection, replay and training.

One JSON object per line, one line per generation request (format version 1)::

    {"v": 1, "req_id": "conv-7/3", "conv_id": "conv-7", "turn": 3, "source": "tau-bench",
     "tokenizer": {"name": "qwen3", "digest": "9c1f..."},
     "prompt_ids": [151644, 872, ...], "output_ids": [40, 1079, ..., 151645],
     "steps": [{"pos": 0, "src": "eagle3", "draft": [40, 1079, 264], "accept_len": 2}, ...]}

``steps`` is optional (a live server's record of what it verified); ``.gz`` files are read
and written transparently; readers stream line by line.

Glossary (used across the package):
  req_id      string id of one generation request (unique within a trace file).
  conv_id     id of the conversation a request belongs to; splits never put one
              conversation on both sides.
  pos         index into ``output_ids`` at which a decode step starts: the tokens before
              it are already generated (context = prompt_ids + output_ids[:pos]).
  accept_len  number of draft tokens the target accepted at one verify; it never
              includes the bonus token the verify also yields, so a step emits
              ``out_len = accept_len + 1`` tokens (fewer only at the end of the output).
  batch_pos   a row of a decode batch (serving only), distinct from req_id.
  times end in _ms / _us; token counts start with num_.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from .errors import FileFormatError, HvdInputError
from .jsonl import atomic_output, dump_line, iter_json_lines

TRACE_FORMAT_VERSION = 1
STEP_SOURCES = ("cache", "eagle3", "greedy")


@dataclasses.dataclass(frozen=True, slots=True)
class TokenizerId:
    """Which tokenizer produced the ids: a readable name and a digest of its files."""

    name: str
    digest: str


@dataclasses.dataclass(frozen=True, slots=True)
class TraceStep:
    """One verify of a live server: the draft it checked and how much of it was accepted."""

    pos: int  # output position the step started at
    src: str  # which drafter's draft was verified: one of STEP_SOURCES
    draft: tuple[int, ...]
    accept_len: int  # excludes the bonus token


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class TraceRecord:
    """One generation request. Token arrays are read-only int32 numpy arrays."""

    req_id: str
    conv_id: str
    turn: int  # index of this request within its conversation (0-based)
    source: str  # dataset / workload name, the unit of per-source reports
    tokenizer: TokenizerId
    prompt_ids: np.ndarray  # [num_prompt_tokens] int32
    output_ids: np.ndarray  # [num_output_tokens] int32
    steps: tuple[TraceStep, ...] = ()

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "v": TRACE_FORMAT_VERSION,
            "req_id": self.req_id,
            "conv_id": self.conv_id,
            "turn": self.turn,
            "source": self.source,
            "tokenizer": {"name": self.tokenizer.name, "digest": self.tokenizer.digest},
            "prompt_ids": self.prompt_ids.tolist(),
            "output_ids": self.output_ids.tolist(),
        }
        if self.steps:
            obj["steps"] = [
                {"pos": s.pos, "src": s.src, "draft": list(s.draft), "accept_len": s.accept_len}
                for s in self.steps
            ]
        return obj


def token_array(ids: Iterable[int]) -> np.ndarray:
    """A read-only int32 array of token ids (the in-memory form used everywhere)."""
    arr = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.int32)
    arr.flags.writeable = False
    return arr


class _Invalid(ValueError):
    """Raised inside validation; turned into a FileFormatError with file and line."""


def _ids(obj: dict, key: str, *, allow_empty: bool) -> np.ndarray:
    value = obj.get(key)
    if not isinstance(value, list):
        raise _Invalid(f"'{key}' must be a list of token ids, got {type(value).__name__}")
    if not value and not allow_empty:
        raise _Invalid(f"'{key}' is empty")
    limit = np.iinfo(np.int32).max
    arr = np.asarray(value) if value else np.zeros(0, dtype=np.int64)
    if arr.dtype == object or (arr.dtype.kind in "iu" and arr.size and (arr.min() < 0 or arr.max() > limit)):
        # name the first id out of range (ids too big for int64 make an object array)
        i = next((i for i, v in enumerate(value) if type(v) is int and not 0 <= v <= limit), None)
        if i is not None:
            raise _Invalid(f"'{key}'[{i}] = {value[i]} is not a token id (ids lie in [0, 2^31))")
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise _Invalid(f"'{key}' must hold non-negative integers only")
    out = arr.astype(np.int32)
    out.flags.writeable = False
    return out


def _str(obj: dict, key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise _Invalid(f"'{key}' must be a non-empty string")
    return value


def _int(obj: dict, key: str, *, minimum: int = 0) -> int:
    value = obj.get(key)
    if type(value) is not int or value < minimum:
        raise _Invalid(f"'{key}' must be an integer >= {minimum}, got {value!r}")
    return value


def _step(obj: Any, output_ids: np.ndarray, index: int) -> TraceStep:
    if not isinstance(obj, dict):
        raise _Invalid(f"steps[{index}] must be an object")
    try:
        pos = _int(obj, "pos")
        accept_len = _int(obj, "accept_len")
        src = _str(obj, "src")
        draft = _ids(obj, "draft", allow_empty=True)
    except _Invalid as e:
        raise _Invalid(f"steps[{index}]: {e}") from None
    if src not in STEP_SOURCES:
        raise _Invalid(f"steps[{index}]: 'src' must be one of {', '.join(STEP_SOURCES)}, got {src!r}")
    if pos >= len(output_ids):
        raise _Invalid(f"steps[{index}]: pos {pos} is past the output ({len(output_ids)} tokens)")
    if accept_len > len(draft):
        raise _Invalid(f"steps[{index}]: accept_len {accept_len} exceeds the draft length {len(draft)}")
    # Accepted draft tokens are, by definition, the tokens the request then emitted.
    if not np.array_equal(draft[:accept_len], output_ids[pos : pos + accept_len]):
        raise _Invalid(f"steps[{index}]: the accepted draft prefix differs from output_ids at pos {pos}")
    return TraceStep(pos=pos, src=src, draft=tuple(draft.tolist()), accept_len=accept_len)


def parse_record(obj: Any) -> TraceRecord:
    """Validate one decoded JSON line; raises ValueError naming the first problem."""
    if not isinstance(obj, dict):
        raise _Invalid(f"a trace record must be a JSON object, got {type(obj).__name__}")
    version = obj.get("v")
    if version != TRACE_FORMAT_VERSION:
        if type(version) is int and version > TRACE_FORMAT_VERSION:
            raise _Invalid(
                f"trace format version {version} is newer than this sglang-hvd reads "
                f"({TRACE_FORMAT_VERSION}); upgrade sglang-hvd"
            )
        raise _Invalid(f"'v' must be the trace format version {TRACE_FORMAT_VERSION}, got {version!r}")
    tok = obj.get("tokenizer")
    if not isinstance(tok, dict):
        raise _Invalid("'tokenizer' must be an object with 'name' and 'digest'")
    tokenizer = TokenizerId(name=_str(tok, "name"), digest=_str(tok, "digest"))
    output_ids = _ids(obj, "output_ids", allow_empty=False)
    steps_obj = obj.get("steps", [])
    if not isinstance(steps_obj, list):
        raise _Invalid("'steps' must be a list")
    return TraceRecord(
        req_id=_str(obj, "req_id"),
        conv_id=_str(obj, "conv_id"),
        turn=_int(obj, "turn"),
        source=_str(obj, "source"),
        tokenizer=tokenizer,
        prompt_ids=_ids(obj, "prompt_ids", allow_empty=False),
        output_ids=output_ids,
        steps=tuple(_step(s, output_ids, i) for i, s in enumerate(steps_obj)),
    )


@dataclasses.dataclass(slots=True)
class ReadReport:
    """What a reader saw: records returned and invalid lines skipped (first few kept)."""

    num_records: int = 0
    num_skipped: int = 0
    first_errors: list[str] = dataclasses.field(default_factory=list)

    def skipped(self, message: str) -> None:
        self.num_skipped += 1
        if len(self.first_errors) < 5:
            self.first_errors.append(message)

    def summary(self) -> str:
        text = f"skipped {self.num_skipped} invalid line(s)"
        return text + (f", first: {self.first_errors[0]}" if self.first_errors else "")


def iter_traces(
    paths: str | Iterable[str], *, skip_invalid: bool = False, report: ReadReport | None = None
) -> Iterator[TraceRecord]:
    """Stream trace records from one or more files, in order.

    A malformed line raises FileFormatError (``FILE:LINE: what``) unless ``skip_invalid``,
    in which case it is counted in ``report`` and skipped. Duplicate ``req_id`` within the
    stream is an error: replay keys its per-request state by it.
    """
    report = report if report is not None else ReadReport()
    seen: set[str] = set()
    on_error = (lambda err: report.skipped(str(err))) if skip_invalid else None
    for path in [paths] if isinstance(paths, str) else paths:
        for line_no, obj in iter_json_lines(path, on_error):
            try:
                record = parse_record(obj)
                if record.req_id in seen:
                    raise _Invalid(f"duplicate req_id {record.req_id!r}")
            except _Invalid as e:
                if not skip_invalid:
                    raise FileFormatError(path, line_no, str(e)) from None
                report.skipped(f"{path}:{line_no}: {e}")
                continue
            seen.add(record.req_id)
            report.num_records += 1
            yield record


class TraceWriter:
    """Write trace records atomically: the file appears only when the writer closes cleanly."""

    def __init__(self, path: str):
        self.path = path
        self.num_records = 0
        self._ctx = atomic_output(path)
        self._f = None

    def __enter__(self) -> TraceWriter:
        self._f = self._ctx.__enter__()
        return self

    def write(self, record: TraceRecord) -> None:
        assert self._f is not None, "TraceWriter used outside its with-block"
        self._f.write(dump_line(record.to_json()))
        self.num_records += 1

    def __exit__(self, *exc) -> None:
        self._ctx.__exit__(*exc)


def single_tokenizer(records: Iterable[TraceRecord]) -> Iterator[TraceRecord]:
    """Pass records through, refusing a stream that mixes tokenizers (ids would not compare)."""
    first: TraceRecord | None = None
    for record in records:
        if first is None:
            first = record
        elif record.tokenizer != first.tokenizer:
            a, b = first.tokenizer, record.tokenizer
            raise HvdInputError(
                f"request {record.req_id!r} was tokenized with {b.name}@{b.digest}, but {first.req_id!r} with "
                f"{a.name}@{a.digest}: token ids of different tokenizers cannot share a cache; replay them separately"
            )
        yield record
