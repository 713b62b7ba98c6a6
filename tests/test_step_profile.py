"""Step-time profile (sglang_hvd/step_profile.py): JSON record, refusals, the shipped roofline
estimate checked by hand, step times by tier and host work, and the fits."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from sglang_hvd.errors import HvdInputError
from sglang_hvd.step_profile import (
    EXTEND_NONE,
    EXTEND_WHEN_DRAFTED,
    HOST_DRAFTS,
    HOST_HVD,
    HOST_NONE,
    DraftCost,
    DraftSample,
    ExtendSample,
    ForwardCost,
    HostCost,
    StepProfile,
    VerifySample,
    _nnls,
    _nnls_many,
    fit_draft,
    fit_extend,
    fit_host,
    fit_verify,
    load_profile,
    relative_error,
)
from sglang_hvd.tiers import Tier

SHIPPED = "qwen3-8b-h200, qwen3-8b-h100"


def profile(verify=(0.4, 0.025, 64.0, 4e-5), eagle3=(0.5, 0.3, 0.002, 1e-6, 0.0), host=(0.15, 0.01, 0.02),
            **kw) -> StepProfile:
    """The one place this file builds a profile (a signature change is a one-line fix here)."""
    return StepProfile(name="t", kind="measured", target_model="target", draft_model="draft", hardware="cpu",
                       verify=ForwardCost(*verify), eagle3=DraftCost(*eagle3), hvd_cpu=HostCost(*host), **kw)


def test_a_profile_round_trips_through_json_and_a_file(tmp_path):
    p = profile(note="measured on the CPU harness", fit_error={"verify": 0.03}, untimed_ms=1.5)
    d = p.to_json()
    assert d["format_version"] == 4 and d["kind"] == "measured" and d["untimed_ms"] == 1.5
    # the extend's own constants are written, here the draft steps' (a DraftCost given none)
    assert d["eagle3"] == {"fixed_ms": 0.5, "per_step_ms": 0.3, "per_token_ms": 0.002, "per_context_token_ms": 1e-6,
                           "extend_ms": 0.0, "extend_per_token_ms": 0.002, "extend_per_context_token_ms": 1e-6,
                           "per_row_ms": 0.0}
    assert d["verify"] == {"fixed_ms": 0.4, "per_token_ms": 0.025, "knee_tokens": 64.0, "per_context_token_ms": 4e-5,
                           "per_row_ms": 0.0}
    assert StepProfile.from_json(json.loads(json.dumps(d))) == p
    path = str(tmp_path / "p.json")
    p.write(path)
    assert load_profile(path) == p


def _without(d: dict, *keys: str) -> dict:
    """``d`` with the (dotted) key removed."""
    d = json.loads(json.dumps(d))
    *parents, last = keys
    inner = d
    for k in parents:
        inner = inner[k]
    del inner[last]
    return d


def _with(d: dict, key: str, sub: str | None, value) -> dict:
    d = json.loads(json.dumps(d))
    if sub is None:
        d[key] = value
    else:
        d[key][sub] = value
    return d


GOOD = profile().to_json()


@pytest.mark.parametrize("doc, message", [
    (_with(GOOD, "format_version", None, 5), "p.json: profile format_version 5, this sglang-hvd reads 1, 2, 3 and 4"),
    (_without(GOOD, "format_version"), "p.json: profile format_version None, this sglang-hvd reads 1, 2, 3 and 4"),
    (_with(GOOD, "eagle3", "extend_per_context_token_ms", -1e-4),
     "eagle3.extend_per_context_token_ms must be a finite number >= 0, got -0.0001"),
    (_without(GOOD, "untimed_ms"), "p.json: the profile lacks 'untimed_ms'"),
    (_with(GOOD, "untimed_ms", None, -1.0), "profile.untimed_ms must be a finite number >= 0, got -1.0"),
    (_with(GOOD, "untimed_ms", None, "2"), "profile.untimed_ms must be a finite number >= 0, got '2'"),
    (_with(GOOD, "verify", "per_row_ms", -0.5), "verify.per_row_ms must be a finite number >= 0, got -0.5"),
    (_without(GOOD, "hardware"), "p.json: the profile lacks 'hardware'"),
    (_without(GOOD, "eagle3"), "p.json: the profile lacks 'eagle3'"),
    (_without(GOOD, "verify", "knee_tokens"), "missing 1 required positional argument: 'knee_tokens'"),
    (_with(GOOD, "eagle3", "per_step_ms", -1.0), "eagle3.per_step_ms must be a finite number >= 0, got -1.0"),
    (_with(GOOD, "verify", "fixed_ms", float("nan")), "verify.fixed_ms must be a finite number >= 0, got nan"),
    (_with(GOOD, "hvd_cpu", "fixed_ms", "0.15"), "hvd_cpu.fixed_ms must be a finite number >= 0, got '0.15'"),
    (_with(GOOD, "kind", None, "guess"), "profile kind must be one of estimate, measured, got 'guess'"),
    ([GOOD], "p.json: expected a JSON object (a step-time profile;"),
])
def test_a_bad_profile_is_refused_in_one_line_naming_the_fix(doc, message):
    with pytest.raises(HvdInputError) as e:
        StepProfile.from_json(doc, where="p.json")
    text = str(e.value)
    assert message in text and "\n" not in text
    assert f"pass a shipped estimate instead ({SHIPPED})" in text


def test_a_format_1_profile_is_read_with_no_per_row_verify_cost_and_format_1_and_2_with_nothing_untimed():
    old = _with(_without(GOOD, "verify", "per_row_ms"), "format_version", None, 1)  # what sglang-hvd wrote before
    p = StepProfile.from_json(_without(old, "untimed_ms"))
    assert p.verify.per_row_ms == 0.0 and p.untimed_ms == 0.0 and p == profile()
    two = _with(_without(_with(GOOD, "verify", "per_row_ms", 0.3), "untimed_ms"), "format_version", None, 2)
    assert StepProfile.from_json(two) == profile(verify=(0.4, 0.025, 64.0, 4e-5, 0.3))
    # a stray untimed_ms in an old format is what it meant then: nothing
    assert StepProfile.from_json(_with(two, "untimed_ms", None, 9.0)).untimed_ms == 0.0
    assert p.verify.ms(8, 4, 1000) == pytest.approx(0.4 + 4e-5 * 1000 + 0.025 * 64)
    assert profile(verify=(0.4, 0.025, 64.0, 4e-5, 0.3)).verify.ms(8, 4, 1000) == pytest.approx(
        0.4 + 8 * 0.3 + 4e-5 * 1000 + 0.025 * 64)


def test_a_format_1_to_3_profile_prices_the_extend_by_the_draft_steps_constants_and_format_4_by_its_own():
    three = _with(_without(_without(GOOD, "eagle3", "extend_per_token_ms"), "eagle3", "extend_per_context_token_ms"),
                  "format_version", None, 3)
    three = _with(three, "eagle3", "extend_ms", 0.4)
    p = StepProfile.from_json(three)
    # 0.4 + 0.002 * 8 + 1e-6 * 1000: the draft steps' per-token and context constants, as format 3 meant
    assert p.eagle3.extend(8, 1000) == pytest.approx(0.417)
    assert (p.eagle3.extend_per_token_ms, p.eagle3.extend_per_context_token_ms, p.eagle3.per_row_ms) == (0.002, 1e-6, 0)
    four = _with(_with(_with(three, "format_version", None, 4), "eagle3", "extend_per_token_ms", 0.05),
                 "eagle3", "extend_per_context_token_ms", 2e-5)
    q = StepProfile.from_json(four)
    assert q.eagle3.extend(8, 1000) == pytest.approx(0.4 + 0.05 * 8 + 2e-5 * 1000)
    assert q.eagle3.ms(8, 3, 1, 1000) == p.eagle3.ms(8, 3, 1, 1000)  # the draft forwards are priced as before
    # format 4's per-row tree build: 0.5 + 0.05 * 8 + 2 * (0.3 + 0.002 * 8 + 1e-6 * 1000)
    q = StepProfile.from_json(_with(four, "eagle3", "per_row_ms", 0.05))
    assert q.eagle3.ms(8, 3, 1, 1000) == pytest.approx(1.534)
    assert StepProfile.from_json(q.to_json()) == q


def test_load_profile_refuses_a_missing_unreadable_or_malformed_file(tmp_path):
    cases = {
        str(tmp_path / "nope.json"): f"nope.json: no such profile file, and not a shipped estimate ({SHIPPED})",
        str(tmp_path): "cannot read the profile ([Errno 21]",  # a folder
    }
    (tmp_path / "bad.json").write_text("{not json")
    cases[str(tmp_path / "bad.json")] = "bad.json: cannot read the profile (Expecting property name"
    (tmp_path / "latin1.json").write_bytes(b"\xff\xfe{}")
    cases[str(tmp_path / "latin1.json")] = "latin1.json: cannot read the profile ('utf-8' codec can't decode"
    (tmp_path / "nan.json").write_text(json.dumps(_with(GOOD, "verify", "per_token_ms", float("nan"))))  # NaN literal
    cases[str(tmp_path / "nan.json")] = "nan.json: bad profile (verify.per_token_ms must be a finite number >= 0"
    for path, message in cases.items():
        with pytest.raises(HvdInputError) as e:
            load_profile(path)
        assert message in str(e.value) and "\n" not in str(e.value), path


def test_the_shipped_h200_estimate_is_its_roofline_by_hand():
    p = load_profile("qwen3-8b-h200")
    assert p.kind == "estimate" and p.describe() == (
        "qwen3-8b-h200 (estimate: Qwen/Qwen3-8B + EAGLE3 head for Qwen3-8B on NVIDIA H200)")
    # 16.4 GB of weights at 4.0 TB/s = 4.1 ms, plus 0.4 ms of launch: one plain decode step
    assert p.verify.ms(1, 1, 0) == pytest.approx(4.5)
    # a token is 15.1 GFLOP / 600 TFLOP/s = 0.025167 ms: the knee is 4.1 / 0.025167 = 162.9 tokens
    assert p.verify.knee_tokens == pytest.approx(4.1 / (15.1 / 600))
    assert p.verify.ms(8, 16, 0) == pytest.approx(4.5)  # 128 query tokens: still memory-bound
    assert p.verify.ms(16, 16, 0) == pytest.approx(0.4 + 256 * 15.1 / 600)  # 256 tokens: 6.843 ms
    # 147,456 bytes of KV per context token at 4 TB/s: 3.6864e-5 ms each, 2,048 tokens = 0.0755 ms
    assert p.verify.ms(1, 1, 2048) == pytest.approx(4.5 + 2048 * 147_456 / 4e12 * 1e3)
    # EAGLE3 at topk 4, 3 steps, B = 1: a 0.1 ms tree build + 3 * (0.3 + 0.7 GB / 4 TB/s + 4 * 0.7 GFLOP / 600 TFLOP/s)
    # 3 steps: 2 draft forwards (the first step's tokens come from the extend)
    assert p.eagle3.ms(1, 3, 4, 0) == pytest.approx(0.1 + 2 * (0.3 + 0.175 + 4 * 0.7 / 600))  # 1.069 ms
    # its extend, one draft forward over B = 1 token: 0.3 + 0.175 + 0.7 / 600
    assert p.eagle3.extend(1, 0) == pytest.approx(0.3 + 0.175 + 0.7 / 600)
    # the H100's knee: 16.4 GB / 2.8 TB/s over 15.1 GFLOP / 550 TFLOP/s
    assert load_profile("qwen3-8b-h100").verify.knee_tokens == pytest.approx((16.4 / 2.8) / (15.1 / 550))


def test_step_ms_adds_the_draft_forwards_and_the_host_work_a_step_pays():
    p = load_profile("qwen3-8b-h200")
    off, tree = Tier(), Tier.parse("4-3-16")
    eagle3 = 0.1 + 2 * (0.3 + 0.175 + 4 * 0.7 / 600)  # 3 steps: 2 draft forwards
    extend = 0.3 + 0.175 + 0.7 / 600
    # off drafts nothing, but a server with EAGLE3's model still extends it (SGLang's rule)
    assert p.step_ms(off, 1, 0, eagle3=True) == pytest.approx(4.5 + extend + 0.15 + 0.03)
    assert p.step_ms(off, 1, 0, eagle3=True, extend=EXTEND_WHEN_DRAFTED) == pytest.approx(4.5 + 0.18)
    assert p.step_ms(tree, 1, 0, eagle3=True) == pytest.approx(4.5 + eagle3 + extend + 0.18)  # hvd@4-3-16
    assert p.step_ms(tree, 1, 0, eagle3=True, extend=EXTEND_WHEN_DRAFTED) == pytest.approx(4.5 + eagle3 + extend
                                                                                           + 0.18)
    assert p.step_ms(tree, 1, 0, eagle3=False, host=HOST_DRAFTS, extend=EXTEND_NONE) == pytest.approx(
        4.5 + 0.16)  # cache_only: no draft model
    assert p.step_ms(tree, 1, 0, eagle3=True, host=HOST_NONE) == pytest.approx(4.5 + eagle3 + extend)  # eagle3@T
    assert p.hvd_cpu.ms(64, HOST_HVD) == pytest.approx(0.15 + 0.03 * 64)
    assert p.hvd_cpu.ms(64, HOST_DRAFTS) == pytest.approx(0.15 + 0.01 * 64)
    # the estimates model nothing untimed; a measured profile's untimed part is paid by every step of HVD's server
    # (host drafts), at any tier, not by SGLang's own servers (greedy, EAGLE3: they can overlap their scheduling)
    assert p.untimed_ms == 0.0
    q = dataclasses.replace(p, untimed_ms=2.0)
    for tier, kw in ((off, {}), (tree, {}), (tree, dict(eagle3=False, host=HOST_DRAFTS, extend=EXTEND_NONE))):
        args = dict(eagle3=True) | kw
        assert q.step_ms(tier, 1, 0, **args) == pytest.approx(p.step_ms(tier, 1, 0, **args) + 2.0)
    assert q.step_ms(tree, 1, 0, eagle3=True, host=HOST_NONE) == pytest.approx(4.5 + eagle3 + extend)  # eagle3@T
    assert q.step_ms(off, 1, 0, eagle3=False, host=HOST_NONE, extend=EXTEND_NONE) == pytest.approx(4.5)  # greedy


GRID = [(b, n, c) for b in (1, 2, 4, 8, 16, 32, 64, 128) for n in (1, 4, 16) for c in (0, 8192, 65536)]


def test_fit_verify_recovers_the_constants_it_was_sampled_from():
    truth = ForwardCost(0.4, 0.025, 64.0, 3.7e-5)  # the knee at a sampled B * N
    fitted = fit_verify([VerifySample(b, n, c, truth.ms(b, n, c)) for b, n, c in GRID])
    assert [fitted.fixed_ms, fitted.per_token_ms, fitted.knee_tokens, fitted.per_context_token_ms,
            fitted.per_row_ms] == pytest.approx([0.4, 0.025, 64.0, 3.7e-5, 0.0], rel=1e-6, abs=1e-9)
    # a cost per row whatever its width (the CPU harness: 4 rows of 1 token dearer than 1 row of 4)
    truth = ForwardCost(10.0, 0.6, 1.0, 0.001, 0.4)
    fitted = fit_verify([VerifySample(b, n, c, truth.ms(b, n, c)) for b, n, c in GRID])
    assert [fitted.fixed_ms, fitted.per_token_ms, fitted.per_context_token_ms, fitted.per_row_ms] == pytest.approx(
        [10.0, 0.6, 0.001, 0.4], rel=1e-6)
    assert fitted.ms(4, 1, 0) > fitted.ms(1, 4, 0)


def test_fit_verify_finds_a_knee_between_sampled_points_and_predicts_held_back_ones_within_10_percent():
    truth = load_profile("qwen3-8b-h200").verify  # knee 162.9: between the sampled B * N 128 and 256
    exact = fit_verify([VerifySample(b, n, c, truth.ms(b, n, c)) for b, n, c in GRID])
    assert exact.knee_tokens == pytest.approx(162.9, rel=0.02)
    noise = np.random.default_rng(0).uniform(-0.05, 0.05, len(GRID))  # measured times: +-5%
    samples = [VerifySample(b, n, c, truth.ms(b, n, c) * (1 + e)) for (b, n, c), e in zip(GRID, noise)]
    fitted = fit_verify(samples[::2])
    held = samples[1::2]
    predicted = np.array([fitted.ms(s.batch, s.tokens_per_row, s.context_tokens) for s in held])
    assert np.max(np.abs(predicted / np.array([s.ms for s in held]) - 1)) < 0.10


def test_fit_draft_and_fit_host_recover_their_constants():
    truth = DraftCost(0.5, 0.3, 0.002, 1e-6, extend_ms=0.4, per_row_ms=0.05)
    grid = [(b, s, k, c) for b in (1, 8, 64) for s in (1, 3, 7) for k in (1, 4) for c in (0, 65536)]
    fitted = fit_draft([DraftSample(b, s, k, c, truth.ms(b, s, k, c)) for b, s, k, c in grid], extend_ms=0.4)
    assert [fitted.fixed_ms, fitted.per_step_ms, fitted.per_token_ms, fitted.per_context_token_ms,
            fitted.per_row_ms] == pytest.approx([0.5, 0.3, 0.002, 1e-6, 0.05], rel=1e-6)
    assert truth.ms(16, 1, 4, 1000) == pytest.approx(0.5 + 0.05 * 16)  # one step: no draft forward, the tree's build
    assert fitted.extend_ms == 0.4
    batches = [1, 8, 64]
    host = fit_host(batches, [0.15 + 0.01 * b for b in batches], [0.15 + 0.03 * b for b in batches])
    assert [host.fixed_ms, host.draft_per_row_ms, host.decide_per_row_ms] == pytest.approx([0.15, 0.01, 0.02])
    # drafts measured dearer per row than the whole (noise): the decision's part is 0, never negative
    host = fit_host([1, 2], [0.1, 0.3], [0.2, 0.3])
    assert [host.fixed_ms, host.draft_per_row_ms, host.decide_per_row_ms] == pytest.approx([0.1, 0.1, 0.0])


def test_fit_extend_fits_the_constants_its_samples_span_and_keeps_the_others():
    draft = DraftCost(0.5, 0.3, 0.002, 1e-6, extend_ms=0.0)  # the extend priced by the draft steps' constants
    truth = dataclasses.replace(draft, extend_ms=1.5, extend_per_token_ms=0.04, extend_per_context_token_ms=0.002)
    grid = [(b, c) for b in (1, 4, 16, 32) for c in (100 * b, 400 * b)]
    fitted = fit_extend([ExtendSample(b, c, truth.extend(b, c)) for b, c in grid], draft)
    assert [fitted.extend_ms, fitted.extend_per_token_ms, fitted.extend_per_context_token_ms] == pytest.approx(
        [1.5, 0.04, 0.002], rel=1e-6)
    assert dataclasses.replace(fitted, extend_ms=0.0, extend_per_token_ms=0.002,
                               extend_per_context_token_ms=1e-6) == draft  # the draft forwards untouched
    # one batch size: the per-token constant is the draft's; contexts within a factor of 2: so is the context's
    one_batch = fit_extend([ExtendSample(8, c, truth.extend(8, c)) for c in (1000, 3000)], draft)
    assert one_batch.extend_per_token_ms == 0.002
    assert one_batch.extend_per_context_token_ms == pytest.approx(0.002, rel=1e-6)
    assert one_batch.extend_ms == pytest.approx(1.5 + (0.04 - 0.002) * 8, rel=1e-6)
    narrow = fit_extend([ExtendSample(b, c, truth.extend(b, c)) for b, c in ((4, 1000), (16, 1500))], draft)
    assert narrow.extend_per_context_token_ms == 1e-6
    # neither spanned: the fixed part is the median of what the kept constants leave (a paused step does not pull it)
    ms = [2.0, 2.1, 9.0]
    alone = fit_extend([ExtendSample(8, 1000, m) for m in ms], draft)
    assert alone.extend_ms == pytest.approx(2.1 - 0.002 * 8 - 1e-6 * 1000)
    with pytest.raises(ValueError, match="fitting the draft extend needs >= 1 sample"):
        fit_extend([], draft)


def test_nnls_keeps_every_coefficient_at_or_above_zero():
    # unconstrained: y = 4 - x (slope -1); with slope >= 0 the best is the mean, 2, and the residuals 1, 0, -1
    c, sse = _nnls(np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]]), np.array([3.0, 2.0, 1.0]))
    assert c.tolist() == pytest.approx([2.0, 0.0]) and sse == pytest.approx(2.0)
    c, sse = _nnls(np.eye(2), np.array([2.0, -1.0]))  # the negative coefficient is dropped, not clipped into the fit
    assert c.tolist() == pytest.approx([2.0, 0.0]) and sse == pytest.approx(1.0)



def test_nnls_of_many_designs_fits_each_as_alone_and_keeps_fewer_columns_on_collinear_ones():
    x = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    designs = np.stack([x, x * [1.0, -1.0], np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])])
    c, sse = _nnls_many(designs, np.array([3.0, 2.0, 1.0]))
    # y = 4 - x: the first design's slope must stay >= 0 (the mean, 2); the second's column is -x (y = 4 + 1 * -x,
    # exact); the third's two columns are one (both fit y's mean, 2): the one-column fit is kept, not split
    assert c.ravel().tolist() == pytest.approx([2.0, 0.0, 4.0, 1.0, 2.0, 0.0])
    assert sse.tolist() == pytest.approx([2.0, 0.0, 2.0], abs=1e-9)
    for design, (want_c, want_sse) in zip(designs, zip(c, sse)):
        alone, alone_sse = _nnls(design, np.array([3.0, 2.0, 1.0]))
        assert alone.tolist() == pytest.approx(want_c.tolist()) and alone_sse == pytest.approx(want_sse, abs=1e-9)

def test_fits_refuse_too_few_samples_and_relative_error_is_the_mean():
    with pytest.raises(ValueError, match="fitting a verify cost needs >= 3 samples, got 2"):
        fit_verify([VerifySample(1, 1, 0, 1.0), VerifySample(2, 1, 0, 1.0)])
    with pytest.raises(ValueError, match="fitting a draft cost needs >= 2 samples, got 1"):
        fit_draft([DraftSample(1, 1, 1, 0, 1.0)], extend_ms=0.0)
    with pytest.raises(ValueError, match="fitting HVD's host cost needs >= 2 samples, got 1"):
        fit_host([1], [0.1], [0.2])
    assert relative_error([1.1, 0.9], [1.0, 1.0]) == pytest.approx(0.1)
    assert relative_error([], []) == 0.0
