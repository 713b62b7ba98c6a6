"""Torch ports of the sgl_kernel CPU kernels that SGLang's speculative path calls.

SGLang 0.5.23 binds these names at import time when ``SGLANG_USE_CPU_ENGINE=1``
(``from sgl_kernel import X`` under ``if _is_cpu:``). The real ones live in the
C++ CPU build of sgl-kernel, which this machine does not have. Each port copies
the semantics of the Triton kernel of the same job that sits next to the call
site (the Triton version is what runs on a GPU):

=====================================  ==================================================
port                                   call site (Triton twin in the same file)
=====================================  ==================================================
build_tree_kernel_efficient_cpu        kernels/ops/speculative/spec_tree.py
verify_tree_greedy_cpu                 kernels/ops/speculative/spec_tree.py
assign_draft_cache_locs_contiguous_cpu kernels/ops/speculative/cache_locs.py
assign_extend_cache_locs_cpu           kernels/ops/speculative/cache_locs.py
assign_req_to_token_pool_cpu           srt/mem_cache/allocation.py
fill_bonus_tokens_cpu                  kernels/ops/speculative/eagle.py
fill_accept_out_cache_loc_cpu          kernels/ops/speculative/eagle.py
copy_all_layer_kv_cache_cpu            kernels/ops/kvcache/cache_move.py
=====================================  ==================================================

All of them write their outputs in place, like the kernels, and return None.
They favour obviously-correct loops over speed: batches here are tiny.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

# TreeMaskMode values (sglang.kernels.ops.speculative.spec_tree.TreeMaskMode).
FULL_MASK = 0
QLEN_ONLY = 1
QLEN_ONLY_BITPACKING = 2

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "verify_tree_greedy_cpu",
]


def _ints(t: torch.Tensor) -> list:
    return t.detach().to("cpu", torch.int64).tolist()


# --------------------------------------------------------------------------- tree


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,  # mutable
    positions: torch.Tensor,  # mutable
    retrive_index: torch.Tensor,  # mutable
    retrive_next_token: torch.Tensor,  # mutable
    retrive_next_sibling: torch.Tensor,  # mutable
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Port of ``sgl_build_tree_kernel_efficient_triton``.

    Builds, per request, the verify tree of ``draft_token_num`` nodes (node 0 is the
    bonus/root token, nodes 1.. are the drafts picked by ``selected_index``):
    ``retrive_index`` (global node id), the first-child / next-sibling linked lists,
    each node's absolute position and its attention mask row.

    ``tree_mask`` layouts: FULL_MASK is ``[seq_len + n]`` columns per row for each
    request, back to back (the prefix columns are left as the caller filled them);
    QLEN_ONLY is ``n x n`` per request. Column 0 of the draft part is the root.
    """
    mode = int(tree_mask_mode)
    if mode not in (FULL_MASK, QLEN_ONLY):
        raise NotImplementedError(f"build_tree_kernel_efficient_cpu port: tree_mask_mode={mode} "
                                  "(only FULL_MASK=0 and QLEN_ONLY=1)")
    n = int(draft_token_num)
    topk = int(topk)
    depth = int(depth)
    seq_lens = _ints(verified_seq_len.flatten())
    bs = len(seq_lens)
    sel = _ints(selected_index.reshape(bs, -1)) if bs else []
    par = _ints(parent_list.reshape(bs, -1)) if bs else []

    mask = tree_mask.view(-1)
    pos = positions.view(-1)
    r_index = retrive_index.view(bs, n) if bs else retrive_index
    r_next = retrive_next_token.view(bs, n) if bs else retrive_next_token
    r_sib = retrive_next_sibling.view(bs, n) if bs else retrive_next_sibling

    prefix_sum = 0
    for b in range(bs):
        seq_len = seq_lens[b]
        seq_tree_idx = n * n * b + prefix_sum * n
        prefix_sum += seq_len
        sel_b, par_b = sel[b], par[b]

        def find(token_idx: int) -> int:
            for pp in range(n - 1):
                if sel_b[pp] == token_idx:
                    return pp
            return -1

        next_tok = _ints(r_next[b])
        next_sib = _ints(r_sib[b])
        rindex = _ints(r_index[b])
        node_pos = _ints(pos[b * n : (b + 1) * n])
        node_pos[0] = seq_len
        # Linked lists, built from the last node back (so siblings end up in order).
        for i in range(n - 1, 0, -1):
            rindex[i] = b * n + i
            parent_tb_idx = sel_b[i - 1] // topk
            if parent_tb_idx == 0:
                parent_position = 0
            else:
                found = find(par_b[parent_tb_idx])
                if found < 0:
                    continue
                parent_position = found + 1
            if next_tok[parent_position] != -1:
                next_sib[i] = next_tok[parent_position]
            next_tok[parent_position] = i
        rindex[0] = b * n

        rows = []
        for x in range(n):
            row = [0] * n
            row[0] = 1
            if x > 0:
                cur_position = x - 1
                position = 0
                for _ in range(depth):
                    position += 1
                    row[cur_position + 1] = 1
                    parent_tb_idx = sel_b[cur_position] // topk
                    if parent_tb_idx == 0:
                        break
                    found = find(par_b[parent_tb_idx])
                    if found < 0:
                        break
                    cur_position = found
                node_pos[x] = position + seq_len
            rows.append(row)

        r_index[b] = torch.tensor(rindex, dtype=r_index.dtype)
        r_next[b] = torch.tensor(next_tok, dtype=r_next.dtype)
        r_sib[b] = torch.tensor(next_sib, dtype=r_sib.dtype)
        pos[b * n : (b + 1) * n] = torch.tensor(node_pos, dtype=pos.dtype)
        block = torch.tensor(rows, dtype=mask.dtype)
        if mode == QLEN_ONLY:
            mask[n * n * b : n * n * (b + 1)] = block.view(-1)
        else:
            width = seq_len + n
            for x in range(n):
                start = seq_tree_idx + width * x + seq_len
                mask[start : start + n] = block[x]


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,  # mutable, flat [bs * n]
    accept_index: torch.Tensor,  # mutable, [bs, spec_steps + 1]
    accept_token_num: torch.Tensor,  # mutable, [bs]
    candidates: torch.Tensor,  # [bs, n]
    retrive_index: torch.Tensor,  # [bs, n]
    retrive_next_token: torch.Tensor,  # [bs, n]
    retrive_next_sibling: torch.Tensor,  # [bs, n]
    target_predict: torch.Tensor,  # [bs, n]
) -> None:
    """Port of ``verify_tree_greedy_kernel_triton``.

    Walks each request's tree from the root: at every level it looks among the
    children of the last accepted node for the target's argmax token; a match is
    accepted (its global index appended to ``accept_index``, the target token written
    to ``predicts`` at the parent's slot). ``accept_token_num`` counts accepted drafts
    (the bonus excluded); the target token after the last accepted node is written to
    ``predicts`` at that node. Unaccepted ``accept_index`` entries are left untouched
    (the caller fills them with -1).
    """
    bs, n = candidates.shape[0], candidates.shape[1]
    num_spec = accept_index.shape[1]
    cand = _ints(candidates.reshape(bs, n))
    rindex = _ints(retrive_index.reshape(bs, n))
    rnext = _ints(retrive_next_token.reshape(bs, n))
    rsib = _ints(retrive_next_sibling.reshape(bs, n))
    target = _ints(target_predict.reshape(-1))

    pred_idx, pred_val = [], []
    acc_rows, acc_cols, acc_vals = [], [], []
    counts = []
    for bx in range(bs):
        last = rindex[bx][0]
        acc_rows.append(bx), acc_cols.append(0), acc_vals.append(last)
        num_accept = 0
        cur = 0
        for _ in range(1, num_spec):
            cur = rnext[bx][cur]
            target_token = target[last]
            matched = False
            for _ in range(n):
                if cur == -1:
                    break
                if cand[bx][cur] == target_token:
                    draft_index = rindex[bx][cur]
                    pred_idx.append(last), pred_val.append(target_token)
                    num_accept += 1
                    acc_rows.append(bx), acc_cols.append(num_accept), acc_vals.append(draft_index)
                    last = draft_index
                    matched = True
                    break
                cur = rsib[bx][cur]
            if not matched:
                break
        counts.append(num_accept)
        pred_idx.append(last), pred_val.append(target[last])

    if bs:
        flat_pred = predicts.view(-1)
        flat_pred[torch.tensor(pred_idx, dtype=torch.long)] = torch.tensor(pred_val, dtype=flat_pred.dtype)
        accept_index[torch.tensor(acc_rows), torch.tensor(acc_cols)] = torch.tensor(acc_vals, dtype=accept_index.dtype)
        accept_token_num.view(-1)[:bs] = torch.tensor(counts, dtype=accept_token_num.dtype)


# ---------------------------------------------------------------------- cache locs


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,  # mutable
    pool_len: int,
    topk: int,
    speculative_num_steps: int,
) -> None:
    """Port of ``assign_draft_cache_locs_contiguous`` (no positions/mrope on the CPU):
    request i's ``topk * steps`` slots ``req_to_token[req, seq_len : seq_len + topk*steps]``
    go to ``out_cache_loc[i*topk*steps : (i+1)*topk*steps]``."""
    assert req_to_token.shape[1] == pool_len, (req_to_token.shape, pool_len)
    copy_len = int(topk) * int(speculative_num_steps)
    flat = out_cache_loc.view(-1)
    for i, (req, start) in enumerate(zip(_ints(req_pool_indices), _ints(seq_lens))):
        flat[i * copy_len : (i + 1) * copy_len] = req_to_token[req, start : start + copy_len].to(flat.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,  # mutable
    pool_len: int,
) -> None:
    """Port of ``assign_extend_cache_locs``: gathers ``req_to_token[req, start:end]`` of
    every request, back to back, into ``out_cache_loc``."""
    assert req_to_token.shape[1] == pool_len, (req_to_token.shape, pool_len)
    flat = out_cache_loc.view(-1)
    offset = 0
    for req, start, end in zip(_ints(req_pool_indices), _ints(start_offset), _ints(end_offset)):
        length = end - start
        if length > 0:
            flat[offset : offset + length] = req_to_token[req, start:end].to(flat.dtype)
            offset += length


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,  # mutable
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Port of ``assign_req_to_token_pool``: the inverse scatter of
    ``assign_extend_cache_locs``: ``req_to_token[req, start:end] = out_cache_loc[...]``."""
    assert req_to_token.shape[1] == pool_len, (req_to_token.shape, pool_len)
    flat = out_cache_loc.view(-1)
    offset = 0
    for req, start, end in zip(_ints(req_pool_indices), _ints(start_offset), _ints(end_offset)):
        length = end - start
        if length > 0:
            req_to_token[req, start:end] = flat[offset : offset + length].to(req_to_token.dtype)
            offset += length


# ------------------------------------------------------------------------ accepts


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,  # mutable
    accept_stride: int,
) -> None:
    """Port of ``fill_bonus_tokens``: ``bonus[i] = accept_tokens.flat[stride*i + len[i] - 1]``
    (``accept_lens`` counts the bonus, so the last accepted slot holds it)."""
    lens = accept_lens.view(-1).to(torch.long)
    bs = lens.numel()
    if bs == 0:
        return
    idx = torch.arange(bs, dtype=torch.long) * int(accept_stride) + lens - 1
    bonus_tokens.view(-1)[:bs] = accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype)


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,  # mutable
) -> None:
    """Port of ``fill_accept_out_cache_loc``: compacts ``out_cache_loc[accept_index]``
    over the entries of ``accept_index`` (flattened) that are not -1, in order, into
    the front of ``accept_out_cache_loc``; the rest is left untouched."""
    flat = accept_index.reshape(-1).to(torch.long)
    keep = flat[flat > -1]
    if keep.numel():
        accept_out_cache_loc.view(-1)[: keep.numel()] = out_cache_loc.view(-1)[keep].to(accept_out_cache_loc.dtype)


# ------------------------------------------------------------------------ kv copy


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """Port of ``copy_all_layer_kv_cache_tiled``: for every buffer ``b`` (base address
    ``data_ptrs[b]``, row size ``strides[b]`` bytes) copy row ``src_loc[j]`` to row
    ``tgt_loc[j]``. Like the Triton kernel, all source rows are read before any target
    row is written, so overlapping moves are safe."""
    tgt = np.asarray(_ints(tgt_loc.view(-1)), dtype=np.int64)
    src = np.asarray(_ints(src_loc.view(-1)), dtype=np.int64)
    if tgt.size == 0:
        return
    if tgt.size != src.size:
        raise ValueError(f"copy_all_layer_kv_cache_cpu port: {tgt.size} targets but {src.size} sources")
    rows = int(max(tgt.max(), src.max())) + 1
    for ptr, stride in zip(_ints(data_ptrs.view(-1)), _ints(strides.view(-1))):
        if ptr == 0:
            raise ValueError("copy_all_layer_kv_cache_cpu port: null buffer pointer")
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(ptr)
        buf = np.ctypeslib.as_array(raw).reshape(rows, stride)
        buf[tgt] = buf[src]  # fancy indexing on the right copies first
