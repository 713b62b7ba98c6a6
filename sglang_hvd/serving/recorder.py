"""Trace recording off the decode path: a bounded queue and a background writer thread.

``record()`` never blocks: when the queue is full the record is dropped and counted
(``num_dropped``), because a slow disk must not slow decoding. The writer appends JSON
lines (``.gz`` gets one gzip member per flush, which readers handle), flushing whenever
the queue runs empty, at least every ``flush_s`` seconds, and on ``close()`` (also
registered with atexit; a server killed with SIGKILL loses at most the current burst).
A record that cannot be written (disk full, file gone read-only, a record that does not
serialise) is counted (``num_failed``) and the writer goes on: the first failure is logged
with its reason, later ones every 1,000; serving never sees them.
"""

from __future__ import annotations

import atexit
import gzip
import logging
import os
import queue
import threading

from ..jsonl import dump_line
from ..trace import TraceRecord

log = logging.getLogger(__name__)
_STOP = object()


def rank_path(path: str, dp_rank: int | None) -> str:
    """Where one data-parallel rank records: ``path`` itself without DP (``dp_rank``
    None), else the rank before the extension, so no two processes append to one file
    (lines of 100 kB interleave): ``served.jsonl`` -> ``served.dp1.jsonl``,
    ``t.jsonl.gz`` -> ``t.dp0.jsonl.gz``, ``traces`` -> ``traces.dp1``. ``hvd train``
    takes them all (``hvd train served.dp*.jsonl ...``)."""
    if dp_rank is None:
        return path
    folder, name = os.path.split(path)
    for ext in (".jsonl.gz", ".json.gz", ".gz", ".jsonl", ".json"):
        if name.endswith(ext) and len(name) > len(ext):
            return os.path.join(folder, f"{name[: -len(ext)]}.dp{dp_rank}{ext}")
    return os.path.join(folder, f"{name}.dp{dp_rank}")


class TraceRecorder:
    def __init__(self, path: str, max_queue: int = 4096, flush_s: float = 2.0):
        self.path = path
        self.num_written = 0
        self.num_dropped = 0  # the queue was full
        self.num_failed = 0  # writing failed
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._flush_s = flush_s
        # Open now: an unwritable path is an error at start-up, not a silent loss later.
        self._file = (gzip.open(path, "at", encoding="utf-8") if path.endswith(".gz")
                      else open(path, "a", encoding="utf-8"))
        self._thread = threading.Thread(target=self._run, name="hvd-trace-recorder", daemon=True)
        self._thread.start()
        self._closed = False
        atexit.register(self.close)

    def record(self, record: TraceRecord) -> bool:
        """Queue a record; False (and counted) if the queue is full."""
        try:
            self._queue.put_nowait(record)
            return True
        except queue.Full:
            self.num_dropped += 1
            if self.num_dropped == 1 or self.num_dropped % 1000 == 0:
                log.warning("HVD trace recorder queue full: %d record(s) dropped so far", self.num_dropped)
            return False

    def _failed(self, what: str, e: Exception, records: int) -> None:
        self.num_failed += records
        if self.num_failed == records or self.num_failed // 1000 != (self.num_failed - records) // 1000:
            log.error("HVD trace recorder: %s %s failed (%s: %s); %d record(s) lost so far, serving goes on",
                      what, self.path, e.__class__.__name__, e, self.num_failed)

    def _flush(self, unflushed: int) -> int:
        try:
            self._file.flush()
        except Exception as e:  # disk full: what was buffered is lost
            self.num_written -= unflushed
            self._failed("flushing", e, unflushed)
        return 0

    def _run(self) -> None:
        unflushed = 0  # records written into the buffer since the last flush
        while True:
            try:
                item = self._queue.get(timeout=self._flush_s)
            except queue.Empty:
                unflushed = self._flush(unflushed)
                continue
            if item is _STOP:
                break
            try:
                self._file.write(dump_line(item.to_json()))
                self.num_written += 1
                unflushed += 1
            except Exception as e:  # a full disk or a record that cannot be serialised must not kill the writer
                self._failed("writing to", e, 1)
            if self._queue.empty():  # end of a burst: on disk now, in case the process is killed
                unflushed = self._flush(unflushed)
        self._flush(unflushed)

    def close(self) -> None:
        """Write everything queued, then close the file (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join(timeout=30)
        try:
            self._file.close()
        except Exception as e:
            self._failed("closing", e, 0)
