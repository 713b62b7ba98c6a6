"""HVD tree rows end to end on a real SGLang 0.5.23 server (CPU engine): topk 2, 3 steps,
8 draft tokens per row, against the non-speculative server's output.

Servers (one at a time, ~40 s to start each):
  llama_reference    the random Llama target, no speculation: the expected tokens
  llama_hvd          EAGLE3 (random draft, almost never right) + HVD with the gate's
                     threshold forced to -1 (every non-empty cache draft is verified) and
                     no EAGLE3 reserve: rows without a cache draft keep EAGLE3's tree, a
                     cache draft shorter than 7 tokens shares its row with EAGLE3's first
                     nodes, a longer one fills the row as a chain of 7. Every prompt is
                     sent twice: round 2 finds round 1's responses in the global cache, so
                     its chains are right and accepted whole: 8 tokens per verify, twice
                     what an EAGLE3 tree of 3 steps can give (a wide accept width, the KV
                     move of the accepted path and EAGLE3's draft extend all at work).
  llama_hvd_full     the same with SGLang's FULL_MASK tree layout (the GPU one) forced
  cycle_reference    the Qwen3 "cycle" target (tiny_models.py), no speculation
  cycle_hvd          its EAGLE3 draft (usually right) + HVD forced to the cache with an
                     EAGLE3 reserve of 3, on prompts that teach the cache a wrong
                     continuation: two-branch rows whose cache branch fails at its first
                     token and whose EAGLE3 branch is accepted.
  cycle_tree         the cycle target with HVD and cache siblings (4) (its reference:
                     cycle_reference, which serves these prompts after its own): prompts
                     whose cache chain is wrong at its first token while a sibling from
                     the cache tree draft is right, so a cache tree row is accepted down
                     its second branch.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("sglang", reason="the SGLang CPU harness needs the sglang extra (sglang==0.5.23)")

from sglang_hvd.harness import server as harness  # noqa: E402
from sglang_hvd.harness.tiny_models import CYCLE_TOKENS  # noqa: E402

pytestmark = [pytest.mark.sglang, pytest.mark.e2e]
TOPK, STEPS, NODES = 2, 3, 8


def _llama_prompts() -> list[dict]:
    rng = random.Random(7)
    block = [rng.randrange(100, 150000) for _ in range(20)]
    reqs = [dict(input_ids=[rng.randrange(100, 150000) for _ in range(n)], max_new_tokens=m)
            for n, m in zip([9, 23, 41, 60], [40, 33, 40, 24])]
    # Prompts that repeat themselves: cache drafts from the first step, of every length.
    reqs += [dict(input_ids=block * 3, max_new_tokens=40),
             dict(input_ids=block[:6] + [5] + block[:6], max_new_tokens=36),
             dict(input_ids=block + [8, 9] + block[:12], max_new_tokens=40)]
    return reqs


def _cycle_prompts() -> list[dict]:
    """Digits that teach the cache a continuation the target contradicts. E.g. the
    prompt repeats "4 5 6 7 2 2 2 2" four times and ends in "4 5 6": prefill emits 7 (the
    cycle), and the first verify's cache draft (an 8-token match, three times in the
    prompt) says "2 2 2 2" where the target, and EAGLE3's draft, say "8 9"."""
    c = CYCLE_TOKENS
    prompts = []
    for a in (1, 4, 6):
        anchor = [c[(a + i) % 10] for i in range(4)]
        lure = anchor + [c[(a + 6) % 10]] * 4
        prompts.append(dict(input_ids=lure * 4 + anchor[:3], max_new_tokens=24))
    return prompts


def _sibling_prompts() -> list[dict]:
    """In digits (c_i = CYCLE_TOKENS[i % 10]): c_a follows 4 different tokens in the
    prompt, 3 times continued by c_{a+4} c_{a+5} (the lure), once by c_{a+1} c_{a+2} (the
    cycle); the prompt ends in c_{a-1}, found nowhere else. Prefill emits c_a; the first
    verify's cache draft comes from the one-token pattern c_a: the chain c_{a+4} c_{a+5} (3
    of 4) and on (up to the budget of a 1-token match), and, with siblings, the tree's
    c_{a+1} c_{a+2} (1 of 4) under the root: the target's own continuation."""
    c = lambda i: CYCLE_TOKENS[i % 10]  # noqa: E731
    prompts = []
    for a in (4, 7, 11):
        ids = [c(a - 4), c(a), c(a + 4), c(a + 5), c(a + 3), c(a), c(a + 4), c(a + 5), c(a + 5), c(a), c(a + 4),
               c(a + 5), c(a - 2), c(a), c(a + 1), c(a + 2), c(a - 1)]
        prompts.append(dict(input_ids=ids, max_new_tokens=16))
    return prompts


LLAMA_PROMPTS, CYCLE_PROMPTS, SIBLING_PROMPTS = _llama_prompts(), _cycle_prompts(), _sibling_prompts()


def _serve(factory, model, prompts, extra_args=(), env=None, rounds=2) -> dict:
    server = factory(model, list(extra_args), env)
    try:
        out = [server.generate_many(prompts) for _ in range(rounds)]
        info = server.server_info()
    finally:
        server.stop()
    states = [s["hvd"] for s in info.get("internal_states") or [] if "hvd" in s]
    return {"rounds": out, "hvd": states[0] if states else None, "log": server.log_path}


def _hvd_env(gate: str, reserve: int, **extra) -> dict:
    return {"SGLANG_HVD_ENABLE": "1", "SGLANG_HVD_GATE": gate, "SGLANG_HVD_THRESHOLD": "-1",
            "SGLANG_HVD_EAGLE_RESERVE": str(reserve), "SGLANG_HVD_DRAFTER": "native", **extra}


@pytest.fixture(scope="module")
def runs(sglang_server_factory, sglang_cpu_models, qwen_gates) -> dict:
    m = sglang_cpu_models
    gate = qwen_gates(TOPK, STEPS, NODES)
    llama_eagle = harness.eagle3_args(m.llama_draft, topk=TOPK, steps=STEPS, draft_tokens=NODES)
    cycle_eagle = harness.eagle3_args(m.cycle_draft, topk=TOPK, steps=STEPS, draft_tokens=NODES)
    f = sglang_server_factory
    return {
        "llama_reference": _serve(f, m.llama, LLAMA_PROMPTS, rounds=1),
        "llama_hvd": _serve(f, m.llama, LLAMA_PROMPTS, llama_eagle, _hvd_env(gate, 0)),
        "llama_hvd_full": _serve(f, m.llama, LLAMA_PROMPTS, llama_eagle,
                                 _hvd_env(gate, 0, HVD_TEST_TREE_MASK_MODE="full")),
        "cycle_reference": _serve(f, m.cycle, CYCLE_PROMPTS + SIBLING_PROMPTS, rounds=1),
        "cycle_hvd": _serve(f, m.cycle, CYCLE_PROMPTS, cycle_eagle, _hvd_env(gate, 3)),
        "cycle_tree": _serve(f, m.cycle, SIBLING_PROMPTS, cycle_eagle, _hvd_env(gate, 0, SGLANG_HVD_CACHE_SIBLINGS="4"),
                             rounds=1),
    }


def _tokens(run, round_):
    return [r["output_ids"] for r in run["rounds"][round_]]


def _tokens_per_verify(run, round_):
    metas = [r["meta_info"] for r in run["rounds"][round_]]
    # The prefill emits each request's first token without a verify.
    return sum(m["completion_tokens"] - 1 for m in metas) / sum(m["spec_verify_ct"] for m in metas)


@pytest.mark.parametrize("name, reference", [("llama_hvd", "llama_reference"), ("llama_hvd_full", "llama_reference"),
                                             ("cycle_hvd", "cycle_reference"), ("cycle_tree", "cycle_reference")])
def test_tree_rows_leave_the_output_unchanged(runs, name, reference):
    want = _tokens(runs[reference], 0)
    if reference == "cycle_reference":  # it served CYCLE_PROMPTS, then SIBLING_PROMPTS
        want = want[len(CYCLE_PROMPTS):] if name == "cycle_tree" else want[: len(CYCLE_PROMPTS)]
    for round_ in range(len(runs[name]["rounds"])):
        got = _tokens(runs[name], round_)
        assert len(got) == len(want)
        for i, (a, b) in enumerate(zip(got, want)):
            assert a == b, f"{name} round {round_} prompt {i} differs at token " \
                           f"{next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), 'length')}; " \
                           f"log: {runs[name]['log']}"


@pytest.mark.parametrize("name", ["llama_hvd", "llama_hvd_full"])
def test_cache_chains_longer_than_eagle3s_steps_are_accepted_whole(runs, name):
    run = runs[name]
    # Round 2 copies round 1: cache chains are right, and grow with the match (a p-token
    # match drafts up to max_spec_factor * p + max_spec_offset tokens) up to 7 + the bonus
    # per verify. An EAGLE3 tree of 3 steps accepts at most 3 + 1 per verify (the random
    # draft almost never 1): more than that on average needs wide chains.
    assert _tokens_per_verify(run, 1) > STEPS + 1
    assert _tokens_per_verify(run, 0) < _tokens_per_verify(run, 1)
    hist = [0] * NODES
    for r in run["rounds"][1]:
        for k, count in enumerate(r["meta_info"]["spec_correct_drafts_histogram"]):
            hist[k] += count
    assert sum(hist[STEPS + 1 :]) > 0 and hist[NODES - 1] > 0, hist  # verifies that accepted all 7 drafts
    s = run["hvd"]
    assert s["gate_errors"] == 0 and s["step_errors"] == 0, s
    # Mixed batches: EAGLE3 rows (no draft yet: most of round 1), two-branch rows (short
    # drafts) and chains.
    assert 0.1 < s["cache_pick_rate"] < 0.9 and s["two_branch_rate"] > 0.02, s
    assert s["cache_mean_accept"] > 2, s


def test_a_wrong_cache_branch_leaves_eagle3s_branch_to_be_accepted(runs):
    s = runs["cycle_hvd"]["hvd"]
    assert s["gate_errors"] == 0 and s["step_errors"] == 0, s
    assert s["two_branch_rate"] > 0.3, s  # a reserve of 3: every cache row keeps EAGLE3's first 3 nodes
    # 3 prompts x 2 rounds: the lure fails at its first token and EAGLE3's branch is right
    # (unless the target's noise leaves the cycle right there).
    assert s["eagle3_branch_wins"] >= 3, s
    assert s["eagle3_mean_accept"] > 0.5, s


def test_a_cache_tree_row_is_accepted_down_a_sibling_when_its_chain_is_wrong(runs):
    c = lambda i: CYCLE_TOKENS[i % 10]  # noqa: E731
    # the premise: the target continues each prompt with c_a c_{a+1} c_{a+2} (the cycle, not the lure)
    reference = _tokens(runs["cycle_reference"], 0)[len(CYCLE_PROMPTS):]
    assert [out[:3] for out in reference] == [[c(a), c(a + 1), c(a + 2)] for a in (4, 7, 11)]
    s = runs["cycle_tree"]["hvd"]
    assert s["gate_errors"] == 0 and s["step_errors"] == 0, s
    assert s["gate_cache_siblings"] == 4 and s["tree_rows"] >= 3, s
    # every prompt's first verify is won by the sibling branch (all 3 here; 2 allowed, should
    # another request's response have taught the global cache the cycle first)
    assert s["sibling_wins"] >= 2, s
