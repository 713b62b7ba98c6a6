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

A gate trained with this version also carries a survival table (``SurvivalTable``,
gate.json ``payoff``), fitted on its validation rows: P(accepted >= k) for k = 1..N-1 by
bin of its prediction and of the draft's length. A row whose cell held enough rows
takes its cell's survival instead of the geometric p^k: E_c = S_1 + ... + S_c, and the
first token's hit rate is S_1 (the geometric model's p^k spreads a bimodal draft --
often wholly wrong, sometimes long right -- too evenly: it overstates the first tokens
of a draft predicted at a few, whose narrow-tier value the cost rule weighs under load).

Computed by table: p by interpolation in an inverse table of E_D (per D, on a grid of
predicted / D), then E_m(p) for every m at once (a cumulative sum of powers), so a batch
costs a few vector operations and any number of widths is a lookup.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .verify import MAX_TREE_NODES

_FRACTIONS = 1024  # grid of predicted / D in [0, 1]
_P = np.linspace(0.0, 1.0, 4097)
# E_D(p) / D on the p grid, for D = 1..MAX_TREE_NODES; increasing in p, 0 at p = 0 and 1 at p = 1
_E = np.cumsum(_P[None, :] ** np.arange(1, MAX_TREE_NODES + 1)[:, None], axis=0)
_F = np.linspace(0.0, 1.0, _FRACTIONS + 1)
# _INVERSE[D, j]: the p with E_D(p) = D * j / _FRACTIONS (row 0: no draft, p = 0)
_INVERSE = np.vstack([np.zeros(_FRACTIONS + 1)]
                     + [np.interp(_F, _E[d - 1] / d, _P) for d in range(1, MAX_TREE_NODES + 1)])


_WIDTHS = np.arange(1, MAX_TREE_NODES + 1)[:, None]

# SurvivalTable's bins (searchsorted right): predicted accept_len (15 bins: < 0.05, [0.05, 0.1), ..., >= 11)
# and the draft's length min(L, N-1) (9 bins: 0, 1, 2, 3, 4-5, 6-7, 8-11, 12-14, >= 15), fixed, not fitted
PREDICTED_EDGES = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 11.0)
LENGTH_EDGES = (1, 2, 3, 4, 6, 8, 12, 15)
MIN_CELL_ROWS = 50  # a cell with fewer validation rows leaves its rows to the geometric model


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class SurvivalTable:
    """P(a draft's accepted length >= k), k = 1..K (K: the gate's N-1 nodes), by bin of the
    gate's prediction and of the draft's length (PREDICTED_EDGES, LENGTH_EDGES), fitted on
    validation rows (``fit``); nan where a cell held fewer than MIN_CELL_ROWS rows.

    Worked example: 60 validation drafts of 6-7 tokens predicted in [1, 1.5), 30 of them
    accepting nothing, 18 exactly 1 token, 12 all 6 (a mean of 1.5): S = (0.5, 0.2, 0.2,
    0.2, 0.2, 0.2, 0, ...), so 1 node is worth 0.5 tokens and 3 nodes 0.9; the geometric
    model of 1.5 at 6 tokens (p = 0.61) says 0.61 and 1.22."""

    survival: np.ndarray  # [predicted bins, length bins, K] float64, nan: too few rows
    rows: np.ndarray  # [predicted bins, length bins] int64 validation rows per cell

    @property
    def widths(self) -> int:
        return self.survival.shape[2]

    @staticmethod
    def cells(predicted: np.ndarray, draft_lens: np.ndarray, widths: int) -> tuple[np.ndarray, np.ndarray]:
        pred = np.nan_to_num(np.asarray(predicted, dtype=np.float64), nan=0.0)
        return (np.searchsorted(PREDICTED_EDGES, pred, side="right"),
                np.searchsorted(LENGTH_EDGES, np.minimum(draft_lens, widths), side="right"))

    @classmethod
    def fit(cls, predicted: np.ndarray, accepted: np.ndarray, draft_lens: np.ndarray, widths: int) -> SurvivalTable:
        """From validation rows: the gate's predictions, their labels (accepted tokens, at most
        ``widths``) and their drafts' lengths."""
        if widths < 1:
            raise ValueError(f"a survival table needs >= 1 width, got {widths}")
        a, b = cls.cells(predicted, draft_lens, widths)
        hits = (np.asarray(accepted)[:, None] >= np.arange(1, widths + 1)[None, :]).astype(np.float64)
        total = np.zeros((len(PREDICTED_EDGES) + 1, len(LENGTH_EDGES) + 1, widths))
        rows = np.zeros(total.shape[:2], dtype=np.int64)
        np.add.at(total, (a, b), hits)
        np.add.at(rows, (a, b), 1)
        survival = np.where((rows >= MIN_CELL_ROWS)[..., None], total / np.maximum(rows, 1)[..., None], np.nan)
        return cls(survival, rows)

    def describe(self) -> str:
        """What /server_info says of it: ``survival table, 84 of 135 cells`` (the cells of at
        least MIN_CELL_ROWS validation rows, which price their rows)."""
        return f"survival table, {int((self.rows >= MIN_CELL_ROWS).sum())} of {self.rows.size} cells"

    def lookup(self, predicted: np.ndarray, draft_lens: np.ndarray) -> np.ndarray:
        """``[B, K]`` each row's survival (a row of nan: its cell has too few rows)."""
        a, b = self.cells(predicted, draft_lens, self.widths)
        return self.survival[a, b]

    def to_json(self) -> dict:
        return {"predicted_edges": list(PREDICTED_EDGES), "length_edges": list(LENGTH_EDGES),
                "min_cell_rows": MIN_CELL_ROWS, "rows": self.rows.tolist(),
                "survival": [[None if np.isnan(c[0]) else [round(float(x), 6) for x in c] for c in row]
                             for row in self.survival]}

    @classmethod
    def from_json(cls, d: dict) -> SurvivalTable:
        """Raises ValueError for a table of other bins or of a malformed shape."""
        if (tuple(d["predicted_edges"]) != PREDICTED_EDGES or tuple(d["length_edges"]) != LENGTH_EDGES):
            raise ValueError("its bins are not this version's (retrain the gate with `hvd train`)")
        rows = np.asarray(d["rows"], dtype=np.int64)
        cells = d["survival"]
        shape = (len(PREDICTED_EDGES) + 1, len(LENGTH_EDGES) + 1)
        widths = max((len(c) for row in cells for c in row if c is not None), default=0)
        if rows.shape != shape or len(cells) != shape[0] or any(len(row) != shape[1] for row in cells) or not widths:
            raise ValueError(f"expected {shape[0]} x {shape[1]} cells with survivals")
        survival = np.full(shape + (widths,), np.nan)
        for i, row in enumerate(cells):
            for j, c in enumerate(row):
                if c is not None:
                    if len(c) != widths or not all(0.0 <= float(x) <= 1.0 for x in c):
                        raise ValueError(f"cell ({i}, {j}): {widths} survivals in [0, 1] expected")
                    survival[i, j] = c
        return cls(survival, rows)


class Payoff:
    """The payoff model of a batch's cache drafts (one lookup per row, then any width)."""

    __slots__ = ("_rows", "_accepted", "first_hit")

    def __init__(self, predicted: np.ndarray, draft_lens: np.ndarray, cap: int, widest: int = MAX_TREE_NODES,
                 survival: SurvivalTable | None = None):
        """``predicted``: the gate's accept_len per row (nan or <= 0: nothing), trained at
        ``cap`` (its row's N-1) nodes; ``draft_lens``: the rows' cache draft lengths;
        ``widest``: the most tokens a caller checks (the table stops there); ``survival``:
        the gate's survival table (rows in its fitted cells take it)."""
        pred = np.asarray(predicted, dtype=np.float64)
        lens = np.minimum(np.maximum(np.asarray(draft_lens, dtype=np.int64), 0), MAX_TREE_NODES)
        d = np.minimum(lens, cap)
        # predicted / D in [0, 1] (fmax and fmin take nan as missing: nothing)
        f = np.fmin(np.fmax(pred / np.maximum(d, 1), 0.0), 1.0) * _FRACTIONS
        j = np.minimum(f.astype(np.int64), _FRACTIONS - 1)
        w = f - j
        p = np.where(d > 0, _INVERSE[d, j] * (1 - w) + _INVERSE[d, j + 1] * w, 0.0)
        self.first_hit = p  # P(the draft's first token is accepted), per row (0: no draft)
        width = min(widest, MAX_TREE_NODES)
        # _accepted[m, i] = E_min(m, L_i)(p_i) = p_i + ... + p_i^min(m, L_i), m = 0..width: a row's
        # powers past its draft are 0, so its value stays at its whole draft's
        acc = np.zeros((width + 1, len(p)))
        if width:
            powers = acc[1:]
            powers[:] = p
            np.cumprod(powers, axis=0, out=powers)
            if survival is not None:
                judged = (d > 0) & np.isfinite(pred)
                self._survive(powers, np.where(judged[:, None], survival.lookup(pred, lens), np.nan), p)
            powers[_WIDTHS[:width] > lens] = 0.0
            np.cumsum(powers, axis=0, out=powers)
        self._rows, self._accepted = np.arange(len(p)), acc

    def _survive(self, powers: np.ndarray, s: np.ndarray, p: np.ndarray) -> None:
        """Rows with a survival ``s`` [B, K] take it in ``powers`` [width, B] (past K: S_K x p^(k - K))."""
        have = np.flatnonzero(~np.isnan(s[:, 0]))
        if not len(have):
            return
        k = min(s.shape[1], len(powers))
        powers[:k, have] = s[have, :k].T
        if len(powers) > k:
            powers[k:, have] = s[have, k - 1] * p[have] ** np.arange(1, len(powers) - k + 1)[:, None]
        self.first_hit = self.first_hit.copy()
        self.first_hit[have] = s[have, 0]

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
