"""Measured steps against the served profile, and its online refit (serving/step_timing.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from sglang_hvd.serving.step_timing import ProfileRefiner, StepTiming, errors, fit_profile, measured, predicted
from sglang_hvd.step_profile import DraftCost, ForwardCost, HostCost, StepProfile


def profile(verify_fixed=1.0, name="p", extend=(None, None), draft_per_row_ms=0.0):
    """``extend``: the extend's per-token and context constants (None: the draft steps')."""
    return StepProfile(name=name, kind="estimate", target_model="t", draft_model="d", hardware="cpu",
                       verify=ForwardCost(verify_fixed, 0.01, 8, 0.001),
                       eagle3=DraftCost(0.1, 0.5, 0.002, 0.0001, 0.4, *extend, per_row_ms=draft_per_row_ms),
                       hvd_cpu=HostCost(0.05, 0.01, 0.02))


def served(p: StepProfile, batch: int, n: int, ctx: int, steps: int) -> StepTiming:
    """A step timed exactly as ``p`` predicts it."""
    return StepTiming(batch, n, ctx, p.verify.ms(batch, n, ctx), steps, 4,
                      p.eagle3.ms(batch, steps, 4, ctx) if steps else math.nan, p.eagle3.extend(batch, ctx),
                      p.hvd_cpu.ms(batch))


GRID = [(b, n, 100 * b * k, s) for b in (1, 2, 8, 32) for n, s in ((1, 0), (4, 1), (8, 2), (16, 3)) for k in (1, 3)]


def test_a_step_predicted_term_by_term():
    t = StepTiming(batch=2, tokens_per_row=4, context_tokens=100, verify_ms=2.0, draft_steps=3, topk=4, draft_ms=2.0)
    # verify: 1 + 0.001 * 100 + 0.01 * max(8, 2 * 4) = 1.18; draft, 3 steps = 2 draft forwards:
    # 0.1 + 2 * (0.5 + 0.002 * 8 + 0.0001 * 100) = 1.152
    assert predicted(profile(), t) == pytest.approx({"verify": 1.18, "draft": 1.152, "step": 2.332})
    assert measured(t) == {"verify": 2.0, "draft": 2.0, "step": 4.0}  # extend and host were not timed
    assert errors(profile(), [t]) == pytest.approx({"verify": 0.41, "draft": 0.424, "step": 1 - 2.332 / 4})


def test_the_fit_recovers_the_profile_the_steps_came_from():
    # an extend dearer per context token than a draft step, and a tree build per row (the CPU harness's)
    true = profile(extend=(0.03, 0.0008), draft_per_row_ms=0.05)
    fitted = fit_profile(profile(verify_fixed=3.0), [served(true, *g) for g in GRID], "fit")
    assert fitted.kind == "measured" and fitted.name == "fit"
    assert fitted.verify.fixed_ms == pytest.approx(1.0, rel=1e-6)
    assert [fitted.eagle3.extend_ms, fitted.eagle3.extend_per_token_ms,
            fitted.eagle3.extend_per_context_token_ms] == pytest.approx([0.4, 0.03, 0.0008], rel=1e-6)
    assert fitted.eagle3.per_context_token_ms == pytest.approx(0.0001, rel=1e-6)  # the draft steps' stays theirs
    assert fitted.eagle3.per_row_ms == pytest.approx(0.05, rel=1e-6)
    assert all(v < 1e-6 for v in fitted.fit_error.values())


def test_a_term_without_enough_shapes_keeps_the_served_constants():
    base = profile(verify_fixed=3.0)
    one_shape = [served(profile(), 8, 4, 800, 1)] * 20  # one B * N, one step count, one batch
    fitted = fit_profile(base, one_shape, "fit")
    assert fitted.verify == base.verify and fitted.hvd_cpu == base.hvd_cpu
    assert (fitted.eagle3.fixed_ms, fitted.eagle3.per_step_ms) == (0.1, 0.5)
    # one batch and one context: the extend's fixed part refitted, its per-token and context constants the served
    assert (fitted.eagle3.extend_per_token_ms, fitted.eagle3.extend_per_context_token_ms) == (0.002, 0.0001)
    assert fitted.eagle3.extend_ms == pytest.approx(0.4)


def test_a_draft_refit_keeps_the_served_extend_constants_its_steps_cannot_tell():
    base = profile(extend=(0.03, 0.0008))
    # one batch and one context, two draft step counts: the draft forwards refitted, the extend's slopes not
    steps = [served(profile(extend=(0.03, 0.0008)), 8, 4, 800, s) for s in (1, 3)] * 10
    fitted = fit_profile(base, steps, "fit")
    assert (fitted.eagle3.extend_per_token_ms, fitted.eagle3.extend_per_context_token_ms) == (0.03, 0.0008)
    assert fitted.eagle3.extend_ms == pytest.approx(0.4)


def test_the_refiner_serves_a_better_fit_and_only_a_better_one():
    true = profile()
    wrong = ProfileRefiner(profile(verify_fixed=3.0, name="guess"), window=64, refit_every=len(GRID))
    changed = [wrong.add(served(true, *g)) for g in GRID]
    assert changed == [False] * (len(GRID) - 1) + [True]
    assert (wrong.profile.name, wrong.profile.kind, wrong.version) == ("guess+online", "measured", 1)
    assert wrong.summary()["profile_error_step"] < 1e-6

    right = ProfileRefiner(true, window=64, refit_every=len(GRID))
    assert not any(right.add(served(true, *g)) for g in GRID)  # an exact fit is no better than exact
    assert right.profile is true and right.summary()["profile_version"] == 0

    frozen = ProfileRefiner(profile(verify_fixed=3.0), window=64, refit_every=1, refit=False)
    assert not any(frozen.add(served(true, *g)) for g in GRID)
    assert frozen.summary()["profile_error_verify"] > 0.1



def test_the_refiner_reports_what_the_profile_does_not_time():
    refiner = ProfileRefiner(profile(), window=16, refit_every=1000)
    steps = [served(profile(), 8, 4, 800, 1)]  # no wall time (after a prefill): nothing to report yet
    refiner.add(steps[0])
    assert "profile_untimed_ms" not in refiner.summary()
    # a refit keeps the served untimed part without steps run back to back
    assert fit_profile(dataclasses.replace(profile(), untimed_ms=0.7), steps, "f").untimed_ms == 0.7
    for extra_ms in (1.0, 2.0, 3.0):  # wall = the timed parts + extra_ms
        t = served(profile(), 8, 1, 800, 0)
        timed = t.verify_ms + t.extend_ms + t.host_ms
        steps.append(dataclasses.replace(t, wall_ms=timed + extra_ms))
        refiner.add(steps[-1])
    assert fit_profile(profile(), steps, "f").untimed_ms == pytest.approx(2.0)  # and takes the steps' median with
    # the refiner serves it at its next refit even where the terms' fit is no better (exact steps here)
    follows = ProfileRefiner(profile(), window=16, refit_every=len(steps))
    assert [follows.add(t) for t in steps] == [False] * (len(steps) - 1) + [True]
    assert follows.profile.untimed_ms == pytest.approx(2.0) and follows.profile.verify == profile().verify
    assert follows.version == 1
    summary = refiner.summary()
    # timed: 1 + 0.001 * 800 + 0.01 * 8 = 1.88 verify, 0.4 + 0.002 * 8 + 0.0001 * 800 = 0.496 extend,
    # 0.05 + 0.03 * 8 = 0.29 host: 2.666 ms; the median extra is 2.0 ms, 2 / 4.666 of the wall
    assert summary["profile_untimed_ms"] == 2.0
    assert summary["profile_untimed_share"] == round(2.0 / 4.666, 4)

def test_refiner_bounds():
    with pytest.raises(ValueError, match="window must be >= 16"):
        ProfileRefiner(profile(), window=4)
