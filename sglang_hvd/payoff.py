"""A cache draft's expected payoff at any row width, from the gate's one number.

The gate predicts a draft's accepted length at the width it was trained for (its row's
N-1 nodes, and never more than the draft). A tier of a narrower row checks fewer tokens,
and ``min(predicted, L)`` overstates what L nodes accept: a draft predicted at 3 is
often wholly wrong or long right, rarely exactly 3. The payoff model is geometric: the
draft's k-th token is accepted with probability p^k, so the expected accepted length
over m checked tokens is

  E_m(p) = p + p^2 + ... + p^m

and p is the one with E_D(p) = predicted, D = min(draft length, the gate's N-1).
Then L nodes accept E_min(L, D)(p) tokens. Checked on held-out tau-bench and SWE-agent
fleet replay (6,528 drafts, the recommended gate): at L = 1, 3, 7, 15 the model gives
0.461, 0.921, 1.322, 1.598 accepted tokens a draft against 0.460, 0.952, 1.417, 1.651
measured (``min(predicted, L)``: 0.668, 1.123, 1.452, 1.598).

Computed by table: ``E[m, j]`` on a grid of p, p found by bisection per row and
interpolated, so a batch costs a few vector operations.
"""

from __future__ import annotations

import numpy as np

from .verify import MAX_TREE_NODES

_GRID = np.linspace(0.0, 1.0, 2049)
# _TABLE[m, j] = sum_{k=1..m} p_j^k, m = 0..MAX_TREE_NODES
_TABLE = np.concatenate([np.zeros((1, len(_GRID))),
                         np.cumsum(_GRID[None, :] ** np.arange(1, MAX_TREE_NODES + 1)[:, None], axis=0)])
_STEPS = int(np.log2(len(_GRID) - 1))


class Payoff:
    """The payoff model of a batch's cache drafts (one bisection per step, then any width)."""

    __slots__ = ("_d", "_lo", "_hi", "_t")

    def __init__(self, predicted: np.ndarray, draft_lens: np.ndarray, cap: int):
        """``predicted``: the gate's accept_len per row (nan or <= 0: nothing), trained at
        ``cap`` (its row's N-1) nodes; ``draft_lens``: the rows' cache draft lengths."""
        pred = np.nan_to_num(np.asarray(predicted, dtype=np.float64), nan=0.0)
        d = np.clip(np.minimum(np.asarray(draft_lens, dtype=np.int64), cap), 0, MAX_TREE_NODES)
        x = np.clip(pred, 0.0, np.maximum(d - 1e-9, 0.0))
        lo = np.zeros(len(x), dtype=np.int64)
        hi = np.full(len(x), len(_GRID) - 1, dtype=np.int64)
        for _ in range(_STEPS):  # the largest lo with E_D(p_lo) <= x
            mid = (lo + hi) // 2
            below = _TABLE[d, mid] <= x
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
        e_lo, e_hi = _TABLE[d, lo], _TABLE[d, hi]
        gap = e_hi - e_lo
        self._d, self._lo, self._hi = d, lo, hi
        self._t = np.where(gap > 0, (x - e_lo) / np.where(gap > 0, gap, 1.0), 0.0)

    def accepted(self, widths) -> np.ndarray:
        """Expected accepted tokens per row when ``widths`` (one, or one per row) of its
        draft's tokens are checked."""
        m = np.clip(np.minimum(np.asarray(widths, dtype=np.int64), self._d), 0, MAX_TREE_NODES)
        lo, hi = _TABLE[m, self._lo], _TABLE[m, self._hi]
        return np.where(self._d > 0, lo + self._t * (hi - lo), 0.0)

    @property
    def first_hit(self) -> np.ndarray:
        """P(the draft's first token is accepted) = p per row (0: no draft)."""
        lo, hi = _GRID[self._lo], _GRID[self._hi]
        return np.where(self._d > 0, lo + self._t * (hi - lo), 0.0)


def expected_accepted(predicted: np.ndarray, draft_lens: np.ndarray, cap: int, widths) -> np.ndarray:
    """``Payoff(predicted, draft_lens, cap).accepted(widths)``."""
    return Payoff(predicted, draft_lens, cap).accepted(widths)
