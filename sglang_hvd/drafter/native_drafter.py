"""The native cache drafter ("native"): the C++ core in drafter/native/, same semantics as
the Python reference ("python"), with batch calls that release the GIL.

Built by the package's own install (setup.py, pybind11) when a C++17 compiler is present.
``native_available()`` says whether it was; ``default_drafter_name()`` picks it when it was
and otherwise falls back to the reference, logging why once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import numpy as np

from .batch import TREE_CODES, TREE_NAMES, DraftBatch, RowTreeBatch
from .protocol import MAX_DRAFT_THREADS, Draft, DrafterConfig, DraftTree, as_token_array
from .registry import register_drafter

log = logging.getLogger(__name__)

try:
    from . import _native
except ImportError as e:  # not built (no compiler at install time) or built for another Python
    _native = None
    _IMPORT_ERROR = str(e)
else:
    _IMPORT_ERROR = ""


def native_available() -> bool:
    return _native is not None


def native_import_error() -> str:
    """Why the extension did not load ("" when it did)."""
    return _IMPORT_ERROR


_warned = False


def default_drafter_name() -> str:
    """``native`` when the extension is built, else ``python`` (logged once)."""
    global _warned
    if _native is not None:
        return "native"
    if not _warned:
        log.warning("native drafter not built (%s); using the Python reference drafter, which is 10-40x slower. "
                    "Reinstall with a C++17 compiler (g++) to build it.", _IMPORT_ERROR)
        _warned = True
    return "python"


def default_draft_threads() -> int:
    """The threads a server drafts a decode batch on unless told: a quarter of the CPUs this
    process may run on, at most 4 (the rest stay for SGLang's scheduler, tokenizer and
    detokenizer), at least 1 -- 1 on a machine of fewer than 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus // 4))


class NativeDrafter:
    """Drafter protocol over the C++ core. Request ids map to integer handles.

    ``threads``: a batch call (``speculate_arrays``, ``speculate_rows``, ``speculate_step``)
    drafts its rows on this many threads, the calling thread one of them (batches of fewer than
    32 rows on the calling thread alone); the drafts are the same on any number."""

    name = "native"
    parallel = True  # takes ``threads`` (registry.create_drafter)

    def __init__(self, config: DrafterConfig | None = None, threads: int = 1):
        if _native is None:
            raise RuntimeError(f"the native drafter is not built ({_IMPORT_ERROR}); use --drafter python")
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_DRAFT_THREADS:
            raise ValueError(f"draft threads must be an integer in [1, {MAX_DRAFT_THREADS}], got {threads!r}")
        self.config = config or DrafterConfig()
        self.threads = threads
        c = self.config
        self._core = _native.Core(c.max_depth, c.max_spec_tokens, c.max_spec_factor, c.max_spec_offset,
                                  c.min_token_prob, c.global_max_tokens, c.max_occurrences, c.scan_limit, threads)
        self._handles: dict[str, int] = {}
        self._next = 0

    def reset(self) -> None:
        self._core.reset()
        self._handles.clear()

    def _handle(self, req_id: str, create: bool = False) -> int:
        h = self._handles.get(req_id)
        if h is None:
            if not create:
                raise KeyError(f"request {req_id!r} is not running (start_request first)")
            h = self._handles[req_id] = self._next
            self._next += 1
        return h

    def start_request(self, req_id: str, prompt_ids) -> None:
        h = self._handle(req_id, create=True)
        if self._core.is_running(h):
            raise ValueError(f"request {req_id!r} is already running")
        self._core.start(h, as_token_array(prompt_ids))

    def append(self, req_id: str, token_ids) -> None:
        h = self._running(req_id)
        if isinstance(token_ids, list) and len(token_ids) == 1:  # the per-token fast path
            self._core.append_one(h, token_ids[0])
        else:
            self._core.append(h, as_token_array(token_ids))

    def append_batch(self, req_ids: Sequence[str], token_ids: Sequence) -> None:
        """Append each request's emitted tokens in one call (GIL released): the serving step's
        appends, as lists; nothing is appended unless every request runs and every id is valid."""
        if len(req_ids) != len(token_ids):
            raise ValueError(f"append_batch: one token list per request, got {len(token_ids)} for {len(req_ids)}")
        handles = [self._handles.get(r, -1) for r in req_ids]
        chunks = [t if isinstance(t, list) else as_token_array(t).tolist() for t in token_ids]
        try:
            self._core.append_batch(handles, chunks)
        except KeyError:
            self._check_running(req_ids)  # raises, naming the first request that is not running
            raise
        except TypeError:  # pybind11 refused an id past int32, or one that is not an integer
            raise ValueError("token ids must be non-negative int32 values") from None

    def finish_request(self, req_id: str) -> None:
        self._core.finish(self._running(req_id))

    def speculate(self, req_id: str) -> Draft:
        tokens, probs, counts, score, match_len, match_count, tree = self._core.speculate(self._running(req_id))
        if not tokens:
            return Draft()
        return Draft(tokens=tokens, probs=probs, child_counts=counts, score=score, match_len=match_len,
                     match_count=match_count, tree=TREE_NAMES[tree])

    def speculate_tree(self, req_id: str, max_nodes: int, like: Draft | None = None) -> DraftTree:
        """A tree draft of at most ``max_nodes`` nodes (DraftTree); ``like``: only from the
        occurrence set that chain draft was drawn from (its tree and match length)."""
        only_tree, only_p = (TREE_CODES[like.tree], like.match_len) if like is not None and like.tokens else (0, 0)
        tokens, parents, probs, counts, score, match_len, match_count, tree = self._core.speculate_tree(
            self._running(req_id), max_nodes, only_tree, only_p)
        if not tokens:
            return DraftTree()
        return DraftTree(tokens=tokens, parents=parents, probs=probs, child_counts=counts, score=score,
                         match_len=match_len, match_count=match_count, tree=TREE_NAMES[tree])

    def speculate_arrays(self, req_ids: Sequence[str]) -> DraftBatch:
        """Drafts of a decode batch (GIL released), padded to max_spec_tokens."""
        return DraftBatch(**self._batch_call(self._core.speculate_batch, req_ids))

    def speculate_rows(self, req_ids: Sequence[str], max_nodes: int) -> RowTreeBatch:
        """The row trees of a batch (row_tree.py; GIL released), padded to ``max_nodes``."""
        return _row_trees(self._batch_call(self._core.speculate_rows, req_ids, max_nodes))

    def speculate_step(self, req_ids: Sequence[str], max_nodes: int,
                       siblings: int | None = None) -> tuple[DraftBatch, RowTreeBatch]:
        """``speculate_arrays`` and ``speculate_rows`` in one call (GIL released): each row's
        tree grown right after its chain, while the chain's occurrence set is in the cache;
        ``siblings`` (the protocol's): each row's tree cut at min(len(chain) + siblings, max_nodes)."""
        if siblings is not None and siblings < 0:
            raise ValueError(f"siblings must be >= 0, got {siblings}")
        a = self._batch_call(self._core.speculate_step, req_ids, max_nodes, -1 if siblings is None else siblings)
        rows = _row_trees(a)
        for k in _ROW_KEYS:
            del a[k]
        return DraftBatch(**a), rows

    def speculate_batch(self, req_ids: Sequence[str]) -> list[Draft]:
        batch = self.speculate_arrays(req_ids)
        return [batch.draft(i) for i in range(len(batch))]

    def context(self, req_id: str) -> np.ndarray:
        return self._core.context(self._running(req_id))

    def memory_stats(self) -> dict[str, float]:
        cached, local = self._core.global_tokens(), self._core.local_tokens()
        nbytes = self._core.nbytes()
        return {"global_tokens": float(cached), "local_tokens": float(local), "bytes": float(nbytes),
                "bytes_per_token": nbytes / max(1, cached + local), "evicted_responses": float(self._core.evicted()),
                "compactions": float(self._core.compactions()),
                "reused_prompt_tokens": float(self._core.reused_prompt_tokens())}

    def _batch_call(self, call, req_ids: Sequence[str], *args) -> dict:
        """A core batch call on the requests' handles; one the core refuses (a request that is
        not running) raises naming it."""
        try:
            return call(self._handles_of(req_ids), *args)
        except IndexError:
            self._check_running(req_ids)
            raise

    def _handles_of(self, req_ids: Sequence[str]) -> np.ndarray:
        """The requests' handles (-1: unknown), unchecked: a batch call's core checks them."""
        return np.array([self._handles.get(r, -1) for r in req_ids], dtype=np.int64)

    def _check_running(self, req_ids: Sequence[str]) -> None:
        for r in req_ids:
            self._running(r)

    def _running(self, req_id: str) -> int:
        h = self._handles.get(req_id)
        if h is None or not self._core.is_running(h):
            raise KeyError(f"request {req_id!r} is not running (start_request first)")
        return h


_ROW_KEYS = ("row_tokens", "row_parents", "row_probs", "row_lengths")


def _row_trees(a: dict) -> RowTreeBatch:
    """The row trees of a core call's arrays (``row_tokens``, ...)."""
    return RowTreeBatch(*(a[k] for k in _ROW_KEYS))


if _native is not None:
    register_drafter("native")(NativeDrafter)
