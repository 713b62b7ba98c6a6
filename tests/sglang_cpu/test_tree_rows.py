"""HVD's row rewriter (patches/rows.py) on verify inputs built as SGLang builds them.

Trees: EAGLE's own ``select_top_k_tokens`` + ``organize_draft_results`` grow them and the
port of SGLang's tree kernel (``build_tree_kernel_efficient_cpu``, checked equal to
SGLang's Triton kernel by test_contract.py) lays them out, in both mask layouts. The
verify is the port of ``verify_tree_greedy`` (likewise checked), run with the accept
width SGLang derives from the verify input (``max_tree_depth``).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sglang", reason="the SGLang CPU harness needs the sglang extra (sglang==0.5.23)")
torch = pytest.importorskip("torch")

from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode  # noqa: E402
from sglang.srt.speculative.eagle_info import EagleVerifyInput  # noqa: E402

from sglang_hvd.harness.stubs.hvd_cpu_shims import kernels as K  # noqa: E402
from sglang_hvd.patches.rows import (  # noqa: E402
    FULL_MASK,
    QLEN_ONLY,
    WideEagleVerifyInput,
    cache_topology,
    cut_plain_rows,
    pack_plans,
    rewrite_tree_rows,
    widen,
)

from .triton_reference import _grow_tree  # noqa: E402

TOPK, STEPS, N = 2, 3, 8
SEQ_LENS = [5, 9, 7]


def build(mode: int, seed: int = 3, seq_lens=SEQ_LENS) -> EagleVerifyInput:
    """A topk-2, 3-step, 8-node verify input for len(seq_lens) requests."""
    gen = torch.Generator().manual_seed(seed)
    bs = len(seq_lens)
    parent_list, selected = _grow_tree(gen, bs, TOPK, STEPS, N)
    seq = torch.tensor(seq_lens)
    size = bs * N * N if mode == QLEN_ONLY else int(seq.sum()) * N + bs * N * N
    mask = torch.full((size,), True)
    retrieve = torch.full((3, bs, N), -1, dtype=torch.long)
    positions = torch.empty((bs * N,), dtype=torch.long)
    K.build_tree_kernel_efficient_cpu(parent_list, selected, seq, mask, positions, retrieve[0], retrieve[1],
                                      retrieve[2], TOPK, STEPS, N, mode)
    tokens = torch.randint(1000, 2000, (bs * N,), generator=gen)
    return EagleVerifyInput(
        draft_token=tokens, custom_mask=mask, positions=positions, retrieve_index=retrieve[0],
        retrieve_next_token=retrieve[1], retrieve_next_sibling=retrieve[2], retrieve_cum_len=None, spec_steps=STEPS,
        topk=TOPK, draft_token_num=N, capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=sum(seq_lens),
        seq_lens_cpu=seq)


def mask_block(vi, mode: int, b: int, seq_lens=SEQ_LENS) -> torch.Tensor:
    """Request b's N x N draft part of the mask."""
    if mode == QLEN_ONLY:
        return vi.custom_mask[b * N * N : (b + 1) * N * N].view(N, N)
    start = N * N * b + N * sum(seq_lens[:b])
    s = seq_lens[b]
    return vi.custom_mask[start : start + (s + N) * N].view(N, s + N)[:, s:]


def prefix_block(vi, b: int, seq_lens=SEQ_LENS) -> torch.Tensor:
    start = N * N * b + N * sum(seq_lens[:b])
    s = seq_lens[b]
    return vi.custom_mask[start : start + (s + N) * N].view(N, s + N)[:, :s]


def chain_reference(seq_len: int, mode: int):
    """A chain of N-1 tokens built independently: SGLang's topk-1 tree at N-1 steps."""
    mask = torch.full((N * N if mode == QLEN_ONLY else (seq_len + N) * N,), True)
    retrieve = torch.full((3, 1, N), -1, dtype=torch.long)
    positions = torch.empty((N,), dtype=torch.long)
    K.build_tree_kernel_efficient_cpu(torch.arange(-1, N - 2)[None], torch.arange(N - 1)[None], torch.tensor([seq_len]),
                                      mask, positions, retrieve[0], retrieve[1], retrieve[2], 1, N - 1, N, mode)
    block = mask.view(N, N) if mode == QLEN_ONLY else mask.view(N, seq_len + N)[:, seq_len:]
    return positions, retrieve[1][0], retrieve[2][0], block


def verify(vi, target: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """Greedy tree verify of ``target`` [bs, N] (the target's argmax after each node)."""
    bs = vi.retrieve_next_token.shape[0]
    predicts = torch.zeros(bs * N, dtype=torch.int32)
    accept_index = torch.full((bs, vi.max_tree_depth), -1, dtype=torch.int32)
    accepted = torch.zeros(bs, dtype=torch.int32)
    K.verify_tree_greedy_cpu(predicts, accept_index, accepted, vi.draft_token.view(bs, N), vi.retrieve_index,
                             vi.retrieve_next_token, vi.retrieve_next_sibling, target)
    return accepted.tolist(), accept_index


CACHE = [[], [301, 302, 303, 304, 305, 306, 307], [401, 402, 403]]


def plans():
    """Row 0 keeps EAGLE3's tree; row 1 a cache chain of N-1 = 7; row 2 three cache
    tokens beside EAGLE3's first 4 nodes."""
    cache = np.full((3, N - 1), -1)
    for i, c in enumerate(CACHE):
        cache[i, : len(c)] = c
    return pack_plans(np.array([0, 7, 3]), np.array([7, 0, 4]), cache)


@pytest.mark.parametrize("mode", [QLEN_ONLY, FULL_MASK])
def test_untouched_rows_stay_byte_identical_and_chains_equal_sglangs_own(mode):
    vi, before = build(mode), build(mode)
    assert rewrite_tree_rows(vi, plans(), mode) == 2
    # Row 0: every tensor as built.
    assert (torch.equal(vi.draft_token[:N], before.draft_token[:N])
            and torch.equal(vi.positions[:N], before.positions[:N]))
    assert torch.equal(vi.retrieve_next_token[0], before.retrieve_next_token[0])
    assert torch.equal(vi.retrieve_next_sibling[0], before.retrieve_next_sibling[0])
    assert torch.equal(mask_block(vi, mode, 0), mask_block(before, mode, 0))
    # Row 1: the chain SGLang itself builds for topk 1, with the cache tokens.
    pos, nxt, sib, block = chain_reference(SEQ_LENS[1], mode)
    assert vi.draft_token[N : 2 * N].tolist() == [before.draft_token[N].item()] + CACHE[1]
    assert torch.equal(vi.positions[N : 2 * N], pos)
    assert torch.equal(vi.retrieve_next_token[1], nxt) and torch.equal(vi.retrieve_next_sibling[1], sib)
    assert torch.equal(mask_block(vi, mode, 1), block)
    assert torch.equal(vi.retrieve_index, before.retrieve_index)
    if mode == FULL_MASK:  # the committed prefix stays visible to every node
        assert all(bool(prefix_block(vi, b).all()) for b in range(3))


@pytest.mark.parametrize("mode", [QLEN_ONLY, FULL_MASK])
def test_two_branch_row_keeps_eagle3s_subtree_and_adds_the_cache_chain_first(mode):
    vi, before = build(mode), build(mode)
    rewrite_tree_rows(vi, plans(), mode)
    b, m = 2, 4
    old_next, old_sib = before.retrieve_next_token[b].tolist(), before.retrieve_next_sibling[b].tolist()
    new_next, new_sib = vi.retrieve_next_token[b].tolist(), vi.retrieve_next_sibling[b].tolist()
    root_pos = SEQ_LENS[b]
    # EAGLE3's nodes 1..4: tokens, positions and mask rows as built; links beyond 4 cut.
    assert vi.draft_token[b * N : b * N + m + 1].tolist() == before.draft_token[b * N : b * N + m + 1].tolist()
    assert vi.positions[b * N : b * N + m + 1].tolist() == before.positions[b * N : b * N + m + 1].tolist()
    assert torch.equal(mask_block(vi, mode, b)[: m + 1], mask_block(before, mode, b)[: m + 1])
    assert new_next[1 : m + 1] == [x if x <= m else -1 for x in old_next[1 : m + 1]]
    assert new_sib[1 : m + 1] == [x if x <= m else -1 for x in old_sib[1 : m + 1]]
    # The root tries the cache chain (nodes 5, 6, 7) first, then EAGLE3's first child.
    assert new_next[0] == m + 1 and new_sib[m + 1] == old_next[0]
    assert vi.draft_token[b * N + m + 1 : (b + 1) * N].tolist() == CACHE[2]
    assert new_next[m + 1 :] == [6, 7, -1] and new_sib[m + 2 :] == [-1, -1]
    assert vi.positions[b * N + m + 1 : (b + 1) * N].tolist() == [root_pos + 1, root_pos + 2, root_pos + 3]
    rows = mask_block(vi, mode, b)[m + 1 :].int().tolist()
    assert rows == [[1, 0, 0, 0, 0, 1, 0, 0], [1, 0, 0, 0, 0, 1, 1, 0], [1, 0, 0, 0, 0, 1, 1, 1]]


def test_greedy_verify_accepts_a_full_chain_only_with_the_wide_accept_width():
    vi = build(QLEN_ONLY)
    rewrite_tree_rows(vi, plans(), QLEN_ONLY)
    bs = 3
    # The target agrees with row 1's chain (the prediction after node k is chain token k+1)
    # and, in row 2, with EAGLE3's first child, not with the cache branch.
    target = torch.full((bs, N), 7)
    target[1, :7] = torch.tensor(CACHE[1])
    eagle_first = vi.retrieve_next_sibling[2, 5].item()
    target[2, 0] = vi.draft_token[2 * N + eagle_first]
    # SGLang's own width for an EAGLE tree (spec_steps + 1) cuts the chain at 3 tokens...
    accepted, _ = verify(vi, target)
    assert accepted[1] == STEPS
    # ... widened to N, the whole chain of 7 is accepted.
    widen(vi)
    assert type(vi) is WideEagleVerifyInput and vi.max_tree_depth == N
    accepted, accept_index = verify(vi, target)
    assert accepted[1] == N - 1 and accept_index[1].tolist() == [N + j for j in range(N)]
    # Row 2: the cache branch's first token is wrong: EAGLE3's branch is accepted.
    assert accepted[2] >= 1 and accept_index[2, 1].item() == 2 * N + eagle_first


@pytest.mark.parametrize("topk", [1, 2])
def test_a_row_planned_with_no_draft_accepts_nothing_where_its_draft_was_right(topk):
    """A request that asked for no speculation (L = 0, M = 0): even a draft the target
    agrees with is not accepted; the row emits the target's token after the root."""
    vi = build(QLEN_ONLY)
    bs = 3
    if topk == 1:  # SGLang's topk-1 rows: chains
        for b in range(bs):
            _, nxt, sib, _ = chain_reference(SEQ_LENS[b], QLEN_ONLY)
            vi.retrieve_next_token[b], vi.retrieve_next_sibling[b] = nxt, sib
    # the target agrees with every row's first child: each would accept >= 1 token
    target = torch.full((bs, N), 7)
    for b in range(bs):
        target[b, 0] = vi.draft_token[b * N + vi.retrieve_next_token[b, 0]]
    assert min(verify(vi, target)[0]) >= 1
    packed = pack_plans(np.array([0, 0, 0]), np.array([N - 1, 0, 0]), np.full((bs, N - 1), -1))
    packed[2, 1] = N - 1  # rows 0 and 2 keep EAGLE3's draft, row 1 has none
    assert cut_plain_rows(vi.retrieve_next_token, packed) == 1
    accepted, accept_index = verify(vi, target)
    assert accepted[1] == 0 and accepted[0] >= 1 and accepted[2] >= 1
    assert accept_index[1].tolist()[:2] == [N, -1]  # the root alone: its prediction is the emitted token
    everything = pack_plans(np.zeros(bs, np.int64), np.zeros(bs, np.int64), np.full((bs, N - 1), -1))
    assert cut_plain_rows(vi.retrieve_next_token, everything) == 3 and verify(vi, target)[0] == [0, 0, 0]


def test_rewriting_a_corrupted_mask_would_be_caught():
    """Sensitivity of the checks above: an all-visible mask row differs from SGLang's chain."""
    vi = build(QLEN_ONLY)
    rewrite_tree_rows(vi, plans(), QLEN_ONLY)
    _, _, _, block = chain_reference(SEQ_LENS[1], QLEN_ONLY)
    mask_block(vi, QLEN_ONLY, 1)[3] = True
    assert not torch.equal(mask_block(vi, QLEN_ONLY, 1), block)


def test_unknown_mask_layouts_and_wrong_plan_shapes_are_refused():
    vi = build(QLEN_ONLY)
    with pytest.raises(ValueError, match="tree mask mode 2 is not handled"):
        rewrite_tree_rows(vi, plans(), 2)
    with pytest.raises(ValueError, match=r"expected plans \[3, 16\]"):
        rewrite_tree_rows(vi, plans()[:2], QLEN_ONLY)
    bad = tree_plans()
    bad[1, 2 + (N - 1) + 2] = 2  # cache node 2 names itself as parent
    with pytest.raises(ValueError, match="row 1: cache node 2's parent 2 is not an earlier node"):
        rewrite_tree_rows(vi, bad, QLEN_ONLY)


# Row 1: a cache tree of 6 nodes, 5 -> 7 -> 8 (the chain), 4 under 5, 9 under the root, 6 under 9:
# nodes 0:5 1:7 2:8 3:9 4:4 5:6 with parents -1, 0, 1, -1, 0, 3. Row 2: the same tree's first 4
# nodes beside EAGLE3's first 3.
TREE_TOKENS = [505, 507, 508, 509, 504, 506]
TREE_PARENTS = [-1, 0, 1, -1, 0, 3]


def tree_plans():
    tokens = np.full((3, N - 1), -1)
    parents = np.full((3, N - 1), -1)
    tokens[1, :6], parents[1, :6] = TREE_TOKENS, TREE_PARENTS
    tokens[2, :4], parents[2, :4] = TREE_TOKENS[:4], TREE_PARENTS[:4]
    return pack_plans(np.array([0, 6, 4]), np.array([7, 0, 3]), tokens, parents)


def test_cache_topology_of_a_literal_tree():
    depth, first, sibling, bits = cache_topology(np.array([6]), np.array([TREE_PARENTS + [-1]]))
    assert depth[0].tolist() == [1, 2, 3, 1, 2, 2, 0]
    assert first[0].tolist() == [1, 2, -1, 5, -1, -1, -1]
    assert sibling[0].tolist() == [3, 4, -1, -2, -1, -1, -1]  # 9 is the last under the root: EAGLE3's first child next
    assert bits[0].tolist() == [0b1, 0b11, 0b111, 0b1000, 0b10001, 0b101000, 0]


@pytest.mark.parametrize("mode", [QLEN_ONLY, FULL_MASK])
def test_a_cache_tree_row_links_and_masks_each_node_under_its_parent(mode):
    vi, before = build(mode), build(mode)
    assert rewrite_tree_rows(vi, tree_plans(), mode) == 2
    root_pos = SEQ_LENS[1]
    # Row 1: nodes 1..6 hold the tree (M = 0), node 7 unused.
    assert vi.draft_token[N + 1 : N + 7].tolist() == TREE_TOKENS
    assert vi.retrieve_next_token[1].tolist() == [1, 2, 3, -1, 6, -1, -1, -1]
    assert vi.retrieve_next_sibling[1].tolist() == [-1, 4, 5, -1, -1, -1, -1, -1]
    assert vi.positions[N : 2 * N].tolist() == [root_pos] + [root_pos + d for d in (1, 2, 3, 1, 2, 2)] + [root_pos + 1]
    rows = mask_block(vi, mode, 1).int().tolist()
    assert rows[1:] == [[1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0],
                        [1, 0, 0, 0, 1, 0, 0, 0], [1, 1, 0, 0, 0, 1, 0, 0], [1, 0, 0, 0, 1, 0, 1, 0],
                        [1, 0, 0, 0, 0, 0, 0, 1]]
    # Row 2: EAGLE3's nodes 1..3 kept; the tree's 5 -> 7 -> 8 and 9 at nodes 4..7,
    # 9's next sibling EAGLE3's first child.
    old_first = before.retrieve_next_token[2, 0].item()
    assert vi.retrieve_next_token[2, 0].item() == 4
    assert vi.retrieve_next_token[2, 4:].tolist() == [5, 6, -1, -1]
    assert vi.retrieve_next_sibling[2, 4:].tolist() == [7, -1, -1, old_first if old_first <= 3 else -1]


def test_greedy_verify_follows_the_sibling_when_the_first_branch_is_wrong():
    vi = build(QLEN_ONLY)
    rewrite_tree_rows(vi, tree_plans(), QLEN_ONLY)
    widen(vi)
    target = torch.full((3, N), 7)
    # Row 1: the output is 5 4 (the chain's 7 is wrong at depth 2, 4 is its sibling) then 9 ...
    target[1, 0], target[1, 1] = 505, 504
    # Row 2: the output is 9 (the second branch under the root) then 1.
    target[2, 0] = 509
    accepted, accept_index = verify(vi, target)
    assert accepted[1] == 2 and accept_index[1, :3].tolist() == [N, N + 1, N + 5]
    assert accepted[2] == 1 and accept_index[2, :2].tolist() == [2 * N, 2 * N + 7]
