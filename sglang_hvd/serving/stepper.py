"""One HVD decode step for a batch, free of sglang and torch.

Per step the serving worker calls, for the batch's requests in row order:
  sync(rid, prompt_ids, output_ids)   bring the drafter up to date with each request
  decide(rids, width)                 cache drafts + features + gate -> which rows use them
  verified(rids, accept_lens, rows)   what the verify accepted (metrics, trace steps)
and finish(rid) when a request ends. The gate runs once per step on the whole batch. A
gate that fails at run time makes that step use EAGLE3 for every row: logged once,
counted in ``stats()["gate_errors"]``, never raised into the server.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Sequence

import numpy as np

from ..drafter.protocol import Draft, Drafter
from ..features import TAIL_TOKENS, RequestHistory
from ..trace import TokenizerId, TraceRecord, TraceStep, token_array

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class StepDecision:
    use_cache: np.ndarray  # [B] bool: the row verifies the cache draft this step
    cache_tokens: np.ndarray  # [B, width] int32 cache draft tokens, -1 beyond cache_lens
    cache_lens: np.ndarray  # [B] int32 tokens of the cache draft that fit the verify width
    predicted: np.ndarray  # [B] float32 gate prediction of accept_len (nan: not judged)


class _Request:
    __slots__ = ("prompt", "output", "tail", "history", "pending", "steps")

    def __init__(self, prompt: np.ndarray):
        self.prompt = prompt
        self.output: list[int] = []
        self.tail = collections.deque(prompt[-TAIL_TOKENS:].tolist(), maxlen=TAIL_TOKENS)
        self.history = RequestHistory()
        self.pending: tuple[int, str, tuple[int, ...]] | None = None  # (pos, src, draft) of the last decide
        self.steps: list[TraceStep] = []


@dataclasses.dataclass(slots=True)
class StepStats:
    steps: int = 0
    rows: int = 0
    cache_rows: int = 0
    cache_accepted: int = 0
    eagle3_rows: int = 0
    eagle3_accepted: int = 0
    gate_errors: int = 0
    cpu_us_total: float = 0.0


class HVDStepper:
    def __init__(self, drafter: Drafter, gate, threshold: float | None = None, recorder=None,
                 tokenizer: TokenizerId | None = None, source: str = "served"):
        self.drafter = drafter
        self.gate = gate
        self.threshold = gate.threshold if threshold is None and gate is not None else (threshold or 0.0)
        self.recorder = recorder
        self.tokenizer = tokenizer or TokenizerId("unknown", "unknown")
        self.source = source
        self._reqs: dict[str, _Request] = {}
        self.stats = StepStats()
        self._gate_error_logged = False

    def __contains__(self, rid: str) -> bool:
        return rid in self._reqs

    # -- bookkeeping -------------------------------------------------------------------

    def sync(self, rid: str, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> None:
        """Register a new request, or append the tokens it emitted since the last sync."""
        st = self._reqs.get(rid)
        if st is None:
            st = self._reqs[rid] = _Request(np.asarray(prompt_ids, dtype=np.int32))
            self.drafter.start_request(rid, st.prompt)
        new = list(output_ids[len(st.output):])
        if not new:
            return
        st.output.extend(new)
        st.tail.extend(new)
        st.history.observe(new)
        self.drafter.append(rid, new)

    def finish(self, rid: str, final_output: Sequence[int] | None = None) -> None:
        """The request ended: its response stays in the global cache; record its trace.

        ``final_output``: the response as returned, when the server cut tokens it had
        already accepted (a stop string, max_new_tokens inside an accepted run).
        """
        st = self._reqs.pop(rid, None)
        if st is None:
            return
        self.drafter.finish_request(rid)
        if final_output is not None and len(final_output) < len(st.output):
            st.output = list(final_output)
        if self.recorder is not None and st.output:
            self.recorder.record(TraceRecord(
                req_id=rid, conv_id=rid, turn=0, source=self.source, tokenizer=self.tokenizer,
                prompt_ids=token_array(st.prompt), output_ids=token_array(st.output),
                # A stop or max_new_tokens may cut the last verify's accepted run short.
                steps=tuple(dataclasses.replace(s, accept_len=min(s.accept_len, len(st.output) - s.pos))
                            for s in st.steps if s.pos < len(st.output)),
            ))

    def running(self) -> list[str]:
        return list(self._reqs)

    def reset(self) -> None:
        self._reqs.clear()
        self.drafter.reset()

    # -- the step --------------------------------------------------------------------

    def decide(self, rids: Sequence[str], width: int) -> StepDecision:
        """Cache drafts for the batch and the gate's verdict per row."""
        start = time.perf_counter()
        b = len(rids)
        arrays = self.drafter.speculate_arrays(rids)
        lens = arrays["lengths"].astype(np.int32)
        states = [self._reqs[r] for r in rids]
        predicted = np.full(b, np.nan, dtype=np.float32)
        use = np.zeros(b, dtype=bool)
        judged = lens > 0
        if self.gate is not None and judged.any():
            try:
                pos = np.array([len(s.output) for s in states], dtype=np.float64)
                prompt = np.array([len(s.prompt) for s in states], dtype=np.float64)
                hist = np.array([s.history.scalars() for s in states], dtype=np.float32)
                tails = np.full((b, TAIL_TOKENS), -1, dtype=np.int64)
                tail_lens = np.zeros(b, dtype=np.int64)
                for i, s in enumerate(states):
                    tail_lens[i] = len(s.tail)
                    tails[i, : len(s.tail)] = list(s.tail)
                x = self.gate.extractor.from_arrays(arrays, pos, prompt, hist, tails, tail_lens)
                pred = np.asarray(self.gate.predict(x), dtype=np.float32)
                if pred.shape != (b,) or not np.all(np.isfinite(pred)):
                    raise ValueError(f"gate returned shape {pred.shape} / non-finite values")
                predicted = np.where(judged, pred, np.nan).astype(np.float32)
                use = judged & (pred > self.threshold)
            except Exception as e:  # the gate must never take the server down
                self.stats.gate_errors += 1
                use[:] = False
                if not self._gate_error_logged:
                    log.error("HVD gate failed at run time (%s: %s); this step and any like it use EAGLE3 drafts. "
                              "Further gate errors are counted, not logged.", e.__class__.__name__, e)
                    self._gate_error_logged = True
        cache_lens = np.minimum(lens, width).astype(np.int32)
        tokens = np.ascontiguousarray(arrays["tokens"][:, :width], dtype=np.int32)
        for i, s in enumerate(states):
            n = int(lens[i])
            draft = tuple(arrays["tokens"][i, :n].tolist()) if n else ()
            s.history.record(len(s.output), Draft(tokens=draft))
            s.pending = (len(s.output), "cache" if use[i] else "eagle3", draft[: int(cache_lens[i])])
        self.stats.cpu_us_total += (time.perf_counter() - start) * 1e6
        self.stats.steps += 1
        return StepDecision(use, tokens, cache_lens, predicted)

    def verified(self, rids: Sequence[str], accept_lens: Sequence[int], eagle3_rows: np.ndarray | None = None) -> None:
        """Accepted draft tokens per row (bonus excluded) of the step just verified.

        ``eagle3_rows`` [B, N-1]: the EAGLE3 drafts of the rows, for the recorded trace.
        """
        for i, rid in enumerate(rids):
            st = self._reqs.get(rid)
            if st is None or st.pending is None:
                continue
            pos, src, draft = st.pending
            st.pending = None
            a = int(accept_lens[i])
            self.stats.rows += 1
            if src == "cache":
                self.stats.cache_rows += 1
                self.stats.cache_accepted += a
            else:
                self.stats.eagle3_rows += 1
                self.stats.eagle3_accepted += a
                draft = tuple(int(t) for t in eagle3_rows[i]) if eagle3_rows is not None else ()
            if self.recorder is not None:
                st.steps.append(TraceStep(pos=pos, src=src, draft=draft, accept_len=min(a, len(draft))))

    def summary(self) -> dict[str, float]:
        s = self.stats
        return {
            "steps": s.steps, "rows": s.rows, "gate_errors": s.gate_errors,
            "cache_pick_rate": s.cache_rows / max(s.rows, 1),
            "cache_mean_accept": s.cache_accepted / max(s.cache_rows, 1),
            "eagle3_mean_accept": s.eagle3_accepted / max(s.eagle3_rows, 1),
            "cpu_us_per_step": s.cpu_us_total / max(s.steps, 1),
            "recorded_dropped": getattr(self.recorder, "num_dropped", 0),
        }
