"""Collect token traces from a live SGLang server: the target model's own generations.

For every assistant turn of the given conversations the prompt is rendered exactly as
``hvd import`` renders it, sent as token ids to SGLang's native ``/generate`` (temperature
0 by default; collect at your serving temperature and top-p and the labels replay derives
follow what verify accepts there: README, "Sampling"), and the returned token ids become
the request's output. Requests run
with bounded concurrency; transient failures (connection errors, timeouts, HTTP 5xx,
429) are retried with exponential backoff; when the server stays unreachable the run
stops and keeps what it has. Records are appended, as they complete, to
``OUTPUT.partial``; running the same command again resumes, skipping every request
already there, and the file is renamed to OUTPUT only when every request succeeded.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator

from .conversation import Conversation
from .errors import HvdInputError
from .importer import ImportOptions, render_turns
from .jsonl import dump_line, open_text
from .tokenizer import ChatTokenizer
from .trace import TraceRecord, parse_record, token_array


@dataclasses.dataclass(frozen=True, slots=True)
class CollectOptions:
    concurrency: int = 8
    max_new_tokens: int = 2048
    timeout_s: float = 600.0
    retries: int = 5
    backoff_s: float = 1.0
    temperature: float = 0.0
    top_p: float = 1.0


class ServerUnreachable(HvdInputError):
    """The server kept failing after every retry."""


@dataclasses.dataclass(frozen=True, slots=True)
class Job:
    req_id: str
    conv: Conversation
    turn: int
    prompt_ids: list[int]


def iter_jobs(conversations: Iterable[Conversation], tokenizer: ChatTokenizer, options: ImportOptions) -> Iterator[Job]:
    for conv in conversations:
        for turn, (prompt, _) in enumerate(render_turns(conv, tokenizer, options)):
            yield Job(f"{conv.conv_id}#{turn}", conv, turn, tokenizer.encode(prompt))


def done_ids(partial: str) -> set[str]:
    """Request ids already collected in a partial file (a torn last line is ignored)."""
    if not os.path.exists(partial):
        return set()
    seen = set()
    with open_text(partial) as f:
        for line in f:
            try:
                seen.add(parse_record(json.loads(line)).req_id)
            except (json.JSONDecodeError, ValueError):
                continue  # an interrupted write
    return seen


class Client:
    """POST /generate with retries and backoff."""

    def __init__(self, url: str, options: CollectOptions):
        self.url = url.rstrip("/") + "/generate"
        self.options = options

    def generate(self, prompt_ids: list[int], ignore_eos: bool = False) -> dict:
        params = {"temperature": self.options.temperature, "top_p": self.options.top_p,
                  "max_new_tokens": self.options.max_new_tokens}
        if ignore_eos:  # exactly max_new_tokens (hvd profile's load)
            params["ignore_eos"] = True
        body = json.dumps({"input_ids": prompt_ids, "sampling_params": params}).encode()
        delay = self.options.backoff_s
        last = ""
        for attempt in range(self.options.retries + 1):
            try:
                req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=self.options.timeout_s) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as e:
                if e.code < 500 and e.code != 429:
                    detail = e.read().decode(errors="replace")[:300]
                    raise HvdInputError(f"the server refused the request (HTTP {e.code}): {detail}") from None
                last = f"HTTP {e.code}"
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
                last = f"{e.__class__.__name__}: {getattr(e, 'reason', e)}"
            if attempt < self.options.retries:
                time.sleep(delay * (1 + 0.25 * random.random()))
                delay *= 2
        raise ServerUnreachable(f"{self.url}: still failing after {self.options.retries} retries ({last})")


@dataclasses.dataclass(slots=True)
class CollectResult:
    collected: int = 0
    resumed: int = 0
    failed: list[str] = dataclasses.field(default_factory=list)
    output_tokens: int = 0


def collect(jobs: Iterable[Job], client: Client, tokenizer: ChatTokenizer, output: str, options: CollectOptions,
            on_done: Callable[[], None] | None = None) -> CollectResult:
    partial = output + ".partial"
    skip = done_ids(partial)
    result = CollectResult()
    lock = threading.Lock()
    with open(partial, "a", encoding="utf-8") as out, \
            concurrent.futures.ThreadPoolExecutor(max_workers=options.concurrency) as pool:
        pending: set = set()
        stop = threading.Event()

        def run(job: Job):
            if stop.is_set():
                return
            try:
                response = client.generate(job.prompt_ids)
            except ServerUnreachable:
                stop.set()
                raise
            except HvdInputError as e:
                with lock:
                    result.failed.append(f"{job.req_id}: {e}")
                return
            ids = response.get("output_ids")
            if not ids:
                with lock:
                    result.failed.append(f"{job.req_id}: the response has no output_ids")
                return
            record = TraceRecord(req_id=job.req_id, conv_id=job.conv.conv_id, turn=job.turn, source=job.conv.source,
                                 tokenizer=tokenizer.identity, prompt_ids=token_array(job.prompt_ids),
                                 output_ids=token_array(ids))
            with lock:
                out.write(dump_line(record.to_json()))
                out.flush()
                result.collected += 1
                result.output_tokens += len(ids)

        error: BaseException | None = None
        for job in jobs:
            if job.req_id in skip:
                result.resumed += 1
                if on_done:
                    on_done()
                continue
            while len(pending) >= options.concurrency:
                finished, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for f in finished:
                    error = error or f.exception()
                    if on_done:
                        on_done()
            if stop.is_set():
                break
            pending.add(pool.submit(run, job))
        for f in concurrent.futures.as_completed(pending):
            error = error or f.exception()
            if on_done:
                on_done()
    if error is not None:
        raise error
    if not result.failed:
        os.replace(partial, output)
    return result
