"""Differential check: the torch ports against SGLang's own Triton kernels.

Run as a script in a fresh process with ``TRITON_INTERPRET=1`` (Triton's CPU
interpreter) and ``TORCHDYNAMO_DISABLE=1``; it feeds random but realistic inputs
(draft trees grown by SGLang's own ``select_top_k_tokens`` and
``organize_draft_results``) to each Triton kernel and to its port, and prints one
JSON line: ``{"cases": N, "mismatches": [...]}``. Used by
``test_contract.py::test_ports_match_triton_kernels_in_interpreter``.

    TRITON_INTERPRET=1 TORCHDYNAMO_DISABLE=1 python tests/sglang_cpu/triton_reference.py [seed] [rounds]
"""

from __future__ import annotations

import json
import os
import sys

import torch

from sglang_hvd.harness.server import STUBS_DIR

# As in the servers: the stubs are top-level packages (sgl_kernel is the strict stub).
sys.path.insert(0, STUBS_DIR)

from hvd_cpu_shims import kernels as K  # noqa: E402
from hvd_cpu_shims import sampling as S  # noqa: E402


def _grow_tree(gen, bs: int, topk: int, steps: int, n: int):
    """(parent_list, top_scores_index) as EagleDraftWorker.draft_forward produces them."""
    if topk == 1:
        width = steps if steps > 1 else 0
        return torch.arange(-1, width - 1).repeat(bs, 1), torch.arange(steps).repeat(bs, 1)
    from sglang.srt.speculative.eagle_utils import organize_draft_results
    from sglang.srt.speculative.spec_utils import select_top_k_tokens

    def proposal(rows):
        p = torch.rand((rows, topk), generator=gen) + 1e-3
        p = (p / p.sum(-1, keepdim=True)).sort(-1, descending=True).values
        return p, torch.randint(0, 50, (rows, topk), generator=gen)

    topk_p, topk_index = proposal(bs)
    hidden = torch.zeros((bs, 1))
    scores = None
    score_list, token_list, parents_list = [], [], []
    for i in range(steps):
        _, hidden, scores, info = select_top_k_tokens(i, topk_p, topk_index, hidden, scores, topk)
        score_list.append(info[0]), token_list.append(info[1]), parents_list.append(info[2])
        if i == steps - 1:
            break
        topk_p, topk_index = proposal(bs * topk)
    parent_list, top_scores_index, _ = organize_draft_results(score_list, token_list, parents_list, n)
    return parent_list, top_scores_index


def _tree(fn, parent_list, sel, seq_lens, topk, steps, n, mode):
    bs = seq_lens.numel()
    if mode == K.QLEN_ONLY:
        mask = torch.full((bs * n * n,), True)
    else:
        mask = torch.full((int(seq_lens.sum()) * n + bs * n * n,), True)
    retrieve = torch.full((3, bs, n), -1, dtype=torch.long)
    positions = torch.empty((bs * n,), dtype=torch.long)
    fn(parent_list, sel, seq_lens, mask, positions, retrieve[0], retrieve[1], retrieve[2], topk, steps, n, mode)
    return mask, positions, retrieve


def check_tree_and_verify(gen, mismatches: list, label: str, bs: int, topk: int, steps: int, n: int) -> None:
    from sglang.kernels.ops.speculative import spec_tree

    parent_list, sel = _grow_tree(gen, bs, topk, steps, n)
    seq_lens = torch.randint(1, 9, (bs,), generator=gen)
    for mode in (K.QLEN_ONLY, K.FULL_MASK):
        ref = _tree(spec_tree.sgl_build_tree_kernel_triton, parent_list, sel, seq_lens, topk, steps, n,
                    spec_tree.TreeMaskMode(mode))
        got = _tree(K.build_tree_kernel_efficient_cpu, parent_list, sel, seq_lens, topk, steps, n, mode)
        for name, a, b in zip(("tree_mask", "positions", "retrieve"), ref, got):
            if not torch.equal(a, b):
                mismatches.append(f"{label} mode={mode} build_tree {name}: triton {a.tolist()} port {b.tolist()}")
    _, _, retrieve = _tree(K.build_tree_kernel_efficient_cpu, parent_list, sel, seq_lens, topk, steps, n, K.QLEN_ONLY)
    candidates = torch.randint(0, 3, (bs, n), generator=gen)  # tiny vocab: many matches
    target = torch.randint(0, 3, (bs, n), generator=gen)
    outs = []
    for fn, kw in ((spec_tree.verify_tree_greedy_triton, "retrieve"), (K.verify_tree_greedy_cpu, "retrive")):
        predicts = torch.zeros(bs * n, dtype=torch.int32)
        accept_index = torch.full((bs, steps + 1), -1, dtype=torch.int32)
        accept_num = torch.full((bs,), -5, dtype=torch.int32)
        fn(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num, candidates=candidates,
           target_predict=target, **{f"{kw}_index": retrieve[0], f"{kw}_next_token": retrieve[1],
                                     f"{kw}_next_sibling": retrieve[2]})
        outs.append((predicts, accept_index, accept_num))
    for name, a, b in zip(("predicts", "accept_index", "accept_token_num"), *outs):
        if not torch.equal(a, b):
            mismatches.append(f"{label} verify {name}: triton {a.tolist()} port {b.tolist()}")


def check_simple_kernels(gen, mismatches: list, label: str) -> None:
    from sglang.kernels.ops.speculative import cache_locs, eagle
    from sglang.srt.mem_cache import allocation
    from sglang.srt.utils import next_power_of_2

    bs, pool_len = int(torch.randint(1, 5, (1,), generator=gen)), 32
    r2t = torch.randint(0, 1000, (6, pool_len), generator=gen, dtype=torch.int32)
    reqs = torch.randperm(6, generator=gen)[:bs]
    topk, steps = int(torch.randint(1, 3, (1,), generator=gen)), int(torch.randint(1, 4, (1,), generator=gen))
    seq = torch.randint(0, pool_len - topk * steps, (bs,), generator=gen)

    ref, got = (torch.full((bs * topk * steps,), -1, dtype=torch.int64) for _ in range(2))
    cache_locs.assign_draft_cache_locs_contiguous[(bs,)](reqs, r2t, seq, ref, pool_len, topk, steps)
    K.assign_draft_cache_locs_contiguous_cpu(reqs, r2t, seq, got, pool_len, topk, steps)
    if not torch.equal(ref, got):
        mismatches.append(f"{label} assign_draft_cache_locs_contiguous: triton {ref.tolist()} port {got.tolist()}")

    start = torch.randint(0, 16, (bs,), generator=gen)
    end = start + torch.randint(0, 16, (bs,), generator=gen)
    total = int((end - start).sum())
    ref, got = (torch.full((total,), -1, dtype=torch.int64) for _ in range(2))
    cache_locs.assign_extend_cache_locs[(bs,)](reqs, r2t, start, end, ref, pool_len, next_power_of_2(bs))
    K.assign_extend_cache_locs_cpu(reqs, r2t, start, end, got, pool_len)
    if not torch.equal(ref, got):
        mismatches.append(f"{label} assign_extend_cache_locs: triton {ref.tolist()} port {got.tolist()}")

    src = torch.randint(0, 1000, (total,), generator=gen)
    ref, got = r2t.clone(), r2t.clone()
    allocation.assign_req_to_token_pool[(bs,)](reqs, ref, start, end, src, pool_len, next_power_of_2(bs))
    K.assign_req_to_token_pool_cpu(reqs, got, start, end, src, pool_len)
    if not torch.equal(ref, got):
        mismatches.append(f"{label} assign_req_to_token_pool: differs")

    width = steps + 1
    accept_tokens = torch.randint(0, 1000, (bs * width,), generator=gen, dtype=torch.int32)
    accept_lens = torch.randint(1, width + 1, (bs,), generator=gen, dtype=torch.int32)
    ref, got = (torch.full((bs,), -1, dtype=torch.int32) for _ in range(2))
    eagle.fill_bonus_tokens[(bs,)](accept_tokens, accept_lens, ref, width)
    K.fill_bonus_tokens_cpu(accept_tokens, accept_lens, got, width)
    if not torch.equal(ref, got):
        mismatches.append(f"{label} fill_bonus_tokens: triton {ref.tolist()} port {got.tolist()}")

    n = width + topk
    accept_index = torch.full((bs, width), -1, dtype=torch.int32)
    for b in range(bs):
        k = int(accept_lens[b])
        accept_index[b, :k] = (b * n + torch.randperm(n, generator=gen)[:k].sort().values).to(torch.int32)
    out_cache_loc = torch.randint(0, 1000, (bs * n,), generator=gen)
    ref, got = (torch.zeros(bs * width, dtype=torch.int64) for _ in range(2))
    size = accept_index.numel()
    eagle.fill_accept_out_cache_loc[(size,)](accept_index, out_cache_loc, ref, next_power_of_2(size))
    K.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, got)
    if not torch.equal(ref, got):
        mismatches.append(f"{label} fill_accept_out_cache_loc: triton {ref.tolist()} port {got.tolist()}")


def check_renorm(gen, mismatches: list, label: str) -> None:
    """The sampling verify's top-k / top-p renorm ports against SGLang's Triton fallbacks
    (``renorm_triton``; its CUDA-tensor check is bypassed: the interpreter runs on CPU
    tensors). Rows with ties (repeated values) and with a dominant token."""
    from sglang.kernels.ops.sampling import renorm_triton

    renorm_triton._prepare_probs = lambda probs: probs.float().contiguous()
    rows, vocab = int(torch.randint(1, 6, (1,), generator=gen)), int(torch.randint(2, 3000, (1,), generator=gen))
    logits = torch.randn((rows, vocab), generator=gen) * float(torch.rand((1,), generator=gen) * 6)
    logits[0, : vocab // 2] = logits[0, 0]  # ties
    probs = torch.softmax(logits, dim=-1)
    top_ks = torch.randint(1, vocab + 2, (rows,), generator=gen)
    top_ps = torch.rand((rows,), generator=gen).clamp(min=0.05)
    for name, ref, got in (("top_k", renorm_triton.top_k_renorm_probs_triton(probs, top_ks),
                            S.top_k_renorm_prob(probs, top_ks)),
                           ("top_p", renorm_triton.top_p_renorm_probs_triton(probs, top_ps),
                            S.top_p_renorm_prob(probs, top_ps))):
        if not torch.allclose(ref, got, rtol=1e-5, atol=1e-7) or not torch.equal(ref > 0, got > 0):
            mismatches.append(f"{label} {name}_renorm: max difference {float((ref - got).abs().max()):.3g}, "
                              f"kept {int((ref > 0).sum())} (triton) vs {int((got > 0).sum())} (port)")


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET") != "1":
        print(json.dumps({"error": "run with TRITON_INTERPRET=1"}))
        return 2
    seed = int(argv[0]) if argv else 0
    rounds = int(argv[1]) if len(argv) > 1 else 8
    gen = torch.Generator().manual_seed(seed)
    mismatches: list[str] = []
    cases = 0
    shapes = [(1, 1, 3, 4), (3, 1, 4, 5), (2, 2, 3, 6), (2, 2, 3, 4), (3, 3, 2, 7), (2, 2, 4, 10)]
    for r in range(rounds):
        for bs, topk, steps, n in shapes:
            check_tree_and_verify(gen, mismatches, f"round {r} bs={bs} topk={topk} steps={steps} n={n}",
                                  bs, topk, steps, n)
            cases += 1
        check_simple_kernels(gen, mismatches, f"round {r}")
        check_renorm(gen, mismatches, f"round {r}")
        cases += 2
    print(json.dumps({"cases": cases, "mismatches": mismatches[:20]}))
    return 0 if not mismatches else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
