"""HVD end to end on a real SGLang 0.5.23 server (CPU engine): the plugin, the worker, the
launcher, trace recording and collection, against the non-speculative server's output.

Servers (one at a time, ~40 s to start each): the tiny random Llama target, with
  reference   no speculation: the expected tokens
  eagle3      plain EAGLE3 with a random draft (accept length ~1)
  hvd         EAGLE3 + HVD through the plugin's environment variables (what `sglang serve`
              users set), recording traces, the gate's threshold forced to -1 so that every
              non-empty cache draft is verified (a deterministic mixed batch); then one batch
              with a per-request `hvd` control each (off, auto, cache, eagle3)
  hvd_broken  EAGLE3 + HVD through `python -m sglang_hvd.launch_server`, with a gate that
              loads but fails at run time on every batch size but 2
  hvd_dp2     HVD with data parallelism (--dp-size 2: two schedulers, each its own HVD
              worker, global cache and recorder file), every cache draft verified (a gate
              whose own threshold is -1); then its gate is swapped under load (POST
              /hvd/update_gate) and `hvd adapt` retrains it from the recorded traffic
  hvd_tp2     HVD with tensor parallelism (--tp-size 2 over gloo, tests/sglang_cpu shim):
              rank 0 decides, both ranks verify its rows; every cache draft verified;
              recording, so its decisions are compared with hvd's (TP 1)
  router      two HVD servers (as hvd, without recording) behind sglang-router's
              cache-aware policy (the `full` tests: `bash tests/run --sglang --full`)
Every prompt is sent twice; the second round finds the first round's responses in the
global cache, so its cache drafts are right: accept lengths near the maximum.
"""

from __future__ import annotations

import json
import os
import random
import subprocess

import pytest

pytest.importorskip("sglang", reason="the SGLang CPU harness needs the sglang extra (sglang==0.5.23)")

from sglang_hvd.harness import server as harness  # noqa: E402
from sglang_hvd.harness.faults import faulty_gate, gate_variant  # noqa: E402

from . import REPO  # noqa: E402

pytestmark = [pytest.mark.sglang, pytest.mark.e2e]


def _prompts() -> list[dict]:
    rng = random.Random(99)
    block = [rng.randrange(100, 150000) for _ in range(24)]
    reqs = [dict(input_ids=[rng.randrange(100, 150000) for _ in range(n)], max_new_tokens=m)
            for n, m in zip([7, 19, 40, 64, 33], [40, 24, 40, 17, 40])]
    # Prompts that repeat themselves: the request's own tree drafts from them at once.
    reqs += [dict(input_ids=block * 3, max_new_tokens=40), dict(input_ids=block + [5, 6] + block, max_new_tokens=32)]
    return reqs


PROMPTS = _prompts()


def _sequential_prompts() -> list[dict]:
    """Sent one at a time to a fresh server (hvd and hvd_tp2) before anything else: the
    drafter's state, and so every decision, is then the same on both servers. Two prompts
    repeat a block, so their own tree drafts at once."""
    rng = random.Random(7)
    block = [rng.randrange(100, 150000) for _ in range(16)]
    return [dict(input_ids=block * 3, max_new_tokens=32),
            dict(input_ids=[rng.randrange(100, 150000) for _ in range(20)], max_new_tokens=24),
            dict(input_ids=block + [9] + block, max_new_tokens=32)]


SEQUENTIAL = _sequential_prompts()


def _hvd(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([harness.SGLANG_PYTHON, "-m", "sglang_hvd.cli.main", *cmd], capture_output=True, text=True,
                          cwd=REPO, timeout=900, **kw)


@pytest.fixture(scope="module")
def qwen_gate(qwen_gates) -> str:
    """A gate for these servers' verify shape: topk 1, 3 steps, 4 nodes."""
    return qwen_gates(1, 3, 4)


@pytest.fixture(scope="module")
def runs(sglang_server_factory, sglang_cpu_models, qwen_gate, qwen_gates, tmp_path_factory):
    """Serve PROMPTS twice on each server; keep responses, server info and logs."""
    m = sglang_cpu_models
    work = tmp_path_factory.mktemp("hvd_e2e")
    eagle = harness.eagle3_args(m.llama_draft, topk=1, steps=3)
    broken = faulty_gate(qwen_gate, str(work / "broken_gate"), works_only_at=2)
    # the gate with its own threshold -1: every cache draft verified, no --hvd-threshold (which a swap would keep)
    every = gate_variant(qwen_gate, work / "gate_every", decision={"threshold": -1.0})
    configs = {
        "reference": dict(extra_args=[]),
        "eagle3": dict(extra_args=eagle),
        "hvd": dict(extra_args=eagle + ["--enable-metrics"],
                    env={"SGLANG_HVD_ENABLE": "1", "SGLANG_HVD_GATE": qwen_gate,
                         "SGLANG_HVD_THRESHOLD": "-1", "SGLANG_HVD_DRAFTER": "native",
                         # calibrated payoffs are >= 0 > -1: every cache draft is still verified
                         "SGLANG_HVD_ONLINE_CALIBRATION": "1",
                         "SGLANG_HVD_RECORD_TRACES": str(work / "served.jsonl")}),
        "hvd_broken": dict(extra_args=eagle + ["--hvd-gate", broken], launcher="sglang_hvd.launch_server"),
        # SGLang's CPU path binds each rank to a NUMA node unless told which cores to use.
        "hvd_dp2": dict(extra_args=eagle + ["--dp-size", "2", "--hvd-gate", every,
                                            "--hvd-record-traces", str(work / "dp.jsonl")],
                        launcher="sglang_hvd.launch_server", env={"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}),
        "hvd_tp2": dict(extra_args=eagle + ["--tp-size", "2", "--hvd-gate", qwen_gate, "--hvd-threshold", "-1",
                                            "--hvd-drafter", "native", "--hvd-record-traces", str(work / "tp2.jsonl")],
                        launcher="sglang_hvd.launch_server", env={"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}),
    }
    out = {"work": work, "gate_every": every}
    for name, cfg in configs.items():
        server = sglang_server_factory(m.llama, **cfg)
        try:
            if name in ("hvd", "hvd_tp2"):
                for p in SEQUENTIAL:
                    server.generate(**p)
            rounds = [server.generate_many(PROMPTS) for _ in range(2)]
            info = server.server_info()
            extra = {}
            if name == "hvd":
                import time
                import urllib.request

                time.sleep(1.5)  # gauges are refreshed at most once a second
                server.generate_many(PROMPTS[:2])
                extra["metrics"] = urllib.request.urlopen(server.url + "/metrics", timeout=30).read().decode()
                extra["collect"] = _collect(server, work)
                extra["frontend"] = _frontend(server.url)
                extra["control"] = _per_request_control(server)
            if name == "hvd_dp2":
                extra["status"] = _hvd(["status", server.url, "--json", str(work / "status.json")])
                extra["swap"] = _swap_under_load(server, qwen_gate, work)
                extra["adapt"] = _adapt(server, qwen_gates.root, extra["swap"]["other"], work)
            if name == "reference":
                extra["frontend"] = _frontend(server.url)
            out[name] = dict(rounds=rounds, info=info, log=server.log_path, **extra)
        finally:
            server.stop()
    out["hvd_config"] = configs["hvd"]
    return out


@pytest.fixture(scope="module")
def router(sglang_server_factory, sglang_cpu_models, runs) -> dict:
    """The router's servers (the `full` tests only: four server starts)."""
    return _behind_router(sglang_server_factory, sglang_cpu_models.llama, runs["hvd_config"], runs["work"])


def _post(url: str, body: dict) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _swap_under_load(server, gate: str, work) -> dict:
    """Two clients send PROMPTS throughout while the gate is swapped to a copy that never
    verifies a cache draft (threshold 1e6: another digest, the same shape and drafter;
    a stand-in for a gate trained elsewhere that undervalues this traffic's cache drafts),
    then refused swaps: a gate of other drafter settings, a missing directory, no body."""
    import threading
    import time

    other = gate_variant(gate, work / "gate_never", decision={"threshold": 1e6})
    wrong = gate_variant(gate, work / "gate_depth", drafter={"max_depth": 7})
    stop, batches, errors = threading.Event(), [], []

    def client():
        while not stop.is_set():
            try:
                batches.append(server.generate_many(PROMPTS))
            except Exception as e:  # the test reports it
                errors.append(repr(e))

    clients = [threading.Thread(target=client) for _ in range(2)]
    for t in clients:
        t.start()
    try:
        time.sleep(3)
        swapped = _post(server.url + "/hvd/update_gate", {"gate_path": other})
        time.sleep(3)
        refused = [_post(server.url + "/hvd/update_gate", body)
                   for body in ({"gate_path": wrong}, {"gate_path": str(work / "no_such_gate")}, {})]
        # the load goes on for at least 4 batches in all (a busy machine serves fewer in these seconds)
        deadline = time.monotonic() + 300
        while len(batches) < 4 and not errors and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1)
    finally:
        stop.set()
        for t in clients:
            t.join(timeout=300)
    status = _hvd(["status", server.url, "--json", str(work / "status_swap.json")])
    return dict(other=other, swapped=swapped, refused=refused, batches=batches, errors=errors, status=status,
                info=server.server_info())


def _adapt(server, gates_root: str, serving: str, work) -> dict:
    """``hvd adapt`` over the ranks' recorded traces, the gates' synthetic set as the base."""
    from sglang_hvd.harness.tiny_models import qwen_tokenizer_dir

    recorded = [str(work / f"dp.dp{k}.jsonl") for k in (0, 1)]
    done = _hvd(["adapt", *recorded, "--url", server.url, "--gate", serving, "--base",
                 os.path.join(gates_root, "data", "t.jsonl"), "--tokenizer", qwen_tokenizer_dir(), "-o",
                 str(work / "adapted"), "--held-back", "0.4", "--epochs", "4", "--concurrency", "4", "--json",
                 str(work / "adapt.json")])
    return dict(done=done, report=json.loads((work / "adapt.json").read_text()) if done.returncode == 0 else None,
                gate=str(work / "adapted"), info=server.server_info())


CONTROLS = ["off", "auto", "cache", "eagle3", "off", "auto", "off"]  # one per PROMPTS entry


def _per_request_control(server) -> dict:
    """PROMPTS once more, each with its ``hvd`` control, in one batch; /server_info's
    figures before and after; and refused values (native and OpenAI APIs)."""
    def hvd_block():
        return [s["hvd"] for s in server.server_info()["internal_states"] if "hvd" in s][0]

    before = hvd_block()
    responses = server.generate_many([dict(p, sampling_params={"custom_params": {"hvd": c}})
                                      for p, c in zip(PROMPTS, CONTROLS)])
    after = hvd_block()
    refused = []
    for path, body in (("/generate", {"input_ids": PROMPTS[0]["input_ids"],
                                      "sampling_params": {"max_new_tokens": 4, "custom_params": {"hvd": "sometimes"}}}),
                       ("/v1/completions", {"model": "default", "prompt": PROMPTS[0]["input_ids"], "max_tokens": 4,
                                            "custom_params": {"hvd": 3}})):
        try:
            server.request(path, body)
            refused.append("accepted")
        except RuntimeError as e:
            refused.append(str(e).split("--- server log tail")[0])
    return dict(responses=responses, before=before, after=after, refused=refused)


def _behind_router(factory, model: str, hvd: dict, work) -> dict:
    """PROMPTS twice through sglang-router (cache_aware) over two HVD servers; then a
    gate roll (threshold -1 -> 0.5, one replica at a time, harness.roll_replica) while
    three clients keep sending PROMPTS, with ``hvd status`` between the two restarts."""
    import threading

    env = {k: v for k, v in hvd["env"].items() if k != "SGLANG_HVD_RECORD_TRACES"}
    replicas = [factory(model, extra_args=hvd["extra_args"], env=env) for _ in range(2)]
    router = harness.start_router([r.url for r in replicas], "cache_aware", log_dir=str(work))
    try:
        rounds = [router.generate_many(PROMPTS) for _ in range(2)]
        status = _hvd(["status", *(r.url for r in replicas)])
        infos = [r.server_info() for r in replicas]
        flowing, failed, stop = [], [], threading.Event()

        def client(k):
            i = k
            while not stop.is_set():
                try:
                    flowing.append((i % len(PROMPTS), router.generate(**PROMPTS[i % len(PROMPTS)])["output_ids"]))
                except Exception as e:  # counted: the roll must lose none
                    failed.append(repr(e)[:500])
                i += 1

        threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        mid_roll = None
        try:
            for k in range(2):
                port = int(replicas[k].url.rsplit(":", 1)[1])
                replicas[k] = harness.roll_replica(router, replicas[k], lambda: factory(
                    model, extra_args=hvd["extra_args"], env={**env, "SGLANG_HVD_THRESHOLD": "0.5"}, port=port))
                if k == 0:
                    mid_roll = _hvd(["status", *(r.url for r in replicas)])
        finally:
            stop.set()
            for t in threads:
                t.join()
        rolled = _hvd(["status", *(r.url for r in replicas)])
        return dict(rounds=rounds, infos=infos, status=status, log=router.log_path, flowing=flowing, failed=failed,
                    mid_roll=mid_roll, rolled=rolled)
    finally:
        router.stop()
        for r in replicas:
            r.stop()


def _collect(server, work) -> dict:
    """hvd collect against the live HVD server, then a resumed rerun."""
    from sglang_hvd.harness.tiny_models import qwen_tokenizer_dir

    conv = work / "conv.jsonl"
    lines = [json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"Say something about {w}."},
                                                     {"role": "assistant", "content": "ok"},
                                                     {"role": "user", "content": "And again?"},
                                                     {"role": "assistant", "content": "ok"}]})
             for i, w in enumerate(["cats", "dogs", "rivers"])]
    conv.write_text("\n".join(lines) + "\n")
    base = ["collect", str(conv), "--server", server.url, "--tokenizer", qwen_tokenizer_dir(), "--max-new-tokens", "16",
            "--concurrency", "2"]
    first = _hvd(base + ["-o", str(work / "collected.jsonl")])
    # A resumed run: half of the records are already in the partial file.
    records = (work / "collected.jsonl").read_text().splitlines() if first.returncode == 0 else []
    (work / "again.jsonl.partial").write_text("\n".join(records[:3]) + "\n")
    second = _hvd(base + ["-o", str(work / "again.jsonl")])
    down = _hvd(["collect", str(conv), "--server", "http://127.0.0.1:9", "--tokenizer", qwen_tokenizer_dir(),
                 "-o", str(work / "down.jsonl"), "--retries", "0"])
    return dict(first=first, second=second, down=down, records=records)


def _frontend(url: str) -> str:
    import sglang as sgl

    @sgl.function
    def two_parts(s, topic):
        s += "Topic: " + topic + "\n"
        s += "First:" + sgl.gen("first", max_tokens=12, temperature=0)
        s += "\nSecond:" + sgl.gen("second", max_tokens=12, temperature=0)

    state = two_parts.run(topic="cache drafts", backend=sgl.RuntimeEndpoint(url))
    return state.text()


def _tokens(run, round_):
    return [r["output_ids"] for r in run["rounds"][round_]]


def _accept_length(run, round_):
    metas = [r["meta_info"] for r in run["rounds"][round_]]
    return sum(m["completion_tokens"] for m in metas) / sum(m["spec_verify_ct"] for m in metas)


def test_hvd_output_equals_the_non_speculative_server(runs):
    want = _tokens(runs["reference"], 0)
    for name in ("eagle3", "hvd", "hvd_broken"):
        for round_ in (0, 1):
            assert _tokens(runs[name], round_) == want, f"{name} round {round_} differs; log: {runs[name]['log']}"


def test_server_info_names_the_gate_for_fleet_checks(runs, qwen_gate):
    from sglang_hvd.gate import Gate

    stats = [s["hvd"] for s in runs["hvd"]["info"]["internal_states"] if "hvd" in s][0]
    assert stats["gate_digest"] == Gate(qwen_gate).digest
    assert (stats["gate_threshold"], stats["verify_shape"]) == (-1.0, "topk 1, steps 3, 4 nodes")
    # online calibration: every judged draft labelled by the output after it, one bucket (no hvd_source sent)
    (bucket,) = stats["calibration"].items()
    assert bucket[0] == "served" and bucket[1]["labels"] > 0 and 0 <= bucket[1]["realized"] <= 3
    assert any(line.startswith("sglang:hvd_calibration_labels{") and 'bucket="served"' in line
               and float(line.split()[-1]) > 0 for line in runs["hvd"]["metrics"].splitlines())


def test_data_parallel_ranks_each_run_hvd_and_record_their_own_file(runs, qwen_gate):
    from sglang_hvd.gate import Gate
    from sglang_hvd.trace import iter_traces

    want = _tokens(runs["reference"], 0)
    assert _tokens(runs["hvd_dp2"], 0) == want and _tokens(runs["hvd_dp2"], 1) == want
    states = runs["hvd_dp2"]["info"]["internal_states"]
    stats = [s["hvd"] for s in states if "hvd" in s]
    assert sorted(h["dp_rank"] for h in stats) == [0, 1]
    # /server_info also sums the ranks (one more entry after the ranks' states).
    (total,) = [s["hvd_total"] for s in states if "hvd_total" in s]
    assert total["ranks"] == 2 and total["steps"] == sum(h["steps"] for h in stats) > 0
    assert total["rows"] == sum(h["rows"] for h in stats)
    every = Gate(runs["gate_every"]).digest
    assert all(h["steps"] > 0 and h["step_errors"] == 0 and h["gate_digest"] == every for h in stats)
    # One file per rank, never one file appended by two processes.
    work = runs["work"]
    assert not (work / "dp.jsonl").exists()
    ids = [[r.req_id for r in iter_traces(str(work / f"dp.dp{k}.jsonl"))] for k in (0, 1)]
    served = {r["meta_info"]["id"] for round_ in runs["hvd_dp2"]["rounds"] for r in round_}
    assert ids[0] and ids[1] and not set(ids[0]) & set(ids[1]) and served <= set(ids[0]) | set(ids[1])
    # hvd status: both ranks, the totals, one gate.
    done = runs["hvd_dp2"]["status"]
    assert done.returncode == 0, done.stdout + done.stderr
    assert "one gate: digest" in done.stdout and "on 2 rank(s)" in done.stdout
    totals = json.loads((work / "status.json").read_text())["totals"]
    assert totals["steps"] == sum(h["steps"] for h in stats) and totals["ranks"] == 2


def test_a_gate_swapped_under_load_loses_nothing_and_a_refused_swap_keeps_the_gate(runs):
    from sglang_hvd.gate import Gate

    got = runs["hvd_dp2"]["swap"]
    want = _tokens(runs["reference"], 0)
    assert got["errors"] == [] and len(got["batches"]) >= 4
    assert all([r["output_ids"] for r in batch] == want for batch in got["batches"])  # every output unchanged
    code, body = got["swapped"]
    new = Gate(got["other"]).digest
    assert new != Gate(runs["gate_every"]).digest
    assert code == 200 and body["success"] and body["message"].count(f"serving gate {new}") == 2, body  # both ranks
    (depth, missing, empty) = got["refused"]
    assert depth[0] == 400 and not depth[1]["success"]
    assert "its cache drafter settings differ from the served gate's: max_depth 7 (served: 64)" in depth[1]["message"]
    assert missing[0] == 400 and "no such gate directory" in missing[1]["message"]
    assert empty[0] == 400 and 'send {"gate_path": "DIR"}' in empty[1]["message"]
    stats = [s["hvd"] for s in got["info"]["internal_states"] if "hvd" in s]
    assert [h["gate_digest"] for h in stats] == [new, new] and [h["gate_swaps"] for h in stats] == [1, 1]
    assert all(h["gate_threshold"] == 1e6 and h["step_errors"] == 0 for h in stats)  # the new gate's own rule
    done = got["status"]
    assert done.returncode == 0 and f"one gate: digest {new}" in done.stdout, done.stdout + done.stderr


def test_hvd_adapt_trains_on_recorded_traffic_and_pushes_a_gate_replay_scores_better(runs):
    from sglang_hvd.gate import Gate

    got = runs["hvd_dp2"]["adapt"]
    done = got["done"]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(done.stdout)  # both figures (docs/results.md "Adapting the gate")
    report = got["report"]
    assert report["pushed"] and report["better"] and report["held_back_requests"] >= 8
    serving, candidate = report["serving"], report["candidate"]
    assert candidate["cycles_per_1k"] < serving["cycles_per_1k"], report  # both figures reported
    assert serving["cache_pick_rate"] == 0.0 < candidate["cache_pick_rate"]  # the serving gate never picks the cache
    new = Gate(got["gate"]).digest
    assert candidate["digest"] == new and f"pushed {new}" in done.stdout
    stats = [s["hvd"] for s in got["info"]["internal_states"] if "hvd" in s]
    assert [h["gate_digest"] for h in stats] == [new, new] and [h["gate_swaps"] for h in stats] == [2, 2]


def test_tensor_parallel_ranks_verify_rank_0s_rows(runs):
    """TP 2: only rank 0 drafts and gates; its plans are broadcast every step and both
    ranks rewrite and verify the same rows (else their all-reduced forwards would mix
    different rows and the output would differ)."""
    want = _tokens(runs["reference"], 0)
    tp = runs["hvd_tp2"]
    assert _tokens(tp, 0) == want and _tokens(tp, 1) == want, tp["log"]
    stats = [s["hvd"] for s in tp["info"]["internal_states"] if "hvd" in s]
    assert len(stats) == 1 and stats[0]["step_errors"] == 0 and stats[0]["cache_rows"] > 0
    assert _accept_length(tp, 1) > 2.5  # round 2: rank 0's cache rows, accepted on both ranks


def test_tensor_parallel_decisions_equal_tp_1s(runs):
    """The first requests on both fresh servers, one at a time: TP 2 and TP 1 recorded the
    same decisions (the row's source, the cache draft, the accepted tokens) at the same
    positions. (An EAGLE3 row's own tokens come from the draft model, whose sharded
    forward may round differently: not HVD's decision, not compared.)"""
    from sglang_hvd.trace import iter_traces

    def first(path):
        return [(r.output_ids.tolist(), [(s.pos, s.src, s.draft if s.src == "cache" else None, s.accept_len)
                                         for s in r.steps])
                for r in list(iter_traces(str(path)))[: len(SEQUENTIAL)]]

    tp1, tp2 = first(runs["work"] / "served.jsonl"), first(runs["work"] / "tp2.jsonl")
    assert tp2 == tp1
    assert sum(src == "cache" for _, steps in tp1 for _, src, _, _ in steps) > 0


@pytest.mark.full
def test_two_hvd_servers_behind_the_router_serve_losslessly_on_one_gate(runs, router):
    want = _tokens(runs["reference"], 0)
    assert _tokens(router, 0) == want and _tokens(router, 1) == want, router["log"]
    stats = [[s["hvd"] for s in info["internal_states"] if "hvd" in s][0] for info in router["infos"]]
    assert sum(h["rows"] for h in stats) > 0 and all(h["step_errors"] == 0 for h in stats)
    assert router["status"].returncode == 0 and "on 2 rank(s)" in router["status"].stdout, router["status"].stdout
    # Cache-aware routing sends a repeated prompt to the replica that served it: round 2
    # finds round 1's responses in that replica's global cache, as on one server.
    assert _accept_length(router, 1) > 2.5


@pytest.mark.full
def test_a_gate_roll_behind_the_router_loses_no_request(runs, router):
    """Each replica in turn: out of the router, drained, restarted with the new setting,
    back in; three clients sent requests throughout."""
    want = _tokens(runs["reference"], 0)
    assert router["failed"] == [] and len(router["flowing"]) > 20
    assert all(out == want[i] for i, out in router["flowing"])
    # Half-way the fleet serves two settings, and hvd status says so; after the roll, one.
    assert router["mid_roll"].returncode == 1 and "not one gate: gate_threshold: 0.5" in router["mid_roll"].stdout
    assert router["rolled"].returncode == 0 and "one gate: digest" in router["rolled"].stdout


def test_cache_drafts_lift_accept_length_when_the_cache_knows_the_answer(runs):
    eagle = _accept_length(runs["eagle3"], 1)
    hvd = _accept_length(runs["hvd"], 1)
    assert eagle < 1.3  # the random EAGLE3 draft is (almost) never right
    assert hvd > 2.5  # round 2: cache drafts copy round 1's responses (max 4 tokens per verify)
    stats = [s["hvd"] for s in runs["hvd"]["info"]["internal_states"] if "hvd" in s]
    assert stats and stats[0]["gate_errors"] == 0 and stats[0]["steps"] > 0
    # Mixed batches: rows without a cache draft verify EAGLE3's (most of round 1), rows
    # with one verify it (most of round 2).
    assert 0.1 < stats[0]["cache_pick_rate"] < 0.9
    assert stats[0]["cache_mean_accept"] > 1.5 > stats[0]["eagle3_mean_accept"]


def test_per_request_control_off_rows_verify_nothing_beside_speculating_rows(runs):
    got = runs["hvd"]["control"]
    assert [r["output_ids"] for r in got["responses"]] == _tokens(runs["reference"], 0)  # lossless, every control
    meta = [r["meta_info"]["hvd"] for r in got["responses"]]
    assert [m["mode"] for m in meta] == CONTROLS
    for m, p in zip(meta, PROMPTS):
        # each row emits its accepted tokens and one more (the last may run past max_new_tokens)
        assert 0 < m["rows"] <= p["max_new_tokens"] - 1 <= m["rows"] + m["cache_accepted"] + m["eagle3_accepted"], m
    off = [m for m in meta if m["mode"] == "off"]
    assert all(m["plain_rows"] == m["rows"] and m["cache_rows"] == m["eagle3_verifies"] == 0 for m in off)
    assert all(m["rows"] == m["eagle3_verifies"] and m["cache_rows"] == 0 for m in meta if m["mode"] == "eagle3")
    assert all(m["eagle3_verifies"] == 0 for m in meta if m["mode"] == "cache")
    # the same batch: the other requests did speculate (every cache draft is verified at threshold -1)
    assert sum(m["cache_rows"] + m["eagle3_verifies"] for m in meta if m["mode"] != "off") > 0
    assert sum(m["cache_rows"] for m in meta if m["mode"] == "auto") > 0
    # the requests' own figures add up to the server's
    before, after = got["before"], got["after"]
    for key in ("rows", "plain_rows", "cache_rows", "cache_accepted", "eagle3_verifies", "eagle3_accepted"):
        assert sum(m[key] for m in meta) == after[key] - before[key], key
    assert after["tracked_requests"] == 0
    for message in got["refused"]:
        assert "HTTP 400" in message and "must be one of auto, off, cache, eagle3" in message, message


def test_prometheus_metrics_carry_hvd_gauges(runs):
    lines = [line for line in runs["hvd"]["metrics"].splitlines() if line.startswith("sglang:hvd_cache_pick_rate")]
    assert lines and float(lines[0].split()[-1]) > 0.0
    assert 'dp_rank="0"' in lines[0]  # one series per data-parallel rank


def test_a_gate_failing_at_run_time_leaves_the_server_serving(runs):
    stats = [s["hvd"] for s in runs["hvd_broken"]["info"]["internal_states"] if "hvd" in s][0]
    assert stats["gate_errors"] > 0 and stats["cache_pick_rate"] < 0.2
    log = open(runs["hvd_broken"]["log"]).read()
    assert log.count("HVD gate failed at run time") == 1  # logged once, then counted
    assert "HVD worker active" in log


def test_recorded_traces_replay_to_the_served_outputs(runs):
    from sglang_hvd.trace import iter_traces

    path = runs["work"] / "served.jsonl"
    records = list(iter_traces(str(path)))  # the reader validates every step against the output
    served = {tuple(p["input_ids"]): out
              for p, out in zip(PROMPTS * 2, _tokens(runs["hvd"], 0) + _tokens(runs["hvd"], 1))}
    collected = len(runs["hvd"]["collect"]["records"])
    assert len(records) >= 2 * len(PROMPTS) + collected  # hvd collect's requests were served (and recorded) too
    records = [r for r in records if tuple(r.prompt_ids.tolist()) in served]
    # two rounds, the two sent before reading /metrics, and the per-request control batch
    assert len(records) == 3 * len(PROMPTS) + 2
    cached_steps = 0
    for r in records:
        assert r.output_ids.tolist() == served[tuple(r.prompt_ids.tolist())]
        # Prefill emits the first token; every verify then emits accept_len + 1 tokens.
        assert not r.steps or r.steps[0].pos == 1
        assert all(b.pos == a.pos + a.accept_len + 1 for a, b in zip(r.steps, r.steps[1:]))
        cached_steps += sum(s.src == "cache" for s in r.steps)
    assert cached_steps > 0
    # an `off` request verifies no draft: its record has no verify step
    assert CONTROLS.count("off") <= sum(not r.steps for r in records) < len(records)
    replayed = subprocess.run([harness.SGLANG_PYTHON, "-m", "sglang_hvd.cli.main", "replay", str(path), "--json",
                               str(runs["work"] / "r.json")], capture_output=True, text=True, cwd=REPO)
    assert replayed.returncode == 0, replayed.stderr[-2000:]


def test_collect_against_the_live_server(runs):
    c = runs["hvd"]["collect"]
    assert c["first"].returncode == 0, c["first"].stderr[-2000:]
    assert len(c["records"]) == 6  # 3 conversations x 2 assistant turns
    assert c["second"].returncode == 0 and "already collected (resumed)" in c["second"].stdout
    again = (runs["work"] / "again.jsonl").read_text().splitlines()
    assert (sorted(json.loads(line)["req_id"] for line in again)
            == sorted(json.loads(line)["req_id"] for line in c["records"]))
    assert c["down"].returncode == 2 and "rerun the same command to resume" in c["down"].stderr


def test_frontend_program_gives_the_same_text_with_hvd(runs):
    assert runs["hvd"]["frontend"] == runs["reference"]["frontend"]
    assert runs["hvd"]["frontend"].count("First:") == 1
