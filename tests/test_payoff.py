"""The payoff model (sglang_hvd/payoff.py): the gate's one prediction -> expected accepted
tokens at any row width, E_m(p) = p + p^2 + ... + p^m with E_D(p) = predicted."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_hvd.payoff import Payoff, SurvivalTable


def payoff(predicted, lens, cap: int) -> Payoff:
    return Payoff(np.array(predicted, dtype=np.float64), np.array(lens, dtype=np.int64), cap)


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


def test_a_survival_table_is_fitted_by_cell_and_read_back():
    # 60 validation drafts of 6 tokens predicted 1.2 (one cell): 30 accept nothing, 18 one token, 12 all six;
    # 10 drafts predicted 5 (another cell, too few rows: left to the geometric model)
    pred = np.array([1.2] * 60 + [5.0] * 10)
    accepted = np.array([0] * 30 + [1] * 18 + [6] * 12 + [3] * 10)
    lens = np.full(70, 6)
    table = SurvivalTable.fit(pred, accepted, lens, widths=15)
    survival = table.lookup(np.array([1.2, 1.3, 5.0]), np.array([6, 7, 6]))
    assert survival[0].tolist() == pytest.approx([0.5, 0.2, 0.2, 0.2, 0.2, 0.2] + [0.0] * 9)
    assert survival[1].tolist() == survival[0].tolist()  # 1.3 and 7 tokens: the same cell ([1, 1.5), 6-7 tokens)
    assert np.isnan(survival[2]).all()
    assert int(table.rows.sum()) == 70
    assert table.describe() == "survival table, 1 of 135 cells"  # 15 prediction bins x 9 length bins
    back = SurvivalTable.from_json(table.to_json())
    np.testing.assert_array_equal(back.rows, table.rows)
    np.testing.assert_allclose(back.survival, table.survival)  # nan where nan
    with pytest.raises(ValueError, match="bins"):
        SurvivalTable.from_json({**table.to_json(), "length_edges": [1, 2]})
    bad = table.to_json()
    bad["survival"][7][5] = [1.5] * 15  # a probability above 1
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        SurvivalTable.from_json(bad)


def test_rows_in_a_fitted_cell_take_its_survival_and_the_others_the_geometric_model():
    table = SurvivalTable.fit(np.full(60, 1.2), np.array([0] * 30 + [1] * 18 + [6] * 12), np.full(60, 6), 15)
    # row 0 in the fitted cell; row 1 predicted 5 (no cell); row 2 no draft; row 3 in the cell, 3 tokens checked
    p = Payoff(np.array([1.2, 5.0, np.nan, 1.2]), np.array([6, 6, 0, 3]), 15, widest=15, survival=table)
    geometric = Payoff(np.array([1.2, 5.0, np.nan, 1.2]), np.array([6, 6, 0, 3]), 15, widest=15)
    assert p.first_hit[[0, 2]].tolist() == [0.5, 0.0] and p.first_hit[1] == geometric.first_hit[1]
    assert [p.accepted(m)[0] for m in (1, 2, 3, 6, 15)] == pytest.approx([0.5, 0.7, 0.9, 1.5, 1.5])
    assert [p.accepted(m)[1] for m in (1, 3, 15)] == [geometric.accepted(m)[1] for m in (1, 3, 15)]
    assert p.accepted(15)[2] == 0.0
    # row 3's cell is 3 tokens ([3, 4): the fit saw none: nan), so it keeps the geometric model
    assert p.accepted(3)[3] == geometric.accepted(3)[3]
