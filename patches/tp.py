"""Tensor parallelism: every TP rank verifies at the tier and with the rows TP rank 0 planned.

Only rank 0 drafts and runs the gate (one drafter, one gate, one CPU cost per server).
At every decode step every rank calls ``broadcast_step``: rank 0 sends the step's tier
(an index into the tiers every rank holds), whether EAGLE3 drafts, and its packed plans
(rows.pack_plans) in one tensor -- or "the served shape, EAGLE3 everywhere" when its HVD
step failed -- so no rank is ever left waiting in the collective, all ranks switch to
the same runtime state and write identical rows. (SGLang's own adaptive speculation
decides per rank and so refuses attention DP; HVD's decision is rank 0's, shared.)

The tensor: ``[bs + 1, 2 N]`` int64 for the served shape's N; row 0 is the header
``[tier, eagle3, 1]`` (``[tier, 1, 0]``: no plans), rows 1.. the plans, padded
with -1 past the tier's ``2 N_tier`` columns.
"""

from __future__ import annotations

import numpy as np
import torch

from sglang_hvd.tiers import Tier

from .rows import packed_width


def broadcast_step(tier: int, eagle3: bool, packed: np.ndarray | None, bs: int, served_nodes: int,
                   tiers: tuple[Tier, ...], group, rank: int,
                   device: torch.device | str = "cpu") -> tuple[int, bool, np.ndarray | None]:
    """Rank 0's ``(tier, eagle3, packed)`` on every rank of ``group`` (SGLang's
    GroupCoordinator, or anything with ``broadcast(tensor, src=0)``). On rank 0 ``packed``
    is ``[bs, packed_width(N of tiers[tier])]``, or None when its step failed (``tier``:
    then the served shape's, EAGLE3's rows as drafted); the other ranks' arguments are
    ignored. ``packed`` comes back None for no plans (EAGLE3's rows as drafted)."""
    width = packed_width(served_nodes)
    if rank == 0:
        host = np.full((bs + 1, width), -1, np.int64)
        if packed is None:
            host[0, :3] = (tier, 1, 0)
        else:
            host[0, :3] = (tier, int(eagle3), 1)
            host[1:, : packed.shape[1]] = packed
        t = torch.from_numpy(host).to(device)
    else:
        t = torch.empty((bs + 1, width), dtype=torch.int64, device=device)
    group.broadcast(t, src=0)
    got = t.cpu().numpy()
    tier, eagle3, has = (int(v) for v in got[0, :3])
    if not has:
        return tier, True, None
    return tier, bool(eagle3), np.ascontiguousarray(got[1:, : packed_width(tiers[tier].tokens_per_row)])
