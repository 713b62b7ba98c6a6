"""Serving options declared once (sglang_hvd/serving/options.py): each config field makes
its SGLANG_HVD_* variable and its launcher flag; values are checked and named either way.

Runs without sglang: the launcher's parser (patches/launch.py) imports sglang only to run.
"""

from __future__ import annotations

import dataclasses

import pytest

from sglang_hvd.drafter import DrafterConfig
from sglang_hvd.errors import HvdInputError
from sglang_hvd.patches import launch
from sglang_hvd.serving.config import DRAFTER_OPTIONS, OPTIONS, SERVING_OPTIONS, HVDServingConfig

# The names users and scripts rely on: they must not change.
NAMES = [
    ("SGLANG_HVD_ENABLE", "--hvd-disable"), ("SGLANG_HVD_GATE", "--hvd-gate"),
    ("SGLANG_HVD_THRESHOLD", "--hvd-threshold"), ("SGLANG_HVD_SCORE_RULE", "--hvd-score-rule"),
    ("SGLANG_HVD_EAGLE_RESERVE", "--hvd-eagle-reserve"), ("SGLANG_HVD_CACHE_SIBLINGS", "--hvd-cache-siblings"),
    ("SGLANG_HVD_DRAFTER", "--hvd-drafter"), ("SGLANG_HVD_DRAFT_THREADS", "--hvd-draft-threads"),
    ("SGLANG_HVD_PROFILE", "--hvd-profile"),
    ("SGLANG_HVD_TIERS", "--hvd-tiers"), ("SGLANG_HVD_PROFILE_REFIT", "--hvd-no-profile-refit"),
    ("SGLANG_HVD_SKIP_IDLE_EXTEND", "--hvd-skip-idle-extend"),
    ("SGLANG_HVD_ONLINE_CALIBRATION", "--hvd-online-calibration"), ("SGLANG_HVD_TIER_CYCLE", "--hvd-tier-cycle"),
    ("SGLANG_HVD_TIMINGS", "--hvd-timings"), ("SGLANG_HVD_RECORD_TRACES", "--hvd-record-traces"),
    ("SGLANG_HVD_RECORD_QUEUE", "--hvd-record-queue"),
    ("SGLANG_HVD_ALLOW_SGLANG_VERSION", "--hvd-allow-sglang-version"),
    ("SGLANG_HVD_MAX_DEPTH", "--hvd-max-depth"), ("SGLANG_HVD_MAX_SPEC_TOKENS", "--hvd-max-spec-tokens"),
    ("SGLANG_HVD_MAX_SPEC_FACTOR", "--hvd-max-spec-factor"), ("SGLANG_HVD_MAX_SPEC_OFFSET", "--hvd-max-spec-offset"),
    ("SGLANG_HVD_MIN_TOKEN_PROB", "--hvd-min-token-prob"), ("SGLANG_HVD_GLOBAL_MAX_TOKENS", "--hvd-global-max-tokens"),
    ("SGLANG_HVD_MAX_OCCURRENCES", "--hvd-max-occurrences"), ("SGLANG_HVD_MAX_SCAN", "--hvd-max-scan"),
]


def test_every_field_has_exactly_one_variable_and_one_flag():
    assert [(opt.env, opt.flag) for opt in OPTIONS] == NAMES
    served = [f.name for f in dataclasses.fields(HVDServingConfig) if f.name != "drafter_overrides"]
    assert [opt.name for opt in SERVING_OPTIONS] == served
    assert [opt.name for opt in DRAFTER_OPTIONS] == [f.name for f in dataclasses.fields(DrafterConfig)]
    assert all(opt.help for opt in OPTIONS)


def test_the_launcher_help_lists_every_flag_with_its_variable():
    text = " ".join(launch.build_parser().format_help().split())  # unwrapped
    for opt in OPTIONS:
        assert opt.flag in text and opt.env in text
    assert "--hvd-disable serve without HVD (plain SGLang EAGLE3), e.g. for an A/B run (SGLANG_HVD_ENABLE=0)" in text
    assert "(SGLANG_HVD_RECORD_QUEUE; default: 4096)" in text
    assert "(SGLANG_HVD_DRAFT_THREADS; default: a quarter of the CPUs this process may use, 1 to 4)" in text
    assert "(SGLANG_HVD_EAGLE_RESERVE; default: the gate's)" in text
    assert "only the resource bounds --hvd-global-max-tokens, --hvd-max-occurrences, --hvd-max-scan may differ" in text
    assert "(SGLANG_HVD_MAX_DEPTH; default: the gate's; no other value is accepted)" in text


def _config(argv):
    args, rest = launch.build_parser().parse_known_args(argv)
    return launch.config_from_args(args), rest


def test_flags_round_trip_through_the_environment_into_the_config():
    cfg, rest = _config(["--model-path", "m", "--hvd-gate", "/g", "--hvd-threshold", "2.5", "--hvd-eagle-reserve", "3",
                         "--hvd-cache-siblings", "0", "--hvd-drafter", "python", "--hvd-record-traces", "/t.jsonl",
                         "--hvd-record-queue", "7", "--hvd-allow-sglang-version", "0.6.0", "--hvd-max-scan", "99",
                         "--hvd-max-depth", "32", "--hvd-min-token-prob", "0.25", "--tp-size", "2"])
    assert rest == ["--model-path", "m", "--tp-size", "2"]
    env = cfg.to_env()
    assert env == {"SGLANG_HVD_ENABLE": "1", "SGLANG_HVD_GATE": "/g", "SGLANG_HVD_THRESHOLD": "2.5",
                   "SGLANG_HVD_EAGLE_RESERVE": "3", "SGLANG_HVD_CACHE_SIBLINGS": "0", "SGLANG_HVD_DRAFTER": "python",
                   "SGLANG_HVD_RECORD_TRACES": "/t.jsonl", "SGLANG_HVD_RECORD_QUEUE": "7",
                   "SGLANG_HVD_ALLOW_SGLANG_VERSION": "0.6.0", "SGLANG_HVD_MAX_DEPTH": "32",
                   "SGLANG_HVD_MIN_TOKEN_PROB": "0.25", "SGLANG_HVD_MAX_SCAN": "99", "SGLANG_HVD_TIER_CYCLE": "0",
                   "SGLANG_HVD_PROFILE_REFIT": "1", "SGLANG_HVD_SKIP_IDLE_EXTEND": "0",
                   "SGLANG_HVD_ONLINE_CALIBRATION": "0"}
    back = HVDServingConfig.from_env(env)
    assert back == cfg
    # drafter settings in DrafterConfig's field order, each of its field's type
    assert back.drafter_overrides == (("max_depth", 32), ("min_token_prob", 0.25), ("max_scan", 99))
    assert (back.threshold, back.eagle_reserve, back.record_queue) == (2.5, 3, 7)


def test_the_launcher_turns_hvd_on_unless_disabled():
    assert _config(["--hvd-gate", "g"])[0].enable is True
    off, _ = _config(["--hvd-disable"])
    assert off == HVDServingConfig(enable=False) and off.to_env()["SGLANG_HVD_ENABLE"] == "0"
    with pytest.raises(HvdInputError, match=r"SGLANG_HVD_ENABLE=1 needs a gate: set SGLANG_HVD_GATE=DIR \(or --hvd-"):
        _config([])


def test_minus_infinity_is_the_one_infinite_threshold():
    """-inf verifies every cache draft (launch/bench/engine_eval.py's cache_only mode)."""
    cfg, _ = _config(["--hvd-gate", "g", "--hvd-threshold=-inf"])
    assert cfg.threshold == float("-inf") and cfg.to_env()["SGLANG_HVD_THRESHOLD"] == "-inf"
    assert HVDServingConfig.from_env(cfg.to_env()) == cfg


@pytest.mark.parametrize("argv, message", [
    (["--hvd-threshold", "high"], "argument --hvd-threshold: 'high' is not a valid float"),
    (["--hvd-threshold", "nan"], "argument --hvd-threshold: must be a finite number or -inf, got nan"),
    (["--hvd-threshold", "inf"], "argument --hvd-threshold: must be a finite number or -inf, got inf"),
    (["--hvd-score-rule=-inf"], "argument --hvd-score-rule: must be a finite score, got -inf"),
    (["--hvd-eagle-reserve", "-1"], "argument --hvd-eagle-reserve: must be >= 0, got -1"),
    (["--hvd-cache-siblings", "2.5"], "argument --hvd-cache-siblings: '2.5' is not a valid int"),
    (["--hvd-record-queue", "0"], "argument --hvd-record-queue: must be >= 1, got 0"),
    (["--hvd-draft-threads", "65"], "argument --hvd-draft-threads: must be <= 64, got 65"),
    (["--hvd-max-spec-factor", "nan"], "argument --hvd-max-spec-factor: must be a finite number, got nan"),
    (["--hvd-min-token-prob", "inf"], "argument --hvd-min-token-prob: must be a finite number, got inf"),
    (["--hvd-global-max-tokens", "1e6"], "argument --hvd-global-max-tokens: '1e6' is not a valid int"),
])
def test_bad_flag_values_are_named_by_their_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        launch.build_parser().parse_known_args(["--hvd-gate", "g", *argv])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"python -m sglang_hvd.launch_server: error: {message}"


@pytest.mark.parametrize("env, message", [
    ({"SGLANG_HVD_THRESHOLD": "inf"}, "SGLANG_HVD_THRESHOLD must be a finite number or -inf, got inf"),
    ({"SGLANG_HVD_RECORD_QUEUE": "0"}, "SGLANG_HVD_RECORD_QUEUE must be >= 1, got 0"),
    ({"SGLANG_HVD_RECORD_QUEUE": "many"}, "SGLANG_HVD_RECORD_QUEUE='many' is not a valid int"),
    ({"SGLANG_HVD_DRAFT_THREADS": "0"}, "SGLANG_HVD_DRAFT_THREADS must be >= 1, got 0"),
    ({"SGLANG_HVD_DRAFT_THREADS": "2", "SGLANG_HVD_DRAFTER": "python"},
     "SGLANG_HVD_DRAFT_THREADS=2: the python drafter drafts on one thread; drop SGLANG_HVD_DRAFTER=python (the "
     "native drafter) or the threads"),
    ({"SGLANG_HVD_MAX_SPEC_OFFSET": "nan"}, "SGLANG_HVD_MAX_SPEC_OFFSET must be a finite number, got nan"),
    ({"SGLANG_HVD_MIN_TOKEN_PROB": "-inf"}, "SGLANG_HVD_MIN_TOKEN_PROB must be a finite number, got -inf"),
    ({"SGLANG_HVD_GLOBAL_MAX_TOKENS": "lots"}, "SGLANG_HVD_GLOBAL_MAX_TOKENS='lots' is not a valid int"),
])
def test_bad_variables_are_named_by_their_variable(env, message):
    with pytest.raises(HvdInputError) as refused:
        HVDServingConfig.from_env(env)
    assert str(refused.value) == message


def test_drafter_settings_are_checked_against_the_gate_naming_variable_and_flag():
    cfg, _ = _config(["--hvd-gate", "g", "--hvd-max-depth", "32", "--hvd-max-occurrences", "8"])
    with pytest.raises(HvdInputError, match=r"drop SGLANG_HVD_MAX_DEPTH \(or --hvd-max-depth\) or train a gate with it "
                                            r"\(hvd train ... --max-depth 32\)"):
        cfg.drafter_config(DrafterConfig())
    assert cfg.drafter_config(DrafterConfig(max_depth=32)).max_occurrences == 8
    negative, _ = _config(["--hvd-gate", "g", "--hvd-global-max-tokens", "-5"])
    with pytest.raises(HvdInputError) as refused:
        negative.drafter_config(DrafterConfig())
    assert str(refused.value) == ("HVD drafter settings SGLANG_HVD_GLOBAL_MAX_TOKENS (--hvd-global-max-tokens): "
                                  "global_max_tokens must be >= 0, got -5")


def test_drafter_overrides_are_ordered_typed_and_known():
    cfg = HVDServingConfig(drafter_overrides=(("max_scan", 5), ("max_spec_factor", 2)))
    assert cfg.drafter_overrides == (("max_spec_factor", 2.0), ("max_scan", 5))
    assert isinstance(cfg.drafter_overrides[0][1], float)
    with pytest.raises(HvdInputError, match="drafter_overrides: each of max_depth, .*, max_scan at most once"):
        HVDServingConfig(drafter_overrides=(("max_width", 5),))
    with pytest.raises(HvdInputError, match=r"drafter_overrides: each of .* once, got \['max_scan', 'max_scan'\]"):
        HVDServingConfig(drafter_overrides=(("max_scan", 5), ("max_scan", 6)))
    with pytest.raises(HvdInputError, match="SGLANG_HVD_MAX_SCAN must be an int, got 5.5"):
        HVDServingConfig(drafter_overrides=(("max_scan", 5.5),))
