"""Tensor parallelism: every TP rank verifies the rows TP rank 0 planned.

Only rank 0 drafts and runs the gate (one drafter, one gate, one CPU cost per server).
At every eligible step every rank calls ``broadcast_plans``: rank 0 sends its packed
plans (rows.pack_plans), or "EAGLE3 everywhere" when its HVD step failed, so no rank is
ever left waiting in the collective and all ranks write identical rows.
"""

from __future__ import annotations

import numpy as np
import torch

from sglang_hvd.decision import BatchPlan

from .rows import pack_plans, packed_width


def eagle3_everywhere(bs: int, num_draft_tokens: int) -> np.ndarray:
    """Packed plans that leave every row to EAGLE3."""
    plans = BatchPlan.all_eagle3(bs, num_draft_tokens - 1)
    return pack_plans(plans.cache_lens, plans.eagle_nodes, plans.cache_tokens, plans.cache_parents)


def broadcast_plans(packed: np.ndarray | None, bs: int, num_draft_tokens: int, group, rank: int,
                    device: torch.device | str = "cpu") -> np.ndarray:
    """Rank 0's plans ``[bs, packed_width(num_draft_tokens)]`` on every rank of ``group`` (SGLang's
    GroupCoordinator, or anything with ``broadcast(tensor, src=0)``); ``packed`` is
    ignored on the other ranks and may be None on rank 0 (its step failed)."""
    shape = (bs, packed_width(num_draft_tokens))
    if rank == 0:
        if packed is None or packed.shape != shape:
            packed = eagle3_everywhere(bs, num_draft_tokens)
        t = torch.from_numpy(np.ascontiguousarray(packed, dtype=np.int64)).to(device)
    else:
        t = torch.empty(shape, dtype=torch.int64, device=device)
    group.broadcast(t, src=0)
    return t.cpu().numpy()
