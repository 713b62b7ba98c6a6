"""Sampling verify on the CPU: what a GPU does when a request's temperature is above 0.

SGLang 0.5.23 commits the argmax in EAGLE verify whenever it runs on the CPU
(``eagle_utils._verify_uses_greedy(is_cpu=True)``), and the CPU has none of the three
ops the sampling path calls: ``tree_speculative_sampling_target_only`` (a CUDA JIT
kernel, ``kernels/jit/include/sgl_kernel/speculative/sampling.cuh``) and FlashInfer's
``top_k_renorm_probs`` / ``top_p_renorm_probs``. ``patch_eagle_utils`` drops the CPU
clause of that predicate (greedy requests still go greedy: ``is_all_greedy``) and binds
the torch ports below in ``eagle_utils``, so verify samples as it does on a GPU.

The tree kernel, per request (a point-mass draft: ``draft_probs`` are zeros):
walk the tree from the root; at each level try the children in sibling order with one
coin ``u`` (drawn at the last accepted node), accumulating their target probabilities:
child ``c`` is accepted when ``u < acc / threshold_acc`` (or its own probability reaches
``threshold_single``), so with thresholds 1 each child is taken with exactly its target
probability. A rejected child's probability is copied into ``draft_probs``, and the
token after the last accepted node is drawn (with the final coin) from
``relu(target - draft_probs)``: the target without the rejected siblings, renormalised.
With no draft probabilities for the bonus position (every level accepted) the target
itself. Ported line by line; the renorm ports follow SGLang's own Triton fallbacks
(``kernels/ops/sampling/renorm_triton.py``, FlashInfer's pivot semantics, ties kept),
which ``triton_reference.py`` runs against them in Triton's CPU interpreter.

Deliberately wrong verifies, which the statistical tests must reject:
``HVD_TEST_VERIFY_FAULT=accept_draft`` accepts every first child; ``keep_rejected``
draws the token after a rejection from the whole target row (the rejected children
not taken out: they come out too often).
"""

from __future__ import annotations

import os

import torch

FAULT_FLAG = "HVD_TEST_VERIFY_FAULT"
FAULTS = ("accept_draft", "keep_rejected")


def _fault() -> str:
    fault = os.environ.get(FAULT_FLAG, "")
    if fault and fault not in FAULTS:
        raise ValueError(f"{FAULT_FLAG}={fault!r}: known faults are {', '.join(FAULTS)}")
    return fault


def _per_row(value, rows: int, dtype) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        value = value.to(dtype).reshape(-1)
        return value.expand(rows) if value.numel() == 1 else value
    return torch.full((rows,), value, dtype=dtype)


def _renorm_from_pivots(probs: torch.Tensor, pivots: torch.Tensor) -> torch.Tensor:
    kept = torch.where(probs >= pivots.unsqueeze(1), probs, torch.zeros_like(probs))
    return kept / kept.sum(dim=1, keepdim=True)


def top_k_renorm_prob(probs: torch.Tensor, top_ks) -> torch.Tensor:
    """Keep each row's ``k`` highest probabilities (and ties with the k-th); renormalise."""
    probs = probs.float().contiguous()
    rows, vocab = probs.shape
    if rows == 0 or vocab == 0:
        return probs
    cutoff = (_per_row(top_ks, rows, torch.int64) - 1).clamp(min=0, max=vocab - 1)
    pivots = torch.sort(probs, dim=-1, descending=True).values.gather(1, cutoff.unsqueeze(1)).squeeze(1)
    return _renorm_from_pivots(probs, pivots)


def top_p_renorm_prob(probs: torch.Tensor, top_ps) -> torch.Tensor:
    """Drop the least likely tokens whose mass stays below ``1 - p`` (ties with the pivot
    kept); renormalise."""
    probs = probs.float().contiguous()
    rows, vocab = probs.shape
    if rows == 0 or vocab == 0:
        return probs
    ascending = torch.sort(probs, dim=-1).values
    cdf = torch.cumsum(ascending, dim=-1)
    limit = (1.0 - _per_row(top_ps, rows, torch.float32)).unsqueeze(1)
    cutoff = torch.searchsorted(cdf, limit, right=False).squeeze(1).clamp(max=vocab - 1)
    pivots = ascending.gather(1, cutoff.unsqueeze(1)).squeeze(1)
    return _renorm_from_pivots(probs, pivots)


def _sample_residual(target: torch.Tensor, draft: torch.Tensor | None, coin: float) -> int:
    """The first token whose running sum of ``relu(target - draft)`` exceeds
    ``coin * total`` (the kernel's DeviceSamplingFromProb; the last positive one when
    rounding leaves none, ``d - 1`` when all are 0)."""
    residual = target if draft is None else (target - draft).clamp(min=0.0)
    total = float(residual.sum())
    u = coin * total
    above = torch.nonzero((torch.cumsum(residual, 0) > u) & (residual > 0))
    if above.numel():
        return int(above[0])
    positive = torch.nonzero(residual > 0)
    return int(positive[-1]) if positive.numel() else target.numel() - 1


def tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, uniform_samples,
                                          uniform_samples_for_final_sampling, target_probs, draft_probs,
                                          threshold_single: float = 1.0, threshold_acc: float = 1.0,
                                          deterministic: bool = True) -> None:
    """In place, as the CUDA kernel: ``predicts`` [bs * n] (the accepted tokens and the
    sampled one after them, at their retrieve positions), ``accept_index`` [bs, steps]
    (positions of the root and each accepted node), ``accept_token_num`` [bs] (accepted
    draft tokens, the root not counted); ``draft_probs`` gains the rejected children's
    target probabilities."""
    fault = _fault()
    accept_draft = fault == "accept_draft"
    batch, nodes = candidates.shape
    spec_tokens = accept_index.shape[1]
    threshold_acc = max(float(threshold_acc), 1e-9)
    cand, index = candidates.tolist(), retrive_index.tolist()
    next_token, next_sibling = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    coins, final_coins = uniform_samples.tolist(), uniform_samples_for_final_sampling.tolist()
    for b in range(batch):
        prob_node, prob_acc, coin = 0, 0.0, coins[b][0]
        last = index[b][0]
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, spec_tokens):
            cur = next_token[b][cur]
            while cur != -1:
                token = cand[b][cur]
                p = float(target_probs[b, prob_node, token])
                prob_acc += p
                if accept_draft or (p > 0 and (coin < prob_acc / threshold_acc or p >= threshold_single)):
                    prob_acc, prob_node, coin = 0.0, cur, coins[b][cur]
                    predicts[last] = token
                    accepted += 1
                    accept_index[b, accepted] = index[b][cur]
                    last = index[b][cur]
                    break
                draft_probs[b, prob_node, token] = target_probs[b, prob_node, token]
                cur = next_sibling[b][cur]
            if cur == -1:
                break
        accept_token_num[b] = accepted
        draft = None if accepted == spec_tokens - 1 or fault == "keep_rejected" else draft_probs[b, prob_node]
        predicts[last] = _sample_residual(target_probs[b, prob_node], draft, final_coins[b])


def patch_eagle_utils(module) -> None:
    """Sampling verify on the CPU: the greedy predicate without its CPU clause, and the ports."""
    original = module._verify_uses_greedy
    if getattr(original, "hvd_cpu_shim", False):
        return

    def _verify_uses_greedy(*, is_all_greedy, is_cpu, is_hip, is_xpu, use_rejection_sampling):
        return original(is_all_greedy=is_all_greedy, is_cpu=False, is_hip=is_hip, is_xpu=is_xpu,
                        use_rejection_sampling=use_rejection_sampling)

    _verify_uses_greedy.hvd_cpu_shim = True
    module._verify_uses_greedy = _verify_uses_greedy
    module.tree_speculative_sampling_target_only = tree_speculative_sampling_target_only
    module.top_k_renorm_prob = top_k_renorm_prob
    module.top_p_renorm_prob = top_p_renorm_prob
