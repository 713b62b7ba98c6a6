"""Write row plans (sglang_hvd/policy.py) into SGLang's EAGLE3 verify input, in place.

Everything happens on the verify input's device with tensor ops (no host sync: the plan
reaches the device in one copy from a pinned staging buffer) and no tensor changes
shape, so CUDA graphs captured for the verify stay valid.

topk 1 (``substitute_chains``): a row is ``[root, d_1 .. d_{N-1}]``, a chain whose
positions and causal mask fit any chain, so a cache row only overwrites tokens 1..L; the
rest keep EAGLE3's tokens (rejected by the greedy verify if wrong: lossless).
Worked example (bs=2, N=4): draft_token = [5, 11, 12, 13,  7, 21, 22, 23], row 1 takes
the cache draft (40, 41) -> [5, 11, 12, 13,  7, 40, 41, 23].

topk > 1 (``rewrite_tree_rows``): a row's tree is given by ``draft_token``,
``positions``, the first-child / next-sibling links ``retrieve_next_token`` /
``retrieve_next_sibling`` and its block of ``custom_mask`` (node x may attend to node c:
the root, its ancestors and itself). A row with plan (L cache tokens, M EAGLE3 nodes)
becomes, node by node:

  0            the root, unchanged; its first child becomes node M+1 (the cache branch
               is tried first)
  1 .. M       EAGLE3's first M nodes, unchanged. SGLang sorts the selected candidates
               by index and a parent's index is below its children's, so they form a
               subtree; links to nodes > M are cut. Their mask rows name only ancestors
               (< M), so they need no change.
  M+1 .. M+L   the cache chain: token d_k at depth k (position root + k), next token
               the following chain node, mask root + chain nodes up to itself; node
               M+1's next sibling is EAGLE3's first child (if kept)
  M+L+1 ..     unused: no link reaches them; mask root + itself, position root + 1

Worked example (N = 6, plan L = 2, M = 3; EAGLE3 tree 0->{1, 2}, 1->{3}, 2->{4},
4->{5}): next_token [1, 3, 4, -1, 5, -1] -> [4, 3, -1, -1, 5, -1], next_sibling
[-1, 2, -1, -1, -1, -1] -> [-1, 2, -1, -1, 1, -1]; nodes 4, 5 hold the cache tokens at
depths 1, 2 (mask rows 4: {0, 4}, 5: {0, 4, 5}); EAGLE3's node 4 (child of 2) and 5 are
gone, its nodes 1, 2, 3 stay.

SGLang accepts at most ``max_tree_depth`` tokens per row (``spec_steps + 1`` for EAGLE
trees), so a longer cache chain would be cut at the EAGLE3 step count: ``widen`` gives
the verify input an accept width of N (as SGLang's NGRAM verify input does). For topk
> 1 SGLang then moves the accepted path's KV, predictions and hidden states to the row
front (``_finalize_accept_tree_path``), so EAGLE3's draft extend sees a chain.

Mask layouts (sglang.kernels.ops.speculative.spec_tree.TreeMaskMode): QLEN_ONLY holds
an N x N block per request, back to back; FULL_MASK holds N rows of (seq_len + N)
columns per request, back to back, the draft columns last (request b starts at
N*N*b + N*sum(seq_len[:b])). seq_len is the root's position.
"""

from __future__ import annotations

import numpy as np
import torch
from sglang.srt.speculative.eagle_info import EagleVerifyInput

QLEN_ONLY, FULL_MASK = 1, 0  # TreeMaskMode values


class Staging:
    """A reusable host buffer for the plan's one host-to-device copy: pinned on CUDA, so
    ``non_blocking`` really is asynchronous (a pageable copy waits for the stream).
    Safe to reuse each step: the previous copy finished before the scheduler read the
    previous step's accepted lengths on the host."""

    def __init__(self):
        self._buf: torch.Tensor | None = None

    def upload(self, host: np.ndarray, device: torch.device) -> torch.Tensor:
        host = np.ascontiguousarray(host, dtype=np.int64)
        if device.type == "cpu":
            return torch.from_numpy(host.copy())
        n = host.size
        if self._buf is None or self._buf.numel() < n:
            self._buf = torch.empty(max(n, 1024), dtype=torch.int64, pin_memory=True)
        view = self._buf[:n]
        view.numpy()[:] = host.reshape(-1)
        return view.to(device, non_blocking=True).view(host.shape)


def pack_plans(cache_lens: np.ndarray, eagle_nodes: np.ndarray, cache_tokens: np.ndarray) -> np.ndarray:
    """``[bs, 2 + (N-1)]`` int64: L, M and the cache tokens of each row (also what the TP
    broadcast carries)."""
    return np.concatenate([cache_lens[:, None], eagle_nodes[:, None], cache_tokens], axis=1).astype(np.int64)


def unpack_plans(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return packed[:, 0], packed[:, 1], packed[:, 2:]


def substitute_chains(draft_token: torch.Tensor, num_draft_tokens: int, packed: np.ndarray,
                      staging: Staging | None = None) -> int:
    """topk 1: overwrite the cache tokens of the rows whose plan holds some; returns how
    many rows changed. ``draft_token`` [bs * N] (any integer dtype, any device)."""
    n = num_draft_tokens
    bs = draft_token.numel() // n
    if packed.shape != (bs, n + 1):
        raise ValueError(f"expected plans [{bs}, {n + 1}], got {packed.shape}")
    lens = packed[:, 0]
    if not (lens > 0).any():
        return 0
    dev = draft_token.device
    t = (staging or Staging()).upload(packed, dev)
    L, cache = t[:, :1], t[:, 2:]
    rows = draft_token.view(bs, n)[:, 1:]
    take = torch.arange(n - 1, device=dev)[None, :] < L
    rows.copy_(torch.where(take, cache.to(rows.dtype), rows))
    return int((lens > 0).sum())


def rewrite_tree_rows(verify_input, packed: np.ndarray, mask_mode: int, staging: Staging | None = None) -> int:
    """topk > 1: rewrite the rows whose plan holds cache tokens (module docstring);
    returns how many rows changed."""
    vi = verify_input
    n = int(vi.draft_token_num)
    bs = vi.retrieve_next_token.shape[0]
    if packed.shape != (bs, n + 1):
        raise ValueError(f"expected plans [{bs}, {n + 1}], got {packed.shape}")
    if mask_mode not in (QLEN_ONLY, FULL_MASK):
        raise ValueError(f"tree mask mode {mask_mode} is not handled (QLEN_ONLY=1 and FULL_MASK=0 are)")
    changed_rows = int((packed[:, 0] > 0).sum())
    if not changed_rows:
        return 0
    dev = vi.draft_token.device
    t = (staging or Staging()).upload(packed, dev)
    L, M, cache = t[:, :1], t[:, 1:2], t[:, 2:]  # [bs, 1], [bs, 1], [bs, N-1]
    j = torch.arange(n, device=dev)[None, :]  # [1, N] node index
    changed = L > 0  # [bs, 1]
    is_cache = changed & (j > M) & (j <= M + L)  # [bs, N]
    is_unused = changed & (j > M + L)
    depth = (j - M).clamp(min=0)  # cache depth 1..L on cache nodes

    tok = vi.draft_token.view(bs, n)
    cache_at = cache.gather(1, (depth - 1).clamp(0, n - 2))
    new_tok = torch.where(is_cache, cache_at.to(tok.dtype), tok)

    pos = vi.positions.view(bs, n)
    root = pos[:, :1]
    new_pos = torch.where(is_cache, root + depth.to(pos.dtype), torch.where(is_unused, root + 1, pos))

    nxt, sib = vi.retrieve_next_token, vi.retrieve_next_sibling  # [bs, N]
    kept_first_child = torch.where(nxt[:, :1] <= M, nxt[:, :1], -1)  # EAGLE3's first child, if kept
    new_nxt = torch.where(changed & (nxt > M), -1, nxt)
    new_sib = torch.where(changed & (sib > M), -1, sib)
    new_nxt = torch.where(is_cache, torch.where(j < M + L, j + 1, -1), new_nxt)
    new_sib = torch.where(is_cache, torch.where(j == M + 1, kept_first_child, -1), new_sib)
    new_nxt = torch.where(is_unused, -1, new_nxt)
    new_sib = torch.where(is_unused, -1, new_sib)
    new_nxt[:, :1] = torch.where(changed, M + 1, new_nxt[:, :1])

    # Mask rows of cache and unused nodes; EAGLE3's rows stay as built.
    c = torch.arange(n, device=dev)[None, None, :]
    x = j[:, :, None]
    cache_row = (c == 0) | ((c > M[:, :, None]) & (c <= x))
    unused_row = (c == 0) | (c == x)
    mask = vi.custom_mask
    if mask_mode == QLEN_ONLY:
        if mask.numel() < bs * n * n:
            raise ValueError(f"QLEN_ONLY mask of {mask.numel()} cells for {bs} rows of {n} nodes")
        block = mask[: bs * n * n].view(bs, n, n)
        idx = None
    else:
        seq = root.to(torch.int64)  # [bs, 1] the root's position is the committed length
        start = n * n * torch.arange(bs, device=dev)[:, None] + n * (torch.cumsum(seq, 0) - seq)  # [bs, 1]
        idx = (start[:, :, None] + (seq[:, :, None] + n) * x + seq[:, :, None] + c).reshape(-1)  # [bs*N*N]
        block = mask[idx].view(bs, n, n)
    new_block = torch.where(is_cache[:, :, None], cache_row,
                            torch.where(is_unused[:, :, None], unused_row, block.to(torch.bool))).to(mask.dtype)

    # Every new value is ready: write them (no shape changes).
    tok.copy_(new_tok)
    pos.copy_(new_pos)
    nxt.copy_(new_nxt)
    sib.copy_(new_sib)
    if idx is None:
        block.copy_(new_block)
    else:
        mask[idx] = new_block.reshape(-1)
    return changed_rows


class WideEagleVerifyInput(EagleVerifyInput):
    """An EagleVerifyInput whose rows may hold a chain of N-1 tokens (HVD cache rows): no
    new state, only the accept width (the rule of SGLang's NgramVerifyInput)."""

    @property
    def max_tree_depth(self) -> int:
        return self.draft_token_num


def widen(verify_input) -> None:
    """Let the verify accept up to N tokens per row (a cache chain of N-1 plus the
    bonus): an EAGLE tree's accept width is ``spec_steps + 1``."""
    if type(verify_input) is EagleVerifyInput:
        verify_input.__class__ = WideEagleVerifyInput
