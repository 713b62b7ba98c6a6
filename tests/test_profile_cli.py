"""``hvd profile`` (sglang_hvd/cli/profile.py) and the timings it reads (serving/step_timing.py),
against a stand-in server that times its steps from a known profile: the real server's
timings are tested in tests/sglang_cpu."""

from __future__ import annotations

import json
import math
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sglang_hvd.cli.main import main as hvd
from sglang_hvd.cli.profile import fit_checked
from sglang_hvd.errors import HvdInputError
from sglang_hvd.serving.step_timing import StepTiming, cell_medians, errors, read_timings, untimed
from sglang_hvd.step_profile import DraftCost, ForwardCost, HostCost, StepProfile, load_profile

TRUE = StepProfile(name="true", kind="measured", target_model="tiny", draft_model="tiny-draft", hardware="cpu",
                   verify=ForwardCost(2.0, 0.05, 16.0, 0.0005), eagle3=DraftCost(0.2, 0.8, 0.01, 0.0002, 0.6),
                   hvd_cpu=HostCost(0.1, 0.02, 0.03))
ZERO = StepProfile(name="zero", kind="measured", target_model="t", draft_model="d", hardware="cpu",
                   verify=ForwardCost(0, 0, 0, 0), eagle3=DraftCost(0, 0, 0, 0, 0), hvd_cpu=HostCost(0, 0, 0))
TIERS = ((1, 0), (2, 1), (3, 2), (4, 3))  # (tokens per row, EAGLE3 draft steps) of a 1-3-4 server's tier cycle


UNTIMED_MS = 1.5  # the stand-in's steps: their wall time is their parts' and this


def timed(p: StepProfile, batch: int, n: int, steps: int, ctx: int, rng: random.Random, noise: float) -> StepTiming:
    jitter = lambda ms: ms * (1 + rng.uniform(-noise, noise))  # noqa: E731
    parts = (jitter(p.verify.ms(batch, n, ctx)), jitter(p.eagle3.ms(batch, steps, 1, ctx)) if steps else math.nan,
             jitter(p.eagle3.extend(batch, ctx)), jitter(p.hvd_cpu.ms(batch)))
    wall = sum(v for v in parts if not math.isnan(v)) + UNTIMED_MS
    return StepTiming(batch, n, ctx, parts[0], steps, 1, *parts[1:], wall_ms=wall)


def test_a_cell_is_the_median_of_its_steps():
    steps = [StepTiming(4, 2, 1000, ms, 1, 1, 1.0, math.nan, 0.5) for ms in (1.0, 9.0, 2.0)]  # one paused step
    steps.append(StepTiming(4, 2, 5000, 3.0, 1, 1, 1.0, math.nan, 0.5))  # context 4x: another cell
    cells = cell_medians(steps)
    assert [(c.context_tokens, c.verify_ms) for c in cells] == [(1000, 2.0), (5000, 3.0)]
    assert math.isnan(cells[0].extend_ms) and cells[0].host_ms == 0.5
    # min_steps 2: the one-step cell (a batch size seen while requests arrive) is left out
    assert [c.context_tokens for c in cell_medians(steps, min_steps=2)] == [1000]


def test_untimed_is_the_wall_time_the_parts_miss():
    steps = [StepTiming(1, 4, 10, 10.0, 3, 1, 4.0, 2.0, 1.0, wall_ms=20.0),  # 3 ms untimed, 15% of the wall
             StepTiming(1, 1, 10, 10.0, 0, 1, 9.0, 2.0, 1.0, wall_ms=14.0),  # no draft steps: its draft_ms not a part
             StepTiming(1, 1, 10, 10.0, 0, 1, math.nan, 2.0, 1.0, wall_ms=12.5),  # the clock's jitter: never < 0
             StepTiming(1, 1, 10, 10.0)]  # after a prefill: no wall time
    ms, share, n = untimed(steps)
    assert (ms, n) == (1.0, 3) and share == pytest.approx(1.0 / 14.0)
    assert math.isnan(untimed(steps[3:])[0]) and untimed(steps[3:])[2] == 0
    # the wall time goes through the timings file; an older file's lines (no wall_ms) read as nan
    assert StepTiming.from_json(steps[0].to_json()) == steps[0]
    assert math.isnan(StepTiming.from_json({k: v for k, v in steps[0].to_json().items() if k != "wall_ms"}).wall_ms)


def test_timings_file_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    a, b = StepTiming(1, 4, 10, 1.5), StepTiming(2, 4, 20, 2.5, 3, 1, 0.7)
    path.write_text(json.dumps(a.to_json()) + "\n" + json.dumps(b.to_json()) + "\n" + '{"batch": 3, "tok')
    assert read_timings(str(path)) == [a, b]  # a torn last line (still being written) is left out
    assert read_timings(str(path), skip=1) == [b]
    path.write_text(json.dumps(a.to_json()) + "\nnot json\n")
    with pytest.raises(HvdInputError, match=r"t.jsonl:2: not a step timing"):
        read_timings(str(path))
    with pytest.raises(HvdInputError, match="no timings file .* --hvd-timings"):
        read_timings(str(tmp_path / "none.jsonl"))


def test_the_fit_predicts_held_back_cells_within_ten_percent():
    rng = random.Random(0)
    steps = [timed(TRUE, b, n, s, b * ctx, rng, 0.05) for b in (1, 2, 4, 8, 16) for n, s in TIERS
             for ctx in (100, 900) for _ in range(5)]
    profile, held_back = fit_checked(cell_medians(steps), ZERO, "fit")
    assert set(held_back) == {"verify", "draft", "extend", "host", "step"}
    assert max(held_back.values()) < 0.10
    assert profile.eagle3.ms(4, 2, 1, 3000) == pytest.approx(TRUE.eagle3.ms(4, 2, 1, 3000), rel=0.1)


def test_a_grid_too_small_to_fit_a_term_is_refused():
    rng = random.Random(0)
    no_drafts = [timed(TRUE, b, 1, 0, 100, rng, 0.0) for b in (1, 2, 4, 8)]
    with pytest.raises(HvdInputError, match="do not span enough shapes to fit draft "):
        fit_checked(cell_medians(no_drafts), ZERO, "fit")


class StandIn(BaseHTTPRequestHandler):
    """/server_info of a tier-cycling HVD server; /generate times each of the request's
    decode steps from TRUE (5% noise) at its load level's batch: ``levels[i]`` for the i-th
    request to arrive (hvd profile sends each level's requests together and the next level
    after they return; a count of requests in flight was 1 where a loaded machine ran them
    one after another, and the grid then lacked batch sizes)."""

    timings = ""
    levels: list[int] = []
    requests = 0
    lock = threading.Lock()
    rng = random.Random(1)

    def log_message(self, *a):
        pass

    def _reply(self, body: dict):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._reply({"model_path": "/models/tiny", "speculative_draft_model_path": "/models/tiny-draft",
                     "internal_states": [{"hvd": {"tier_rule": "cycle", "tiers": "off,1-1-2,1-2-3,1-3-4"}}]})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        new = req["sampling_params"]["max_new_tokens"]
        assert req["sampling_params"]["ignore_eos"] is True
        with StandIn.lock:
            b = StandIn.levels[StandIn.requests]
            StandIn.requests += 1
        lines = []
        for k in range(new):
            n, s = TIERS[k % len(TIERS)]
            lines.append(json.dumps(timed(TRUE, b, n, s, b * (len(req["input_ids"]) + k), StandIn.rng,
                                          0.05).to_json()))
        with StandIn.lock, open(StandIn.timings, "a") as f:
            f.write("".join(line + "\n" for line in lines))
        self._reply({"output_ids": [7] * new})


def test_hvd_profile_writes_a_measured_profile(tmp_path, capsys):
    StandIn.timings = str(tmp_path / "steps.jsonl")
    StandIn.levels = [c for _ in range(2) for _ in (32, 256) for c in (1, 2, 4, 8) for _ in range(c)]
    with open(StandIn.timings, "w") as f:  # steps of an earlier run: not this profile's
        f.write(json.dumps(StepTiming(1, 1, 1, 999.0).to_json()) + "\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    out = tmp_path / "p.json"
    try:
        code = hvd(["profile", "--url", f"http://127.0.0.1:{server.server_address[1]}", "--timings",
                    StandIn.timings, "-o", str(out), "--concurrency", "1,2,4,8", "--prompt-tokens", "32,256",
                    "--new-tokens", "24", "--hardware", "stand-in"])
    finally:
        server.shutdown()
    assert code == 0
    assert StandIn.requests == 2 * 2 * (1 + 2 + 4 + 8)  # 2 rounds (the default) x 2 prompt lengths x the levels
    p = load_profile(str(out))
    assert (p.name, p.kind, p.target_model, p.draft_model, p.hardware) == (
        "p", "measured", "/models/tiny", "/models/tiny-draft", "stand-in")
    assert max(p.fit_error.values()) < 0.10  # held-back cells
    # the constants trade off (a fixed cost against a knee); the cells' times do not
    cells = cell_medians(read_timings(StandIn.timings, skip=1))
    assert max(errors(p, cells).values()) < 0.05
    text = capsys.readouterr().out
    assert "held-back error" in text
    # every step's wall time was its parts' and 1.5 ms: the median is that to the float
    assert "untimed: 1.50 ms a step" in text
    assert p.untimed_ms == 1.5  # the profile carries it: a speculating server's steps pay it at every tier


def test_hvd_profile_refuses_a_server_without_the_cycle(tmp_path, capsys):
    class Static(StandIn):
        def do_GET(self):
            self._reply({"internal_states": [{"hvd": {"tier_rule": "static"}}]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Static)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code = hvd(["profile", "--url", f"http://127.0.0.1:{server.server_address[1]}", "--timings",
                    str(tmp_path / "t.jsonl"), "-o", str(tmp_path / "p.json")])
    finally:
        server.shutdown()
    assert code == 2
    assert "not running the tier-cycle diagnostic (tier rule static): start it with --hvd-gate G --hvd-tier-cycle" \
        in capsys.readouterr().err
