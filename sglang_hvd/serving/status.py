"""HVD's state across a fleet: the ``hvd`` blocks of SGLang's ``/server_info``.

Each scheduler with an HVD worker (one per data-parallel rank; TP rank 0 of each)
reports its stepper's figures and the gate it serves under ``internal_states[i]["hvd"]``
(patches/worker.py ``hvd_stats``). ``fleet_status`` takes the ``/server_info`` payloads
of one or more servers (the replicas behind a router) and returns one row per rank, the
totals (rates recomputed from the summed counts, so a busy rank weighs more), and
whether every rank serves the same gate, decision, threshold, EAGLE3 reserve and verify
shape.

Worked example: rank 0 judged 100 rows, 40 with a cache branch that accepted 120 cache
tokens (2 rows' EAGLE3 branch won instead); rank 1 judged 300 rows, 60 cache rows, 150
accepted. Totals: cache pick rate 100 / 400 = 0.25, cache mean accept
270 / (100 - 2) = 2.76.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

# What every replica of a fleet should agree on.
GATE_KEYS = ("gate_digest", "decision", "gate_threshold", "gate_eagle_reserve", "gate_cache_siblings", "verify_shape")
SUMMED = ("steps", "rows", "cache_rows", "two_branch_rows", "tree_rows", "sibling_wins", "eagle3_branch_wins",
          "cache_accepted", "eagle3_verifies", "eagle3_accepted", "plain_rows", "cpu_us_total", "gate_errors",
          "step_errors", "recorded_dropped", "recorded_failed")


@dataclasses.dataclass(frozen=True, slots=True)
class RankStatus:
    server: str
    dp_rank: int
    hvd: Mapping  # the rank's hvd block as reported


@dataclasses.dataclass(frozen=True, slots=True)
class FleetStatus:
    ranks: tuple[RankStatus, ...]
    servers_without_hvd: tuple[str, ...]
    totals: Mapping[str, float]
    disagreements: tuple[str, ...]  # "gate_digest: a (s1 rank 0) != b (s2 rank 0)"

    @property
    def consistent(self) -> bool:
        return not self.disagreements and not self.servers_without_hvd

    def to_json(self) -> dict:
        return {"ranks": [{"server": r.server, "dp_rank": r.dp_rank, **r.hvd} for r in self.ranks],
                "servers_without_hvd": list(self.servers_without_hvd), "totals": dict(self.totals),
                "disagreements": list(self.disagreements), "consistent": self.consistent}


def rates(counts: Mapping[str, float]) -> dict[str, float]:
    """The rates HVDStepper.summary reports, from its counts (one rank's or a sum)."""
    rows, cache_rows = counts.get("rows", 0), counts.get("cache_rows", 0)
    wins = counts.get("eagle3_branch_wins", 0)
    return {
        "cache_pick_rate": cache_rows / max(rows, 1),
        "two_branch_rate": counts.get("two_branch_rows", 0) / max(rows, 1),
        "cache_mean_accept": counts.get("cache_accepted", 0) / max(cache_rows - wins, 1),
        "eagle3_mean_accept": counts.get("eagle3_accepted", 0) / max(counts.get("eagle3_verifies", 0), 1),
        "cpu_us_per_step": counts.get("cpu_us_total", 0.0) / max(counts.get("steps", 0), 1),
    }


def fleet_status(infos: Sequence[tuple[str, Mapping]]) -> FleetStatus:
    """``infos``: (server name, its /server_info JSON) per server."""
    ranks, without = [], []
    for server, info in infos:
        found = [s["hvd"] for s in info.get("internal_states") or []
                 if isinstance(s, Mapping) and isinstance(s.get("hvd"), Mapping)]
        if not found:
            without.append(server)
        ranks += [RankStatus(server, int(h.get("dp_rank", i)), h) for i, h in enumerate(found)]
    counts = {k: sum(float(r.hvd.get(k, 0) or 0) for r in ranks) for k in SUMMED}
    totals = {**{k: (int(v) if k != "cpu_us_total" else v) for k, v in counts.items()}, **rates(counts),
              "ranks": len(ranks), "servers": len(infos)}
    disagreements = []
    for key in GATE_KEYS:
        values = {}
        for r in ranks:
            values.setdefault(str(r.hvd.get(key)), []).append(f"{r.server} rank {r.dp_rank}")
        if len(values) > 1:
            disagreements.append(f"{key}: " + " != ".join(f"{v} ({', '.join(where)})" for v, where in values.items()))
    return FleetStatus(tuple(ranks), tuple(without), totals, tuple(disagreements))
