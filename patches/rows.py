"""Write row plans (sglang_hvd/decision.py) into SGLang's EAGLE3 verify input, in place.

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
the root, its ancestors and itself). A row with plan (L cache nodes with parent links,
M EAGLE3 nodes) becomes, node by node:

  0            the root, unchanged; its first child becomes node M+1 (the cache branch
               is tried first)
  1 .. M       EAGLE3's first M nodes, unchanged. SGLang sorts the selected candidates
               by index and a parent's index is below its children's, so they form a
               subtree; links to nodes > M are cut. Their mask rows name only ancestors
               (< M), so they need no change.
  M+1 .. M+L   the cache branch: cache node k (parent p_k, -1 under the root) at depth
               d_k (position root + d_k), first child the smallest cache node whose
               parent is k, next sibling the next cache node with the same parent; the
               last cache node under the root has EAGLE3's first child (if kept) as next
               sibling; mask: the root, the cache node's ancestors and itself. A chain
               (p_k = k - 1) is the common case: depth k + 1, next token the following
               node.
  M+L+1 ..     unused: no link reaches them; mask root + itself, position root + 1

Worked example (N = 6, plan L = 2 chain, M = 3; EAGLE3 tree 0->{1, 2}, 1->{3}, 2->{4},
4->{5}): next_token [1, 3, 4, -1, 5, -1] -> [4, 3, -1, -1, 5, -1], next_sibling
[-1, 2, -1, -1, -1, -1] -> [-1, 2, -1, -1, 1, -1]; nodes 4, 5 hold the cache tokens at
depths 1, 2 (mask rows 4: {0, 4}, 5: {0, 4, 5}); EAGLE3's node 4 (child of 2) and 5 are
gone, its nodes 1, 2, 3 stay. With parents (-1, -1) instead (two cache tokens under the
root): next_token [4, 3, -1, -1, -1, -1], next_sibling [-1, 2, -1, -1, 5, 1], both at
depth 1 (mask rows 4: {0, 4}, 5: {0, 5}).

The plan's topology (depths, links, ancestor sets as bit masks) is worked out on the
host from the parent links (``cache_topology``, at most 63 cache nodes) and reaches the
device in the same single copy.

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

from sglang_hvd.verify import MAX_TREE_NODES

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


def packed_width(num_draft_tokens: int) -> int:
    """Columns of a packed plan: L, M, then N-1 cache tokens and N-1 parent links."""
    return 2 * num_draft_tokens


def pack_plans(cache_lens: np.ndarray, eagle_nodes: np.ndarray, cache_tokens: np.ndarray,
               cache_parents: np.ndarray | None = None) -> np.ndarray:
    """``[bs, 2 + 2 (N-1)]`` int64: L, M, the cache tokens and their parent links of each
    row (None: chains) -- also what the TP broadcast carries."""
    if cache_parents is None:
        cache_parents = np.broadcast_to(np.arange(-1, cache_tokens.shape[1] - 1), cache_tokens.shape)
    columns = [cache_lens[:, None], eagle_nodes[:, None], cache_tokens, cache_parents]
    return np.concatenate(columns, axis=1).astype(np.int64)


def unpack_plans(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """L [bs], M [bs], cache tokens [bs, N-1], cache parents [bs, N-1]."""
    w = (packed.shape[1] - 2) // 2
    return packed[:, 0], packed[:, 1], packed[:, 2 : 2 + w], packed[:, 2 + w :]


def cache_topology(lens: np.ndarray, parents: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per cache node k < L of each row ([bs, W] int64 each): depth (1 under the root),
    first child (-1: none), next sibling (-1: none; -2: the last node under the root,
    whose next sibling is EAGLE3's first child) and ancestors-or-self as bits (bit c:
    cache node c). Nodes at k >= L are left as 0 / -1. Raises ValueError on a parent
    link that does not point to an earlier node of the row."""
    bs, w = parents.shape
    rows = np.arange(bs)
    live = np.arange(w)[None, :] < lens[:, None]
    if live.any() and w > MAX_TREE_NODES:
        raise ValueError(f"cache trees hold at most {MAX_TREE_NODES} nodes per row, the rows have {w}")
    bad = live & ((parents < -1) | (parents >= np.arange(w)[None, :]))
    if bad.any():
        b, k = map(int, np.argwhere(bad)[0])
        raise ValueError(f"row {b}: cache node {k}'s parent {int(parents[b, k])} is not an earlier node")
    depth = np.zeros((bs, w), np.int64)
    bits = np.zeros((bs, w), np.int64)
    for k in range(w):
        p = parents[:, k]
        up = np.maximum(p, 0)
        has = p >= 0
        depth[:, k] = np.where(live[:, k], np.where(has, depth[rows, up] + 1, 1), 0)
        bits[:, k] = np.where(live[:, k], np.int64(1) << k | np.where(has, bits[rows, up], 0), 0)
    first = np.full((bs, w), -1, np.int64)
    sibling = np.full((bs, w), -1, np.int64)
    last = np.full((bs, w + 1), -1, np.int64)  # the latest child seen per parent slot (0: the root)
    last[:, 0] = -2
    for k in range(w - 1, -1, -1):  # from the end, so the smallest index wins
        on = live[:, k]
        slot = parents[:, k] + 1
        sibling[on, k] = last[rows[on], slot[on]]
        last[rows[on], slot[on]] = k
        under = on & (parents[:, k] >= 0)
        first[rows[under], parents[under, k]] = k
    return depth, first, sibling, bits


def substitute_chains(draft_token: torch.Tensor, num_draft_tokens: int, packed: np.ndarray,
                      staging: Staging | None = None) -> int:
    """topk 1: overwrite the cache tokens of the rows whose plan holds some; returns how
    many rows changed. ``draft_token`` [bs * N] (any integer dtype, any device)."""
    n = num_draft_tokens
    bs = draft_token.numel() // n
    if packed.shape != (bs, packed_width(n)):
        raise ValueError(f"expected plans [{bs}, {packed_width(n)}], got {packed.shape}")
    lens = packed[:, 0]
    if not (lens > 0).any():
        return 0
    dev = draft_token.device
    t = (staging or Staging()).upload(packed[:, : n + 1], dev)
    L, cache = t[:, :1], t[:, 2:]
    rows = draft_token.view(bs, n)[:, 1:]
    take = torch.arange(n - 1, device=dev)[None, :] < L
    rows.copy_(torch.where(take, cache.to(rows.dtype), rows))
    return int((lens > 0).sum())


def rewrite_tree_rows(verify_input, packed: np.ndarray, mask_mode: int, staging: Staging | None = None) -> int:
    """topk > 1: rewrite the rows whose plan holds cache nodes (module docstring);
    returns how many rows changed."""
    vi = verify_input
    n = int(vi.draft_token_num)
    bs = vi.retrieve_next_token.shape[0]
    if packed.shape != (bs, packed_width(n)):
        raise ValueError(f"expected plans [{bs}, {packed_width(n)}], got {packed.shape}")
    if mask_mode not in (QLEN_ONLY, FULL_MASK):
        raise ValueError(f"tree mask mode {mask_mode} is not handled (QLEN_ONLY=1 and FULL_MASK=0 are)")
    lens, eagle, tokens, parents = unpack_plans(packed)
    changed_rows = int((lens > 0).sum())
    if not changed_rows:
        return 0
    depth, first, sibling, bits = cache_topology(lens, parents)
    dev = vi.draft_token.device
    w = n - 1
    columns = [lens[:, None], eagle[:, None], tokens, depth, first, sibling, bits]
    t = (staging or Staging()).upload(np.concatenate(columns, axis=1), dev)
    L, M = t[:, :1], t[:, 1:2]  # [bs, 1]
    cache, c_depth, c_first, c_sib, c_bits = (t[:, 2 + i * w : 2 + (i + 1) * w] for i in range(5))  # [bs, N-1] each
    j = torch.arange(n, device=dev)[None, :]  # [1, N] node index
    changed = L > 0  # [bs, 1]
    is_cache = changed & (j > M) & (j <= M + L)  # [bs, N]
    is_unused = changed & (j > M + L)
    k = (j - M - 1).clamp(0, w - 1)  # the cache node a row node holds (valid where is_cache)

    def at(values):  # [bs, N-1] per cache node -> [bs, N] per row node
        return values.gather(1, k)

    tok = vi.draft_token.view(bs, n)
    new_tok = torch.where(is_cache, at(cache).to(tok.dtype), tok)

    pos = vi.positions.view(bs, n)
    root = pos[:, :1]
    new_pos = torch.where(is_cache, root + at(c_depth).to(pos.dtype), torch.where(is_unused, root + 1, pos))

    nxt, sib = vi.retrieve_next_token, vi.retrieve_next_sibling  # [bs, N]
    kept_first_child = torch.where(nxt[:, :1] <= M, nxt[:, :1], -1)  # EAGLE3's first child, if kept
    new_nxt = torch.where(changed & (nxt > M), -1, nxt)
    new_sib = torch.where(changed & (sib > M), -1, sib)
    first_at, sib_at = at(c_first), at(c_sib)
    new_nxt = torch.where(is_cache, torch.where(first_at >= 0, M + 1 + first_at, -1), new_nxt)
    new_sib = torch.where(is_cache, torch.where(sib_at >= 0, M + 1 + sib_at,
                                                torch.where(sib_at == -2, kept_first_child, -1)), new_sib)
    new_nxt = torch.where(is_unused, -1, new_nxt)
    new_sib = torch.where(is_unused, -1, new_sib)
    new_nxt[:, :1] = torch.where(changed, M + 1, new_nxt[:, :1])

    # Mask rows of cache and unused nodes; EAGLE3's rows stay as built.
    c = torch.arange(n, device=dev)[None, None, :]
    x = j[:, :, None]
    col_k = (c - M[:, :, None] - 1).clamp(0, MAX_TREE_NODES - 1)  # the cache node a column holds (a bit of its mask)
    ancestor = ((at(c_bits)[:, :, None] >> col_k) & 1).bool() & (c > M[:, :, None]) & (c <= (M + L)[:, :, None])
    cache_row = (c == 0) | ancestor
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


def cut_plain_rows(retrieve_next_token: torch.Tensor, packed: np.ndarray) -> int:
    """Rows whose plan holds no draft node (L = 0 and M = 0: a request that asked for no
    speculation, or a step without EAGLE3's draft that has no cache draft for the row)
    lose their root's first-child link, so the verify accepts nothing there and the row
    emits the target's own next token; returns how many rows. ``retrieve_next_token``
    [bs, N] (every topk: SGLang's greedy and sampling verifies both walk it)."""
    plain = np.flatnonzero((packed[:, 0] == 0) & (packed[:, 1] == 0))
    if not len(plain):
        return 0
    if len(plain) == retrieve_next_token.shape[0]:
        retrieve_next_token[:, 0] = -1
    else:
        rows = torch.from_numpy(plain).to(retrieve_next_token.device, non_blocking=True)
        retrieve_next_token[rows, 0] = -1
    return len(plain)


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
