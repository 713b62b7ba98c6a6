"""The payoff model (sglang_hvd/payoff.py): the gate's one prediction -> expected accepted
tokens at any row width, E_m(p) = p + p^2 + ... + p^m with E_D(p) = predicted."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_hvd.payoff import Payoff


def payoff(predicted, lens, cap: int) -> Payoff:
    return Payoff(np.array(predicted, dtype=np.float64), np.array(lens, dtype=np.int64), cap)


def test_a_learned_curve_is_made_non_increasing_cut_at_the_draft_and_summed():
    # row 0: s = .9 .5 .7 .2 -> .9 .5 .5 .2 (a running minimum), a 3-token draft keeps .9 .5 .5;
    # row 1: W = 4 of a 6-token draft, nothing past W; row 2: no draft
    survival = np.array([[0.9, 0.5, 0.7, 0.2], [0.4, 0.4, 0.4, 0.4], [0.8, 0.8, 0.8, 0.8]])
    p = Payoff(np.full(3, np.nan), np.array([3, 6, 0]), 15, widest=6, survival=survival)
    assert p.first_hit.tolist() == pytest.approx([0.9, 0.4, 0.0])
    table = np.array([p.accepted(m) for m in range(8)])  # past widest: the value at widest
    assert table[:, 0].tolist() == pytest.approx([0, 0.9, 1.4, 1.9, 1.9, 1.9, 1.9, 1.9])
    assert table[:, 1].tolist() == pytest.approx([0, 0.4, 0.8, 1.2, 1.6, 1.6, 1.6, 1.6])
    assert table[:, 2].tolist() == [0.0] * 8
    assert p.by_width(3)[:, 0].tolist() == pytest.approx([0.9, 1.4, 1.9])
    with pytest.raises(ValueError, match="survival curve of 3 rows for 2 drafts"):
        Payoff(np.zeros(2), np.array([3, 3]), 15, survival=survival)


def test_a_prediction_of_0_accepts_nothing_at_any_width():
    p = payoff([0.0], [5], cap=15)
    assert p.first_hit.tolist() == [0.0]
    assert [p.accepted(m)[0] for m in range(8)] == [0.0] * 8


def test_a_prediction_of_the_whole_draft_accepts_every_checked_token():
    # D = min(5, 15) = 5 and predicted 5: p = 1, so m checked tokens accept min(m, 5)
    p = payoff([5.0], [5], cap=15)
    assert p.first_hit.tolist() == pytest.approx([1.0])
    assert [p.accepted(m)[0] for m in range(8)] == pytest.approx([0, 1, 2, 3, 4, 5, 5, 5])
    # a gate trained at 3 nodes predicting 3 of a 20-token draft: p = 1 past the gate's width too
    p = payoff([3.0], [20], cap=3)
    assert [p.accepted(m)[0] for m in (1, 3, 7, 15)] == pytest.approx([1, 3, 7, 15])


def test_first_hit_and_accepted_tokens_by_hand():
    # a 1-token draft predicted 0.5: E_1(p) = p = 0.5
    p = payoff([0.5], [1], cap=3)
    assert p.first_hit.tolist() == pytest.approx([0.5])
    assert [p.accepted(m)[0] for m in (1, 3)] == pytest.approx([0.5, 0.5])  # nothing past the draft
    # a 4-token draft, a gate of 2 nodes predicting 0.75: p + p^2 = 0.75, p = 0.5;
    # then 4 checked tokens accept 0.5 + 0.25 + 0.125 + 0.0625
    p = payoff([0.75], [4], cap=2)
    assert p.first_hit.tolist() == pytest.approx([0.5], abs=1e-6)
    assert [p.accepted(m)[0] for m in range(5)] == pytest.approx([0, 0.5, 0.75, 0.875, 0.9375], abs=1e-6)


def test_nan_negative_or_no_draft_is_nothing_and_an_overstated_prediction_is_capped():
    p = payoff([np.nan, -2.0, 3.0, 9.0], [4, 4, 0, 2], cap=15)
    assert p.first_hit.tolist() == pytest.approx([0.0, 0.0, 0.0, 1.0])
    assert p.accepted(15).tolist() == pytest.approx([0.0, 0.0, 0.0, 2.0])  # predicted 9 of 2 tokens: both


def test_accepted_grows_with_width_by_less_than_one_token_a_node():
    lens = [15, 15, 15, 6, 3]
    p = payoff([0.4, 2.0, 7.5, 5.0, 1.2], lens, cap=15)
    table = np.array([p.accepted(m) for m in range(17)])  # [width, row]
    steps = np.diff(table, axis=0)
    assert np.all(steps >= 0) and np.all(steps <= 1 + 1e-12)
    assert table[15].tolist() == pytest.approx([0.4, 2.0, 7.5, 5.0, 1.2], abs=1e-3)  # E_D(p) = predicted back


def test_widths_can_differ_per_row():
    p = payoff([3.0, 0.5, 0.0], [3, 1, 4], cap=3)  # p = 1, 0.5, 0
    assert p.accepted(np.array([2, 1, 4])).tolist() == pytest.approx([2.0, 0.5, 0.0])
    assert p.accepted(np.array([0, 0, 0])).tolist() == [0.0, 0.0, 0.0]
    empty = payoff([], [], cap=3)
    assert empty.accepted(np.zeros(0, dtype=np.int64)).tolist() == [] and empty.first_hit.tolist() == []


def test_an_exact_payoff_accepts_what_the_chain_repeats():
    # replay's hvd_exact: each row's true accepted length, 9 of a 4-token draft capped at 4, nan nothing
    p = Payoff.exact(np.array([2.0, 0.0, np.nan, 9.0]), np.array([5, 3, 0, 4]), widest=15)
    assert p.first_hit.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert p.accepted(3).tolist() == [2.0, 0.0, 0.0, 3.0]
    assert p.accepted(np.array([1, 3, 5, 15])).tolist() == [1.0, 0.0, 0.0, 4.0]
    assert p.by_width(2).tolist() == [[1.0, 0.0, 0.0, 1.0], [2.0, 0.0, 0.0, 2.0]]
