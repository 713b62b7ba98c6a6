"""Lossless under sampling: an HVD server's sampled outputs follow the non-speculative
server's distribution (SGLang's sampling verify, run on the CPU by
``stubs/hvd_cpu_shims/sampling.py``).

The spread pair (tests/sglang_cpu/tiny_models.py: next-token probabilities ~0.73 / 0.22 /
the rest over ten digits), EAGLE3 topk 1, 3 steps, 4 nodes; two fixed prompts (one that
walks the digit cycle, so its own text drafts at once; one that does not), each drawn
DRAWS times per sampling setting (temperature 1.0 and 0.7, top-p 1 and 0.9; 5 new
tokens), both prompts in one batch. Servers, one at a time:

  reference   no speculation: the distribution to match
  hvd         HVD, gate threshold 1.0: about half the rows are cache rows and half
              EAGLE3's, nearly every batch mixed; recording traces
  hvd_cache   HVD, threshold -1: every row with a cache draft is a cache row (two settings)
  hvd_wrong   as hvd, with a deliberately wrong verify that accepts every draft token
              (HVD_TEST_VERIFY_FAULT=accept_draft; one setting, temperature 1)

The tests: two-sample chi-square tests of homogeneity (``launch/bench/sampling_power.py``)
per prompt and setting on two statistics, the whole 5-token output (outputs seen fewer
than 10 times in both samples together pooled) and its number of cycle steps (tokens that
follow their predecessor on the cycle: what the draft proposes), each at ALPHA = 1e-4
(24 tests on correct servers: a false alarm in at most 0.24% of runs, Bonferroni).
Power: the wrong verify is rejected (p < 1e-150) at temperature 1, the most spread-out
setting; and with 3,000 draws a verify that moves 0.06 of probability onto the likeliest
output (0.207 -> 0.267 at temperature 1) is caught with power ~0.8, 0.07 with ~0.96
(``python launch/bench/sampling_power.py``; the cycle-steps test is the sharper one).
"""

from __future__ import annotations

import collections
import os

import pytest

pytest.importorskip("sglang", reason="the SGLang CPU harness needs the sglang extra (sglang==0.5.23)")
stats = pytest.importorskip("scipy.stats", reason="the chi-square tests need scipy (the sglang extra has it)")

from sglang_hvd.harness import server as harness  # noqa: E402
from sglang_hvd.harness.tiny_models import CYCLE_TOKENS  # noqa: E402

from . import REPO  # noqa: E402

pytestmark = [pytest.mark.sglang, pytest.mark.e2e, pytest.mark.full]


def _power_module():
    import importlib.util

    path = os.path.join(REPO, "launch", "bench", "sampling_power.py")
    spec = importlib.util.spec_from_file_location("sampling_power", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


homogeneity_pvalue = _power_module().homogeneity_pvalue
DRAWS = 3000
ALPHA = 1e-4
NEW_TOKENS = 5
SETTINGS = {"t1.0": dict(temperature=1.0, top_p=1.0), "t1.0_p0.9": dict(temperature=1.0, top_p=0.9),
            "t0.7": dict(temperature=0.7, top_p=1.0), "t0.7_p0.9": dict(temperature=0.7, top_p=0.9)}
# token ids (the spread pair's vocabulary is the tokenizer's first 1,024): "0123456789012"
# and '&\'()*+,-.5'
PROMPTS = {"count": [*CYCLE_TOKENS, *CYCLE_TOKENS[:3]], "story": [5, 6, 7, 8, 9, 10, 11, 12, 13, 20]}


def _draw(server, ids: dict[str, list[int]], setting: dict) -> dict[str, collections.Counter]:
    names = [name for _ in range(DRAWS) for name in ids]
    out = server.request("/generate", {"input_ids": [ids[n] for n in names], "sampling_params": {
        **setting, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}}, timeout=900)
    counts = {name: collections.Counter() for name in ids}
    verifies = 0
    for name, o in zip(names, out):
        assert len(o["output_ids"]) == NEW_TOKENS
        counts[name][tuple(o["output_ids"])] += 1
        verifies += o["meta_info"].get("spec_verify_ct", 0)
    return dict(counts=counts, tokens_per_verify=(len(out) * (NEW_TOKENS - 1) / verifies) if verifies else None)


@pytest.fixture(scope="module")
def runs(sglang_server_factory, sglang_cpu_models, qwen_gates, tmp_path_factory):
    m = sglang_cpu_models
    work = tmp_path_factory.mktemp("sampling_e2e")
    ids = PROMPTS
    gate = qwen_gates(1, 3, 4)
    eagle = harness.eagle3_args(m.spread_draft, topk=1, steps=3) + ["--max-running-requests", "64"]
    hvd_env = {"SGLANG_HVD_ENABLE": "1", "SGLANG_HVD_GATE": gate, "SGLANG_HVD_DRAFTER": "native"}
    configs = {
        "reference": (dict(extra_args=["--max-running-requests", "64"]), list(SETTINGS)),
        "hvd": (dict(extra_args=eagle, env={**hvd_env, "SGLANG_HVD_THRESHOLD": "1.0",
                                            "SGLANG_HVD_RECORD_TRACES": str(work / "served.jsonl")}), list(SETTINGS)),
        "hvd_cache": (dict(extra_args=eagle, env={**hvd_env, "SGLANG_HVD_THRESHOLD": "-1"}), ["t1.0", "t0.7_p0.9"]),
        "hvd_wrong": (dict(extra_args=eagle, env={**hvd_env, "SGLANG_HVD_THRESHOLD": "1.0",
                                                  "HVD_TEST_VERIFY_FAULT": "accept_draft"}), ["t1.0"]),
    }
    out = {"work": work, "ids": ids}
    for name, (cfg, settings) in configs.items():
        server = sglang_server_factory(m.spread, **cfg)
        try:
            draws = {s: _draw(server, ids, SETTINGS[s]) for s in settings}
            info = server.server_info()
            hvd = [st["hvd"] for st in info.get("internal_states", []) if "hvd" in st]
            out[name] = dict(draws=draws, hvd=hvd[0] if hvd else None)
        finally:
            server.stop()
    return out


def _cycle_steps(prompt: list[int], output: tuple[int, ...]) -> int:
    """Tokens of ``output`` that follow their predecessor on the digit cycle."""
    steps, prev = 0, prompt[-1]
    for t in output:
        steps += prev in CYCLE_TOKENS and t == CYCLE_TOKENS[(CYCLE_TOKENS.index(prev) + 1) % len(CYCLE_TOKENS)]
        prev = t
    return steps


def _by_steps(prompt: list[int], counts: collections.Counter) -> dict[int, int]:
    out: dict[int, int] = collections.Counter()
    for output, n in counts.items():
        out[_cycle_steps(prompt, output)] += n
    return out


def _report(runs, name: str) -> list[tuple[str, str, str, float, int]]:
    """(setting, prompt, statistic, p-value, categories) for every test of ``name``'s draws."""
    table = []
    for setting, got in runs[name]["draws"].items():
        ref = runs["reference"]["draws"][setting]
        for prompt, ids in PROMPTS.items():
            a, b = ref["counts"][prompt], got["counts"][prompt]
            for statistic, (x, y) in (("output", (a, b)), ("steps", (_by_steps(ids, a), _by_steps(ids, b)))):
                p, categories = homogeneity_pvalue(x, y)
                table.append((setting, prompt, statistic, p, categories))
                print(f"{name:10s} {setting:10s} {prompt:6s} {statistic:6s} p={p:.3g} categories={categories} "
                      f"tokens/verify={got['tokens_per_verify']:.2f}")
    return table


@pytest.mark.parametrize("name", ["hvd", "hvd_cache"])
def test_sampled_outputs_follow_the_non_speculative_distribution(runs, name):
    table = _report(runs, name)
    assert len(table) == 4 * len(runs[name]["draws"])
    failed = [row for row in table if row[3] <= ALPHA]
    assert not failed, (f"{name}: outputs differ from the non-speculative server's "
                        f"(setting, prompt, statistic, p, categories): {failed}")
    for setting, got in runs[name]["draws"].items():
        assert got["tokens_per_verify"] > 1.5, (setting, got["tokens_per_verify"])  # speculation did run
        for prompt in PROMPTS:
            assert len(got["counts"][prompt]) >= 8  # sampled, not one output repeated


def test_rows_were_cache_rows_eagle3_rows_and_mixed(runs):
    mixed, cache = runs["hvd"]["hvd"], runs["hvd_cache"]["hvd"]
    assert mixed["step_errors"] == 0 and cache["step_errors"] == 0
    share = mixed["cache_rows"] / mixed["rows"]
    assert 0.15 < share < 0.85, mixed  # both kinds in (nearly) every batch of ~50 rows
    assert mixed["eagle3_verifies"] > 0.15 * mixed["rows"]
    assert mixed["rows"] / mixed["steps"] > 20
    assert cache["cache_pick_rate"] > 0.99  # every row that has a cache draft (a few positions have none)


def test_a_wrong_verify_fails_the_same_test(runs):
    table = _report(runs, "hvd_wrong")
    assert len(table) == 4 and all(p < 1e-6 for _, _, _, p, _ in table), table


def test_recorded_accepts_are_the_labels_replay_computes_from_the_sampled_output(runs):
    """Under sampling, as under greedy, verify accepts exactly the draft's longest prefix the
    output repeats (a rejected token is taken out of the distribution the next token is drawn
    from): so labels computed by replaying recorded sampled outputs are what verify did."""
    from sglang_hvd.trace import iter_traces

    records = list(iter_traces(str(runs["work"] / "served.jsonl")))
    assert len(records) == DRAWS * len(PROMPTS) * len(SETTINGS)
    whole, by_src = 0, collections.Counter()
    for r in records:
        out = r.output_ids.tolist()
        for s in r.steps:
            if s.pos + len(s.draft) >= len(out):
                continue  # the output ends inside the draft: the prefix is cut short
            prefix = 0
            while prefix < len(s.draft) and s.draft[prefix] == out[s.pos + prefix]:
                prefix += 1
            assert s.accept_len == prefix, (s, out)
            whole += s.accept_len == len(s.draft)
            by_src[s.src] += 1
    assert by_src["cache"] > 500 and by_src["eagle3"] > 500, by_src
    assert whole > 100  # some drafts accepted whole, many cut short
