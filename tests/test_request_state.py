"""The native decision state (drafter/native/request_state.hpp) against the reference
(request_state.RequestState): the same packed rows, exactly, after any observe/record sequence."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_hvd.drafter.native_drafter import _native
from sglang_hvd.request_state import _COLUMNS, NativeRequestState, RequestState, StateBatch, new_request_state

pytestmark = pytest.mark.skipif(NativeRequestState is None, reason="the native extension is not built")


def test_the_native_state_packs_the_docstrings_worked_example_as_the_reference_does():
    """request_state.py's worked example: drafts at 10 (a b c d) and 12 (c d e), output a b c x."""
    a, b, c, d, e, x = 1, 2, 3, 4, 5, 9
    prompt = np.arange(100, 112, dtype=np.int32)
    native = NativeRequestState(prompt)
    native.observe([0] * 10)
    native.record([a, b, c, d])
    native.observe([a, b])
    native.record([c, d, e])
    native.observe([c, x])
    row = native.row()
    assert len(row) == _COLUMNS == _native.STATE_COLUMNS == 23
    assert row[:3] == [14.0, 12.0, 8.0]  # pos, prompt length, tail length
    assert row[3:11] == [0.0, 0.0, 0.0, 0.0, float(a), float(b), float(c), float(x)]  # the last 8 context tokens
    # both drafts broke on x: confirmed 1 (the newest) and 3, mean resolved 2.0, gap 2, no first-token miss
    assert row[11:] == [1.0, 3.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, math.log1p(2), 2.0, math.log1p(2), 0.0]
    assert (native.pos, native.num_prompt_tokens, native.tail) == (14, 12, [0, 0, 0, 0, a, b, c, x])


def test_a_short_prompt_pads_the_tail_and_an_empty_history_is_zeros():
    native = NativeRequestState(np.array([7, 8], dtype=np.int32))
    assert native.row() == [0.0, 2.0, 2.0, 7.0, 8.0] + [-1.0] * 6 + [0.0] * 12
    assert native.row() == RequestState([7, 8]).row()
    empty = NativeRequestState(np.array([], dtype=np.int32))
    assert empty.row() == RequestState([]).row() == [0.0, 0.0, 0.0] + [-1.0] * 8 + [0.0] * 12


@settings(max_examples=150, deadline=None)
@given(prompt=st.lists(st.integers(0, 3), max_size=12),
       steps=st.lists(st.tuples(st.lists(st.integers(0, 3), max_size=6), st.lists(st.integers(0, 3), min_size=1,
                                                                                 max_size=5)), max_size=70))
def test_native_rows_equal_the_references_after_any_sequence(prompt, steps):
    """Drafts recorded and tokens observed in any order (most drafts short over a 4-token
    vocabulary: many confirmations, breaks, first-token misses and windows turned over):
    every packed row is the reference's, bit for bit."""
    ref, native = RequestState(prompt), NativeRequestState(np.asarray(prompt, dtype=np.int32))
    assert native.row() == ref.row()
    for draft, emitted in steps:
        ref.record(tuple(draft))
        native.record(draft)
        assert native.row() == ref.row()
        ref.observe(emitted)
        native.observe(emitted)
        assert native.row() == ref.row()
    assert native.snapshot() == ref.snapshot()


def test_a_batch_packed_and_recorded_in_one_call_each_equals_the_references_row_by_row():
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 5, size=int(n)).tolist() for n in rng.integers(0, 20, size=9)]
    refs = [RequestState(p) for p in prompts]
    natives = [new_request_state(p) for p in prompts]
    assert all(isinstance(s, NativeRequestState) for s in natives)
    for _ in range(40):
        lens = rng.integers(0, 6, size=len(prompts)).astype(np.int32)
        tokens = np.where(np.arange(6)[None, :] < lens[:, None], rng.integers(0, 5, size=(len(prompts), 6)),
                          -1).astype(np.int32)
        want, got = StateBatch.of(refs), StateBatch.of(natives)
        for field in ("pos", "num_prompt_tokens", "history", "tails", "tail_lens"):
            assert np.array_equal(getattr(got, field), getattr(want, field)), field
            assert getattr(got, field).dtype == getattr(want, field).dtype
        RequestState.record_rows(refs, tokens, lens)
        NativeRequestState.record_rows(natives, tokens, lens)
        for r, n in zip(refs, natives):
            emitted = rng.integers(0, 5, size=int(rng.integers(1, 4))).tolist()
            r.observe(emitted)
            n.observe(emitted)
    assert [n.row() for n in natives] == [r.row() for r in refs]
    assert StateBatch.of([]).pos.shape == (0,)


def test_observe_rows_is_each_states_observe_and_refuses_a_count_mismatch():
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, 5, size=int(n)).tolist() for n in rng.integers(0, 20, size=7)]
    refs = [RequestState(p) for p in prompts]
    natives = [new_request_state(p) for p in prompts]
    batched = [new_request_state(p) for p in prompts]
    for _ in range(30):
        lens = rng.integers(0, 6, size=len(prompts)).astype(np.int32)
        drafts = rng.integers(0, 5, size=(len(prompts), 6)).astype(np.int32)
        for states in (refs, natives, batched):
            type(states[0]).record_rows(states, drafts, lens)
        emitted = [rng.integers(0, 5, size=int(rng.integers(0, 4))).tolist() for _ in prompts]
        for r, n, t in zip(refs, natives, emitted):
            r.observe(t)
            n.observe(t)
        NativeRequestState.observe_rows(batched, emitted)
    assert [b.row() for b in batched] == [n.row() for n in natives] == [r.row() for r in refs]
    RequestState.observe_rows(refs, [[1]] * len(refs))  # the reference's, the same contract
    assert [r.pos for r in refs] == [n.pos + 1 for n in natives]
    for cls, states in ((NativeRequestState, natives), (RequestState, refs)):
        with pytest.raises(ValueError, match="one token list per state"):
            cls.observe_rows(states, [[1]])


def test_record_rows_refuses_a_draft_longer_than_its_row_and_a_count_mismatch():
    states = [NativeRequestState(np.array([1], dtype=np.int32))]
    with pytest.raises(ValueError, match="longer than its row"):
        NativeRequestState.record_rows(states, np.zeros((1, 2), np.int32), np.array([3], np.int32))
    with pytest.raises(ValueError, match="one draft per state"):
        NativeRequestState.record_rows(states, np.zeros((2, 2), np.int32), np.array([1, 1], np.int32))
