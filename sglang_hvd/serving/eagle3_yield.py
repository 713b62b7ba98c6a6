"""EAGLE3's yield as served: the gate's curve, scaled by the acceptance the verifies show.

The cost rule (cost_rule.CostRule) values an EAGLE3 row at a tier by the EAGLE3 curve
(verify.Eagle3Curve: tokens per verify by draft nodes), taken from gate.json. The
deployment's real draft model may do better or worse. The stepper hands every verified
EAGLE3-only row here (its draft nodes, and the tokens it emitted: accepted + the bonus),
and the served curve is the gate's with every point's gain over the bonus token scaled by
one factor: ``tokens(m) = 1 + scale * (gate(m) - 1)``, where ``scale`` is the rows' gain
(tokens - 1) over the gain the gate's curve expected of them at their node counts, both
weighted alike. The weights start with shrinkage: the first row's expected gain stands in
for ``prior_rows`` rows of a scale of 1 (one row moves the scale a little, ``prior_rows``
rows halfway to what they show); once a new row's weight would fall below ``alpha``, both
become exponentially weighted means (the newest ~1/alpha rows count). A draft model that
accepts nothing is priced so after a few dozen rows, at every width at once.

One factor, not a point per width: the curve keeps the gate's shape (a wider row never
yields less), every row informs every width, and a mix of widths whose draws share one
request's stream (replay's Eagle3Stream carries its fraction across widths) is read
without bias, since only the rows' total is compared with what the curve expected.

Rows whose cache branch lost to EAGLE3's (two-branch rows) are left out: they are the
rows where the cache guessed wrong, not a fair sample of EAGLE3's rows.

Worked example: the gate's curve 1:1.45,3:1.75,15:2.1, prior_rows 20; 40 rows at 1 node
emit 1.0 token each -> gain 20 * 0.45 / 60 = 0.15 against an expected 0.45: scale 1/3, the
served curve 1:1.15,3:1.25,15:1.3667.
"""

from __future__ import annotations

from ..verify import MAX_TREE_NODES, Eagle3Curve


class Eagle3Yield:
    def __init__(self, base: Eagle3Curve, prior_rows: int = 20, alpha: float = 0.01, tolerance: float = 0.02):
        if prior_rows < 0 or not 0.0 < alpha <= 1.0 or not 0.0 <= tolerance < 1.0:
            raise ValueError(f"prior_rows must be >= 0, alpha in (0, 1] and tolerance in [0, 1), got {prior_rows}, "
                             f"{alpha} and {tolerance}")
        self.base = base
        self.prior_rows = prior_rows
        self.alpha = alpha
        self.tolerance = tolerance  # stale(): the scale moved by more than this fraction since the last curve()
        self.rows = 0  # EAGLE3-only rows observed
        self._gain = 0.0  # weighted mean tokens - 1 of the rows
        self._expected = 0.0  # weighted mean gate(nodes) - 1 of the same rows
        self._served = 1.0  # the scale of the last curve()
        self._by_nodes = base.tokens_upto(MAX_TREE_NODES)  # the gate's tokens at 0..MAX_TREE_NODES nodes

    def observe(self, nodes: int, tokens: int) -> None:
        """One EAGLE3-only row of ``nodes`` draft nodes that emitted ``tokens`` (>= 1)."""
        if nodes <= 0:
            return
        expected = (self._by_nodes[nodes] if nodes < len(self._by_nodes) else self.base.tokens(nodes)) - 1.0
        if not self.rows:
            self._gain = self._expected = expected  # the prior: the gate's curve as it is
        self.rows += 1
        # the prior weighs prior_rows rows; past 1 / alpha rows in all, the newest row weighs alpha
        w = max(1.0 / (self.rows + self.prior_rows), self.alpha)
        self._gain += w * (tokens - 1.0 - self._gain)
        self._expected += w * (expected - self._expected)

    def scale(self) -> float:
        """The rows' gain over the gain the gate's curve expected of them (1.0 before any row)."""
        return self._gain / self._expected if self.rows and self._expected > 0 else 1.0

    def stale(self) -> bool:
        """Whether the scale moved by more than ``tolerance`` of itself since the last curve()."""
        return abs(self.scale() - self._served) > self.tolerance * max(self._served, 0.05)

    def curve(self) -> Eagle3Curve:
        s = self._served = self.scale()
        if s == 1.0:
            return self.base
        return Eagle3Curve(tuple((m, 1.0 + s * (t - 1.0)) for m, t in self.base.points))
