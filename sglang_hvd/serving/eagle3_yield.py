"""EAGLE3's yield as served: the gate's curve, refreshed from the acceptance the verifies show.

The cost rule (cost_rule.CostRule) values an EAGLE3 row at a tier by the EAGLE3 curve
(verify.Eagle3Curve: tokens per verify by draft nodes), taken from gate.json. The
deployment's real draft model may do better or worse, and differently at each width. The
stepper hands every verified EAGLE3-only row here (its draft nodes, and the tokens it
emitted: accepted + the bonus); once a node count has ``min_rows`` rows, its point of the
served curve becomes their exponentially weighted mean (weight ``alpha`` per row, so the
newest ~1/alpha rows count), and ``curve()`` returns the gate's curve with those points put
in, made non-decreasing (a wider row never yields less).

Rows whose cache branch lost to EAGLE3's (two-branch rows) are left out: they are the
rows where the cache guessed wrong, not a fair sample of EAGLE3's rows.

Worked example: the gate's curve 1:1.45,3:1.75,15:2.1; 300 rows at 3 nodes emit 2.05
tokens on average -> the served curve 1:1.45,3:2.05,15:2.1.
"""

from __future__ import annotations

from ..verify import Eagle3Curve


class Eagle3Yield:
    def __init__(self, base: Eagle3Curve, min_rows: int = 200, alpha: float = 0.01):
        if min_rows < 1 or not 0.0 < alpha <= 1.0:
            raise ValueError(f"min_rows must be >= 1 and alpha in (0, 1], got {min_rows} and {alpha}")
        self.base = base
        self.min_rows = min_rows
        self.alpha = alpha
        self._mean: dict[int, float] = {}  # nodes -> weighted mean tokens per verify
        self._rows: dict[int, int] = {}
        self.version = 0  # observations since the last curve()

    def observe(self, nodes: int, tokens: int) -> None:
        """One EAGLE3-only row of ``nodes`` draft nodes that emitted ``tokens`` (>= 1)."""
        if nodes <= 0:
            return
        n = self._rows.get(nodes, 0) + 1
        self._rows[nodes] = n
        # the plain mean until min_rows, then an exponentially weighted one
        w = 1.0 / n if n <= self.min_rows else self.alpha
        self._mean[nodes] = self._mean.get(nodes, 0.0) * (1.0 - w) + tokens * w
        self.version += 1

    def observed(self) -> dict[int, float]:
        """The node counts with enough rows, and their mean tokens per verify."""
        return {m: self._mean[m] for m, n in sorted(self._rows.items()) if n >= self.min_rows}

    def curve(self) -> Eagle3Curve:
        seen = self.observed()
        if not seen:
            return self.base
        points = dict(self.base.points)
        points.update(seen)
        out, best = [], 1.0
        for m in sorted(points):
            best = max(best, points[m])
            out.append((m, best))
        return Eagle3Curve(tuple(out))
