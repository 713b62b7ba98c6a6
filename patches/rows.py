"""Put chosen cache drafts into the EAGLE3 verify input, in place.

With ``--speculative-eagle-topk 1`` the verify input's ``draft_token`` is a flat
``[bs * N]`` tensor: row i is ``[last verified token, d_1 .. d_{N-1}]``. A row that
verifies its cache draft gets the draft's first ``min(len, N-1)`` tokens in columns
1.. and keeps the rest of its EAGLE3 tokens: whatever follows the cache draft is simply
rejected by the greedy verify if wrong, so the output is unchanged (lossless).

Worked example (bs=2, N=4): draft_token = [5, 11, 12, 13,  7, 21, 22, 23], row 1 uses
the cache draft (40, 41) -> [5, 11, 12, 13,  7, 40, 41, 23].
"""

from __future__ import annotations

import numpy as np
import torch


def substitute_rows(draft_token: torch.Tensor, num_draft_tokens: int, use_cache: np.ndarray,
                    cache_tokens: np.ndarray, cache_lens: np.ndarray) -> int:
    """Overwrite rows in place; returns how many rows took a cache draft.

    draft_token [bs * N] (any integer dtype, any device); use_cache [bs] bool;
    cache_tokens [bs, N-1] int; cache_lens [bs] (tokens of each draft that fit).
    """
    n = num_draft_tokens
    bs = draft_token.numel() // n
    if use_cache.shape != (bs,) or cache_tokens.shape != (bs, n - 1):
        raise ValueError(f"expected use_cache [{bs}] and cache_tokens [{bs}, {n - 1}], got {use_cache.shape} and {cache_tokens.shape}")
    take = use_cache & (cache_lens > 0)
    if not take.any():
        return 0
    rows = draft_token.view(bs, n)[:, 1:]
    mask = take[:, None] & (np.arange(n - 1)[None, :] < cache_lens[:, None])
    dev = draft_token.device
    new = torch.from_numpy(np.where(mask, cache_tokens, 0)).to(device=dev, dtype=draft_token.dtype, non_blocking=True)
    rows.copy_(torch.where(torch.from_numpy(mask).to(dev, non_blocking=True), new, rows))
    return int(take.sum())
