"""A cache draft's expected payoff at any row width, from the gate's one number.

The gate predicts a draft's accepted length at the width it was trained for (its row's
N-1 nodes, and never more than the draft). A tier of a narrower row checks fewer tokens,
and ``min(predicted, L)`` overstates what L nodes accept: a draft predicted at 3 is
often wholly wrong or long right, rarely exactly 3. The payoff model is geometric: the
draft's k-th token is accepted with probability p^k, so the expected accepted length
over m checked tokens is

  E_m(p) = p + p^2 + ... + p^m

and p is the one with E_D(p) = predicted, D = min(draft length, the gate's N-1).
Then L nodes accept E_min(L, length)(p) tokens: past the gate's width the same p
extrapolates. Checked on held-out tau-bench and SWE-agent
fleet replay (6,528 drafts, the recommended gate): at L = 1, 3, 7, 15 the model gives
0.461, 0.921, 1.322, 1.598 accepted tokens a draft against 0.460, 0.952, 1.417, 1.651
measured (``min(predicted, L)``: 0.668, 1.123, 1.452, 1.598).

A gate that learned its own curve (gate.json ``payoff_curve``: a second output, each
row's survival s_k = P(the draft's first k tokens are all accepted), k = 1..W, W its
row's N-1) is priced by it instead: L nodes accept s_1 + ... + s_min(L, length, W). The
survival is made non-increasing in k (a running minimum) before it is summed. On the
held-out drafts of the default task split (146,457, every behaviour policy's) its squared
error against the accepted tokens is 3.7-9.6% below the geometric model's at widths 1-4,
and fleet replay gains 0.1-1.7% tokens/s at every concurrency of three task splits
(docs/results.md, "the gate's payoff curve").

Computed by table: p by interpolation in an inverse table of E_D (per D, on a grid of
predicted / D), then E_m(p) for every m at once (a cumulative sum of powers), so a batch
costs a few vector operations and any number of widths is a lookup.
"""

from __future__ import annotations

import numpy as np

from .verify import MAX_TREE_NODES

_FRACTIONS = 1024  # grid of predicted / D in [0, 1]
_P = np.linspace(0.0, 1.0, 4097)
# E_D(p) / D on the p grid, for D = 1..MAX_TREE_NODES; increasing in p, 0 at p = 0 and 1 at p = 1
_E = np.cumsum(_P[None, :] ** np.arange(1, MAX_TREE_NODES + 1)[:, None], axis=0)
_F = np.linspace(0.0, 1.0, _FRACTIONS + 1)
# GEOMETRIC_INVERSE[D, j]: the p with E_D(p) = D * j / _FRACTIONS (row 0: no draft, p = 0)
GEOMETRIC_INVERSE = np.vstack([np.zeros(_FRACTIONS + 1)]
                               + [np.interp(_F, _E[d - 1] / d, _P) for d in range(1, MAX_TREE_NODES + 1)])


_WIDTHS = np.arange(1, MAX_TREE_NODES + 1)[:, None]


class Payoff:
    """The payoff model of a batch's cache drafts (one lookup per row, then any width)."""

    __slots__ = ("_rows", "_accepted", "first_hit")

    def __init__(self, predicted: np.ndarray, draft_lens: np.ndarray, cap: int, widest: int = MAX_TREE_NODES,
                 survival: np.ndarray | None = None):
        """``predicted``: the gate's accept_len per row (nan or <= 0: nothing), trained at
        ``cap`` (its row's N-1) nodes; ``draft_lens``: the rows' cache draft lengths;
        ``widest``: the most tokens a caller checks (the table stops there); ``survival``:
        ``[B, W]`` the gate's own curve where it learned one (then ``predicted`` is not read)."""
        lens = np.minimum(np.maximum(np.asarray(draft_lens, dtype=np.int64), 0), MAX_TREE_NODES)
        width = min(widest, MAX_TREE_NODES)
        self._rows = np.arange(len(lens))
        if survival is not None:
            self._of_survival(np.asarray(survival, dtype=np.float64), lens, width)
            return
        pred = np.asarray(predicted, dtype=np.float64)
        d = np.minimum(lens, cap)
        # predicted / D in [0, 1] (fmax and fmin take nan as missing: nothing)
        f = np.fmin(np.fmax(pred / np.maximum(d, 1), 0.0), 1.0) * _FRACTIONS
        j = np.minimum(f.astype(np.int64), _FRACTIONS - 1)
        w = f - j
        p = np.where(d > 0, GEOMETRIC_INVERSE[d, j] * (1 - w) + GEOMETRIC_INVERSE[d, j + 1] * w, 0.0)
        self.first_hit = p  # P(the draft's first token is accepted), per row (0: no draft)
        # _accepted[m, i] = E_min(m, L_i)(p_i) = p_i + ... + p_i^min(m, L_i), m = 0..width: a row's
        # powers past its draft are 0, so its value stays at its whole draft's
        acc = np.zeros((width + 1, len(p)))
        if width:
            powers = acc[1:]
            powers[:] = p
            np.cumprod(powers, axis=0, out=powers)
            powers[_WIDTHS[:width] > lens] = 0.0
            np.cumsum(powers, axis=0, out=powers)
        self._accepted = acc

    def _of_survival(self, survival: np.ndarray, lens: np.ndarray, width: int) -> None:
        """The learned curve (finite, in [0, 1]: a gate's sigmoid; decision.predictions refuses
        non-finite values): s_k made non-increasing, 0 past a row's draft and past W."""
        b, w = survival.shape
        if b != len(lens):
            raise ValueError(f"survival curve of {b} rows for {len(lens)} drafts")
        s = np.minimum.accumulate(survival, axis=1)
        acc = np.zeros((width + 1, b))
        k = min(width, w)
        if k:
            hits = acc[1 : k + 1]
            hits[:] = s[:, :k].T
            hits[_WIDTHS[:k] > lens] = 0.0
            rest = acc[1:]
            np.cumsum(rest, axis=0, out=rest)  # past W: each row's value at W
        self.first_hit = acc[1] if width else np.zeros(b)
        self._accepted = acc

    @classmethod
    def exact(cls, accepted: np.ndarray, draft_lens: np.ndarray, widest: int = MAX_TREE_NODES) -> Payoff:
        """Each row's payoff when its true accepted length ``accepted`` is known (replay's
        reference, by_load's hvd_exact): c checked tokens accept min(c, accepted), and the
        first is accepted with probability 1 or 0."""
        a = np.minimum(np.nan_to_num(np.asarray(accepted, dtype=np.float64), nan=0.0),
                       np.asarray(draft_lens, dtype=np.int64))
        self = cls.__new__(cls)
        self.first_hit = (a >= 1).astype(np.float64)
        width = min(widest, MAX_TREE_NODES)
        self._accepted = np.minimum(np.arange(width + 1)[:, None], np.maximum(a, 0.0)[None, :])
        self._rows = np.arange(len(a))
        return self

    def accepted(self, widths) -> np.ndarray:
        """Expected accepted tokens per row when ``widths`` (one, one per row, or ``[k, B]``)
        of its draft's tokens are checked (past its draft, its whole draft's; past
        ``widest``, the value at ``widest``)."""
        return self._accepted[np.minimum(widths, len(self._accepted) - 1), self._rows]

    def by_width(self, m: int) -> np.ndarray:
        """``[m, B]``: row c - 1 holds each row's E_min(c, L)(p), c = 1..m (m <= ``widest``)."""
        return self._accepted[1:m + 1]
