"""The torch ports of the sgl_kernel CPU kernels, on hand-made inputs (topk 1 and 2)
with literal expected outputs worked out from the Triton kernels' semantics."""

from __future__ import annotations

import pytest

pytest.importorskip("sglang", reason="the SGLang CPU harness needs the sglang extra (sglang==0.5.23)")
torch = pytest.importorskip("torch")

from sglang_hvd.harness.stubs.hvd_cpu_shims import kernels as K  # noqa: E402
from sglang_hvd.harness.stubs.hvd_cpu_shims.attention import draft_decode_table  # noqa: E402

QLEN_ONLY, FULL_MASK = K.QLEN_ONLY, K.FULL_MASK


def _tree_buffers(bs: int, n: int, mask_size: int, fill: bool = True):
    retrieve = torch.full((3, bs, n), -1, dtype=torch.long)
    positions = torch.empty((bs * n,), dtype=torch.long)
    mask = torch.full((mask_size,), fill, dtype=torch.bool)
    return mask, positions, retrieve


# -------------------------------------------------------------------- build tree


def test_build_tree_topk1_chain_qlen_only():
    # topk 1, 3 steps: SGLang's prealloc chain parents [-1, 0, 1] and indices [0, 1, 2]
    n = 4
    mask, positions, (r_index, r_next, r_sib) = _tree_buffers(1, n, n * n)
    K.build_tree_kernel_efficient_cpu(
        torch.tensor([[-1, 0, 1]]), torch.tensor([[0, 1, 2]]), torch.tensor([5]),
        mask, positions, r_index, r_next, r_sib, topk=1, depth=3, draft_token_num=n, tree_mask_mode=QLEN_ONLY)
    assert r_index.tolist() == [[0, 1, 2, 3]]
    assert r_next.tolist() == [[1, 2, 3, -1]]
    assert r_sib.tolist() == [[-1, -1, -1, -1]]
    assert positions.tolist() == [5, 6, 7, 8]
    assert mask.view(n, n).int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]


# A topk-2, 3-step tree as EAGLE's select_top_k_tokens lays it out. Scored candidates:
# step 0: A=0, B=1; step 1 children of A: 2, 3, of B: 4, 5 (kept: 2=C under A, 4=E
# under B, so parents_list[1] = [2, 4]); step 2 children of C: 6, 7, of E: 8, 9.
# Top 5 by score, sorted: [0 A, 1 B, 2 C, 4 E, 6 G (under C)].
TOPK2_PARENTS = [-1, 0, 1, 2, 4]
TOPK2_SELECTED = [0, 1, 2, 4, 6]
# nodes: 0 root, 1 A, 2 B, 3 C (A's child), 4 E (B's child), 5 G (C's child)
TOPK2_MASK = [
    [1, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 0],
    [1, 0, 1, 0, 0, 0],
    [1, 1, 0, 1, 0, 0],
    [1, 0, 1, 0, 1, 0],
    [1, 1, 0, 1, 0, 1],
]


def test_build_tree_topk2_qlen_only_batch_of_two():
    n, bs = 6, 2
    mask, positions, (r_index, r_next, r_sib) = _tree_buffers(bs, n, bs * n * n)
    K.build_tree_kernel_efficient_cpu(
        torch.tensor([TOPK2_PARENTS] * bs), torch.tensor([TOPK2_SELECTED] * bs), torch.tensor([10, 3]),
        mask, positions, r_index, r_next, r_sib, topk=2, depth=3, draft_token_num=n, tree_mask_mode=QLEN_ONLY)
    assert r_index.tolist() == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    # root -> A (first child), A's sibling B; A -> C; B -> E; C -> G
    assert r_next.tolist() == [[1, 3, 4, 5, -1, -1]] * 2
    assert r_sib.tolist() == [[-1, 2, -1, -1, -1, -1]] * 2
    assert positions.tolist() == [10, 11, 11, 12, 12, 13, 3, 4, 4, 5, 5, 6]
    assert mask.view(bs, n, n).int().tolist() == [TOPK2_MASK, TOPK2_MASK]


def test_build_tree_topk2_full_mask_keeps_prefix_columns():
    n, seq_len = 6, 3
    width = seq_len + n
    mask, positions, (r_index, r_next, r_sib) = _tree_buffers(1, n, width * n)
    K.build_tree_kernel_efficient_cpu(
        torch.tensor([TOPK2_PARENTS]), torch.tensor([TOPK2_SELECTED]), torch.tensor([seq_len]),
        mask, positions, r_index, r_next, r_sib, topk=2, depth=3, draft_token_num=n, tree_mask_mode=FULL_MASK)
    rows = mask.view(n, width).int().tolist()
    assert rows == [[1, 1, 1] + row for row in TOPK2_MASK]
    assert positions.tolist() == [3, 4, 4, 5, 5, 6]


def test_build_tree_rejects_bitpacking():
    mask, positions, (r_index, r_next, r_sib) = _tree_buffers(1, 4, 4)
    with pytest.raises(NotImplementedError):
        K.build_tree_kernel_efficient_cpu(torch.tensor([[-1, 0, 1]]), torch.tensor([[0, 1, 2]]), torch.tensor([5]),
                                          mask, positions, r_index, r_next, r_sib, 1, 3, 4, 2)


# ------------------------------------------------------------------------ verify


def _verify(candidates, r_index, r_next, r_sib, target, depth):
    bs, n = len(candidates), len(candidates[0])
    predicts = torch.zeros(bs * n, dtype=torch.int32)
    accept_index = torch.full((bs, depth), -1, dtype=torch.int32)
    accept_num = torch.empty(bs, dtype=torch.int32)
    K.verify_tree_greedy_cpu(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
        candidates=torch.tensor(candidates), retrive_index=torch.tensor(r_index),
        retrive_next_token=torch.tensor(r_next),
        retrive_next_sibling=torch.tensor(r_sib), target_predict=torch.tensor(target))
    return predicts.tolist(), accept_index.tolist(), accept_num.tolist()


def test_verify_topk1_chain_partial_accept():
    predicts, accept_index, accept_num = _verify(
        candidates=[[100, 11, 12, 13]], r_index=[[0, 1, 2, 3]], r_next=[[1, 2, 3, -1]], r_sib=[[-1] * 4],
        target=[[11, 12, 99, 98]], depth=4)
    assert accept_index == [[0, 1, 2, -1]]  # root, then 11 and 12 accepted; 13 != 99
    assert accept_num == [2]
    assert predicts == [11, 12, 99, 0]  # 99 is the bonus after the last accepted node


def test_verify_topk1_all_accepted_and_none_accepted():
    predicts, accept_index, accept_num = _verify(
        candidates=[[100, 11, 12, 13], [200, 21, 22, 23]], r_index=[[0, 1, 2, 3], [4, 5, 6, 7]],
        r_next=[[1, 2, 3, -1]] * 2, r_sib=[[-1] * 4] * 2,
        target=[[11, 12, 13, 14], [77, 22, 23, 24]], depth=4)
    assert accept_index == [[0, 1, 2, 3], [4, -1, -1, -1]]
    assert accept_num == [3, 0]
    assert predicts == [11, 12, 13, 14, 77, 0, 0, 0]


def test_verify_topk2_accepts_through_a_sibling():
    # the tree of TOPK2_*: root -> {A, B}, A -> C -> G, B -> E; tokens [root, A, B, C, E, G]
    r_next, r_sib = [1, 3, 4, 5, -1, -1], [-1, 2, -1, -1, -1, -1]
    predicts, accept_index, accept_num = _verify(
        candidates=[[100, 11, 12, 13, 15, 17], [200, 21, 22, 23, 25, 27]],
        r_index=[[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]], r_next=[r_next] * 2, r_sib=[r_sib] * 2,
        # request 0: target wants B (the sibling), then E, then 99 after E (a leaf)
        # request 1: target wants A, C, G: the whole first branch, then 66
        target=[[12, 50, 15, 51, 99, 52], [21, 23, 60, 27, 61, 66]], depth=4)
    assert accept_index == [[0, 2, 4, -1], [6, 7, 9, 11]]
    assert accept_num == [2, 3]
    assert predicts == [12, 0, 15, 0, 99, 0, 21, 23, 0, 27, 0, 66]


# -------------------------------------------------------------------- cache locs


def _req_to_token():
    # 3 request slots x 16 positions; slot r position p holds 100*r + p
    return torch.arange(16).repeat(3, 1) + 100 * torch.arange(3).unsqueeze(1)


@pytest.mark.parametrize("topk,steps,expected", [
    (1, 3, [203, 204, 205, 5, 6, 7]),
    (2, 2, [203, 204, 205, 206, 5, 6, 7, 8]),
])
def test_assign_draft_cache_locs_contiguous(topk, steps, expected):
    r2t = _req_to_token()
    out = torch.full((2 * topk * steps,), -7, dtype=torch.int64)
    K.assign_draft_cache_locs_contiguous_cpu(torch.tensor([2, 0]), r2t, torch.tensor([3, 5]), out, 16, topk, steps)
    assert out.tolist() == expected


def test_assign_extend_cache_locs_gathers_back_to_back():
    out = torch.full((5,), -7, dtype=torch.int64)
    K.assign_extend_cache_locs_cpu(torch.tensor([1, 2]), _req_to_token(), torch.tensor([4, 0]), torch.tensor([7, 2]),
                                   out, 16)
    assert out.tolist() == [104, 105, 106, 200, 201]


def test_assign_req_to_token_pool_scatters_back_to_back():
    r2t = torch.zeros((3, 8), dtype=torch.int32)
    K.assign_req_to_token_pool_cpu(torch.tensor([2, 0]), r2t, torch.tensor([1, 5]), torch.tensor([4, 7]),
                                   torch.tensor([11, 12, 13, 21, 22]), 8)
    assert r2t.tolist() == [[0, 0, 0, 0, 0, 21, 22, 0], [0] * 8, [0, 11, 12, 13, 0, 0, 0, 0]]


# ----------------------------------------------------------------------- accepts


def test_fill_bonus_tokens_takes_last_accepted_slot():
    accept_tokens = torch.tensor([11, 12, 13, 14, 21, 22, 23, 24, 31, 32, 33, 34], dtype=torch.int32)
    bonus = torch.zeros(3, dtype=torch.int32)
    K.fill_bonus_tokens_cpu(accept_tokens, torch.tensor([2, 4, 1], dtype=torch.int32), bonus, 4)
    assert bonus.tolist() == [12, 24, 31]


def test_fill_accept_out_cache_loc_compacts_accepted_rows():
    accept_index = torch.tensor([[0, 2, 4, -1], [6, -1, -1, -1]], dtype=torch.int32)
    out_cache_loc = torch.arange(100, 112)
    dst = torch.zeros(8, dtype=torch.int64)
    K.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, dst)
    assert dst.tolist() == [100, 102, 104, 106, 0, 0, 0, 0]


# ----------------------------------------------------------------------- kv copy


def test_copy_all_layer_kv_cache_reads_all_sources_first():
    k = torch.arange(8 * 2 * 4, dtype=torch.float32).view(8, 2, 4)
    v = torch.arange(8 * 3, dtype=torch.float16).view(8, 3)
    k0, v0 = k.clone(), v.clone()
    bufs = [k, v]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs])
    # row 5 <- row 1 and row 6 <- row 5 (the old row 5: sources are read before writes)
    K.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([5, 6]), torch.tensor([1, 5]))
    for new, old in ((k, k0), (v, v0)):
        assert torch.equal(new[5], old[1])
        assert torch.equal(new[6], old[5])
        untouched = [0, 1, 2, 3, 4, 7]
        assert torch.equal(new[untouched], old[untouched])


# ------------------------------------------------------------- draft decode table


@pytest.mark.parametrize("topk", [1, 2])
def test_draft_decode_table_prefix_then_own_branch_slots(topk):
    r2t = _req_to_token()
    steps = 3
    table, lens, rows = draft_decode_table(r2t, torch.tensor([2, 1]), torch.tensor([2, 4]), topk, steps)
    if topk == 1:
        assert table.tolist() == [[200, 201, 202, 203, 204, 0, 0], [100, 101, 102, 103, 104, 105, 106]]
        assert lens.tolist() == [2, 4]
    else:
        assert table.tolist() == [
            [200, 201, 202, 203, 204, 0, 0],
            [200, 201, 205, 206, 207, 0, 0],  # branch 1 of request 0: slots 2 + 3 .. 2 + 5
            [100, 101, 102, 103, 104, 105, 106],
            [100, 101, 102, 103, 107, 108, 109],
        ]
        assert lens.tolist() == [2, 2, 4, 4]
    assert rows.tolist() == list(range(2 * topk))
