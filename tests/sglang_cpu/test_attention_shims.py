"""The torch_native attention additions (TARGET_VERIFY and multi-step draft decode)
against a plain softmax reference, on fake pools (no server)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang", reason="the SGLang CPU harness needs the sglang extra (sglang==0.5.23)")
torch = pytest.importorskip("torch")

from sglang_hvd.harness.stubs.hvd_cpu_shims import attention  # noqa: E402

HEADS, KV_HEADS, DIM, ROWS = 4, 2, 8, 64


class FakePool:
    def __init__(self, gen):
        self.k = torch.randn((ROWS, KV_HEADS, DIM), generator=gen)
        self.v = torch.randn((ROWS, KV_HEADS, DIM), generator=gen)

    def set_kv_buffer(self, layer, loc, k, v):
        self.k[loc.loc] = k.view(-1, KV_HEADS, DIM)
        self.v[loc.loc] = v.view(-1, KV_HEADS, DIM)

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v


LAYER = SimpleNamespace(qk_head_dim=DIM, v_head_dim=DIM, tp_q_head_num=HEADS, tp_k_head_num=KV_HEADS, layer_id=0,
                        scaling=1 / math.sqrt(DIM), is_cross_attention=False, sliding_window_size=-1)


def _reference(q_row, slots, pool):
    """Attention of one query [HEADS, DIM] over KV rows ``slots`` (GQA), in float64."""
    k = pool.k[slots].double().repeat_interleave(HEADS // KV_HEADS, dim=1)  # [s, HEADS, DIM]
    v = pool.v[slots].double().repeat_interleave(HEADS // KV_HEADS, dim=1)
    scores = torch.einsum("hd,shd->hs", q_row.double(), k) * LAYER.scaling
    return torch.einsum("hs,shd->hd", scores.softmax(-1), v)


# topk-2 tree of 6 nodes (root, A, B, C under A, E under B, G under C), QLEN_ONLY rows
TREE = [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0], [1, 0, 1, 0, 1, 0], [1, 1, 0, 1, 0, 1]]


@pytest.mark.parametrize("layout", ["qlen_only", "full_mask", "no_mask", "one_node"])
def test_target_verify_sees_prefix_and_tree_ancestors(layout):
    """``one_node``: SGLang's steps-0 verify (the ``off`` tier), one query a row, its mask all True."""
    gen = torch.Generator().manual_seed(0)
    pool = FakePool(gen)
    n, seq_lens, reqs = (1 if layout == "one_node" else 6), [3, 5], [1, 0]
    req_to_token = torch.randperm(ROWS, generator=gen)[: 2 * 16].view(2, 16)
    tree = torch.tensor(TREE, dtype=torch.bool) if layout != "no_mask" else torch.ones(n, n, dtype=torch.bool).tril()
    if layout == "one_node":
        tree = torch.ones(1, 1, dtype=torch.bool)
        mask = torch.ones(2, dtype=torch.bool)
    elif layout == "qlen_only":
        mask = tree.repeat(2, 1, 1).flatten()
    elif layout == "full_mask":
        mask = torch.cat([torch.cat([torch.ones(n, s, dtype=torch.bool), tree], 1).flatten() for s in seq_lens])
    else:
        mask = None
    out_cache_loc = torch.cat([req_to_token[r, s : s + n] for r, s in zip(reqs, seq_lens)])
    fb = SimpleNamespace(spec_info=SimpleNamespace(draft_token_num=n, custom_mask=mask),
                         seq_lens=torch.tensor(seq_lens), req_pool_indices=torch.tensor(reqs),
                         out_cache_loc=out_cache_loc)
    backend = SimpleNamespace(token_to_kv_pool=pool, req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
                              swa_out_cache_loc=None)
    q = torch.randn((2 * n, HEADS * DIM), generator=gen)
    k = torch.randn((2 * n, KV_HEADS * DIM), generator=gen)
    v = torch.randn((2 * n, KV_HEADS * DIM), generator=gen)
    o = attention.target_verify_extend(backend, q, k, v, LAYER, fb)
    assert torch.equal(pool.k[out_cache_loc], k.view(-1, KV_HEADS, DIM))  # the drafts' KV was written first
    for i, (req, prefix) in enumerate(zip(reqs, seq_lens)):
        for j in range(n):
            slots = req_to_token[req, :prefix].tolist() + [req_to_token[req, prefix + c].item()
                                                           for c in range(n) if tree[j, c]]
            want = _reference(q[i * n + j].view(HEADS, DIM), slots, pool)
            got = o[i * n + j].view(HEADS, DIM).double()
            assert torch.allclose(got, want, atol=1e-5), (layout, i, j)


@pytest.mark.parametrize("topk", [1, 2])
def test_multi_step_draft_decode_reads_prefix_and_own_branch(topk):
    gen = torch.Generator().manual_seed(1)
    pool = FakePool(gen)
    steps, seq_lens, reqs = 3, [4, 2], [0, 1]
    req_to_token = torch.randperm(ROWS, generator=gen)[:32].view(2, 16)
    runner = SimpleNamespace(device="cpu", req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
                             token_to_kv_pool=pool)
    _, multi_step_cls = attention.classes()
    multi = multi_step_cls(runner, topk, steps)
    assert len(multi.attn_backends) == steps - 1
    fb = SimpleNamespace(req_pool_indices=torch.tensor(reqs), seq_lens=torch.tensor(seq_lens), batch_size=2,
                         out_cache_loc=None)
    multi.init_forward_metadata(fb)
    # draft slots as EAGLE lays them out: [bs, topk, steps] from req_to_token[seq_len:]
    slots = torch.stack([req_to_token[r, s : s + topk * steps] for r, s in zip(reqs, seq_lens)]).view(2, topk, steps)
    for step, backend in enumerate(multi.attn_backends):
        fb.out_cache_loc = slots[:, :, step].reshape(-1)
        q = torch.randn((2 * topk, HEADS * DIM), generator=gen)
        k = torch.randn((2 * topk, KV_HEADS * DIM), generator=gen)
        v = torch.randn((2 * topk, KV_HEADS * DIM), generator=gen)
        o = backend.forward_decode(q, k, v, LAYER, fb)
        for b in range(2):
            for t in range(topk):
                row = b * topk + t
                want_slots = req_to_token[reqs[b], : seq_lens[b]].tolist() + slots[b, t, : step + 1].tolist()
                want = _reference(q[row].view(HEADS, DIM), want_slots, pool)
                assert torch.allclose(o[row].view(HEADS, DIM).double(), want, atol=1e-5), (topk, step, b, t)
