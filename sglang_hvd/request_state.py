"""What the decision knows of one request between steps, and a batch of it for the features.

RequestState: prompt length, output position, the last TAIL_TOKENS context tokens and the
history of its cache drafts (RequestHistory). The serving stepper and replay keep one per
request (per policy in replay); ``observe(tokens)`` with every token the request emits,
``record(tokens)`` with each cache draft judged (before its verify).

StateBatch: the states of a batch's rows as arrays, taken before the rows' drafts are
recorded: what features.FeatureExtractor reads beside the drafts. ``StateBatch.of(states)``
snaps a decode batch; training snaps one row at a time (``RequestState.snapshot``) and
stacks them (``StateBatch.stack``): one front-end, the same arrays.

``new_request_state(prompt)``: the state the serving stepper and replay keep, native
(drafter/native/request_state.hpp: the same values, a batch packed and recorded in one
call each) where the drafter's extension is built, else this module's RequestState, the
reference (training's snapshots). A batch's states are all of one kind.

No label leakage: every history value at position p is computed from tokens before p.
A draft made at q < p is compared only with output[q:p]; its ``confirmed`` count is
min(accept_len(q), p - q) and it counts as broken only once a mismatch lies before p.

Worked example (history): drafts were made at q=10 (tokens a b c d) and q=12 (c d e).
The output is ``a b c x ...`` from position 10. At p=13 (tokens 10, 11, 12 known):
  draft@10: confirmed 3 (a b c), not broken yet (its 4th token d is at position 13)
  draft@12: compared with output[12:13] = c: confirmed 1, not broken
At p=14 (x known): draft@10 broke: resolved with accept_len 3; draft@12 compared
with c x: confirmed 1, broke (d != x): resolved with accept_len 1.
Scalars at p=14: hist_obs = (1, 3, 0, 0), hist_broke = (1, 1, 0, 0), gap log(1 + 2),
mean resolved accept 2.0.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence

import numpy as np

try:
    from .drafter._native import RequestState as NativeRequestState
except ImportError:  # the extension is not built: the reference serves (native_drafter.py logs why)
    NativeRequestState = None

HISTORY_K = 4  # earlier drafts shown one by one
MISS_WINDOW = 16  # drafts over which the first-token miss rate is taken
TAIL_TOKENS = 8  # context tokens whose flags are averaged
NUM_HISTORY = 2 * HISTORY_K + 4  # RequestHistory.scalars(): obs, broke, gap, mean accept, log resolved, miss rate
# StateBatch's packed row (RequestState.row): pos, prompt length, tail length, the tail padded with -1, the history
_COLUMNS = 3 + TAIL_TOKENS + NUM_HISTORY
_NO_TAIL = (-1,) * TAIL_TOKENS


class _Entry:
    __slots__ = ("pos", "tokens", "confirmed", "broke", "seq")

    def __init__(self, pos: int, tokens: tuple[int, ...], seq: int):
        self.pos, self.tokens, self.confirmed, self.broke, self.seq = pos, tokens, 0, False, seq

    @property
    def miss(self) -> bool:
        """Broke on its first token."""
        return self.broke and self.confirmed == 0


class RequestHistory:
    """A request's recent cache drafts and what the tokens generated since reveal of them.

    Call ``record(pos, draft_tokens)`` when a draft is made at output position ``pos``
    (before its verify), and ``observe(tokens)`` with every token the request emits, in
    order. RequestState does both for the decision. The first-token misses among the last
    MISS_WINDOW drafts are counted as drafts enter and leave the window (``scalars`` runs
    for every row of every decode step).
    """

    __slots__ = ("pos", "_recent", "_open", "resolved_sum", "resolved_count", "_recorded", "_misses")

    def __init__(self):
        self.pos = 0  # output tokens observed so far
        self._recent: collections.deque[_Entry] = collections.deque(maxlen=MISS_WINDOW)
        self._open: list[_Entry] = []  # entries still unresolved
        self.resolved_sum = 0
        self.resolved_count = 0
        self._recorded = 0  # drafts recorded so far (an entry's seq: the order it was recorded in)
        self._misses = 0  # entries of _recent that broke on their first token

    def record(self, pos: int, draft_tokens: tuple[int, ...]) -> None:
        if pos != self.pos:
            raise ValueError(f"draft recorded at position {pos}, but {self.pos} tokens were observed")
        if draft_tokens:
            entry = _Entry(pos, tuple(draft_tokens), self._recorded)
            self._recorded += 1
            if len(self._recent) == MISS_WINDOW and self._recent[0].miss:  # it leaves the window
                self._misses -= 1
            self._recent.append(entry)
            self._open.append(entry)

    def observe(self, tokens: Sequence[int]) -> None:
        start = self.pos
        self.pos += len(tokens)
        if not self._open:
            return
        still_open = []
        for e in self._open:
            # e.confirmed == start - e.pos: an open entry has matched every token so far.
            offset = start - e.pos
            n = min(len(tokens), len(e.tokens) - offset)
            k = 0
            while k < n and e.tokens[offset + k] == tokens[k]:
                k += 1
            e.confirmed = offset + k
            if k < n:
                e.broke = True
                if not e.confirmed and e.seq >= self._recorded - MISS_WINDOW:  # a miss still in the window
                    self._misses += 1
            if e.broke or e.confirmed == len(e.tokens):
                self.resolved_sum += e.confirmed
                self.resolved_count += 1
            else:
                still_open.append(e)
        self._open = still_open

    def scalars(self) -> list[float]:
        recent = self._recent
        if not recent:
            return [0.0] * NUM_HISTORY
        obs, broke = [0.0] * HISTORY_K, [0.0] * HISTORY_K
        for i in range(min(HISTORY_K, len(recent))):
            e = recent[-1 - i]
            obs[i] = float(e.confirmed)
            broke[i] = float(e.broke)
        gap = math.log1p(self.pos - recent[-1].pos)
        mean_acc = self.resolved_sum / self.resolved_count if self.resolved_count else 0.0
        return obs + broke + [gap, mean_acc, math.log1p(self.resolved_count), self._misses / len(recent)]


class RequestState:
    """A request's decision state (module docstring)."""

    __slots__ = ("num_prompt_tokens", "pos", "tail", "history")

    def __init__(self, prompt_ids: Sequence[int] | np.ndarray):
        self.num_prompt_tokens = len(prompt_ids)
        self.pos = 0  # output tokens observed
        self.tail = collections.deque((int(t) for t in prompt_ids[-TAIL_TOKENS:]), maxlen=TAIL_TOKENS)
        self.history = RequestHistory()

    def observe(self, tokens: Sequence[int]) -> None:
        if len(tokens):
            self.pos += len(tokens)
            self.tail.extend(tokens)
            self.history.observe(tokens)

    def record(self, draft_tokens: tuple[int, ...]) -> None:
        self.history.record(self.pos, draft_tokens)

    def snapshot(self) -> StateSnapshot:
        """This state now, as one row of a StateBatch."""
        return StateSnapshot(self.pos, self.num_prompt_tokens, tuple(self.tail), tuple(self.history.scalars()))

    def row(self) -> list:
        """This state now as one row of StateBatch's packed layout (``_COLUMNS``)."""
        tail = self.tail
        return [self.pos, self.num_prompt_tokens, len(tail), *tail, *_NO_TAIL[len(tail):], *self.history.scalars()]

    @staticmethod
    def pack_rows(states: Sequence[RequestState]) -> tuple[np.ndarray, ...]:
        """The states as StateBatch's arrays, in its fields' order (the native state's: one call)."""
        flat = []
        for s in states:
            flat += s.row()
        return StateBatch.unpack(flat, len(states))

    @staticmethod
    def observe_rows(states: Sequence[RequestState], tokens: Sequence[Sequence[int]]) -> None:
        """Each state's emitted tokens, ``tokens[i]`` into ``states[i]`` (the native state's: one call)."""
        if len(tokens) != len(states):
            raise ValueError("one token list per state")
        for s, t in zip(states, tokens):
            s.observe(t)

    @staticmethod
    def record_rows(states: Sequence[RequestState], tokens: np.ndarray, lens: np.ndarray) -> None:
        """Row i's draft, ``tokens[i, :lens[i]]`` (none when 0), into states[i]."""
        lens_list = lens.tolist()
        if any(lens_list):
            rows = tokens[:, : max(lens_list)].tolist()
            for s, n, t in zip(states, lens_list, rows):
                if n:
                    s.record(t[:n])


def new_request_state(prompt_ids: Sequence[int] | np.ndarray):
    """A request's decision state: native where built, else the reference (module docstring)."""
    if NativeRequestState is not None:
        return NativeRequestState(np.asarray(prompt_ids, dtype=np.int32))
    return RequestState(prompt_ids)


@dataclasses.dataclass(frozen=True, slots=True)
class StateSnapshot:
    pos: int  # output tokens generated so far
    num_prompt_tokens: int
    tail: tuple[int, ...]  # the last TAIL_TOKENS context tokens (fewer at the very start)
    history: tuple[float, ...]  # RequestHistory.scalars(), NUM_HISTORY values


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class StateBatch:
    """The states of B rows as the features read them."""

    pos: np.ndarray  # [B] float64 output tokens generated so far
    num_prompt_tokens: np.ndarray  # [B] float64
    history: np.ndarray  # [B, NUM_HISTORY] float32 RequestHistory.scalars() rows
    tails: np.ndarray  # [B, TAIL_TOKENS] int64: row i's last tail_lens[i] context tokens, left-aligned, -1 padded
    tail_lens: np.ndarray  # [B] int64

    def __len__(self) -> int:
        return len(self.pos)

    @classmethod
    def stack(cls, rows: Sequence[StateSnapshot]) -> StateBatch:
        flat = []
        for r in rows:
            if len(r.tail) > TAIL_TOKENS or len(r.history) != NUM_HISTORY:
                raise ValueError(f"a state snapshot holds at most {TAIL_TOKENS} tail tokens and {NUM_HISTORY} history "
                                 f"values, got {len(r.tail)} and {len(r.history)}")
            flat += (r.pos, r.num_prompt_tokens, len(r.tail), *r.tail, *_NO_TAIL[len(r.tail):], *r.history)
        return cls(*cls.unpack(flat, len(rows)))

    @classmethod
    def of(cls, states: Sequence[RequestState]) -> StateBatch:
        """A decode batch's states (all of one kind: new_request_state's)."""
        if not states:
            return cls(*cls.unpack([], 0))
        return cls(*type(states[0]).pack_rows(states))

    @staticmethod
    def unpack(flat, b: int) -> tuple[np.ndarray, ...]:
        """B rows of ``_COLUMNS`` values each (RequestState.row), in one list: one float64 array
        (token ids and counts are exact in it), cut into the fields' arrays, in their order."""
        a = np.asarray(flat, dtype=np.float64).reshape(b, _COLUMNS)
        tails = a[:, 3 : 3 + TAIL_TOKENS].astype(np.int64)
        return a[:, 0], a[:, 1], a[:, 3 + TAIL_TOKENS :].astype(np.float32), tails, a[:, 2].astype(np.int64)
