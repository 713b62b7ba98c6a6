"""The two torch_native attention additions EAGLE3 needs on the CPU (tests only).

1. ``TARGET_VERIFY`` in ``TorchNativeAttnBackend.forward_extend``. The stock method
   reads ``forward_batch.extend_prefix_lens``, which is None in verify mode. The
   patched method handles verify itself: each request's ``draft_token_num`` query
   tokens see the whole committed prefix plus the draft tokens their tree-mask row
   allows (the CPU builds a QLEN_ONLY ``n x n`` mask per request; a FULL_MASK layout
   is accepted too). A one-node verify (SGLang's steps-0 verify: HVD's ``off`` tier)
   reads no mask and runs unmasked, as a decode step does. Every other mode goes to
   the original method.

2. A torch_native multi-step draft-decode backend. ``DraftBackendFactory`` maps
   the CPU only to ``intel_amx`` (which needs the sgl_kernel CPU build), so startup
   fails with "EAGLE is not supported in decode attention backend torch_native".
   ``patch_draft_backend_factory`` adds ``torch_native`` entries: the multi-step
   ``TorchNativeMultiStepDraftBackend`` for draft decode and a plain
   ``TorchNativeAttnBackend`` for draft extend. Draft decode step ``s`` of branch
   ``t`` of request ``b`` attends to the request's prefix and to the branch's own
   slots ``req_to_token[b, seq_len + t*num_steps + 0..s]``, the layout of
   ``assign_draft_cache_locs_contiguous`` and ``generate_draft_decode_kv_indices``
   (page size 1).

Classes are built lazily (``classes()``) because they subclass SGLang's backend,
which must not be imported before SGLang sets itself up.
"""

from __future__ import annotations

import functools

import torch
from torch.nn.functional import scaled_dot_product_attention

PATCH_MARK = "_hvd_cpu_shim"


def _check_layer(layer) -> None:
    if getattr(layer, "is_cross_attention", False):
        raise NotImplementedError("hvd_cpu_shims: cross-attention in speculative torch_native paths")
    window = getattr(layer, "sliding_window_size", None)
    if window is not None and window > -1:
        raise NotImplementedError("hvd_cpu_shims: sliding-window layers in speculative torch_native paths")


def _verify_mask_rows(custom_mask, bs: int, n: int, seq_lens: list[int]):
    """Per request, the ``n x n`` draft-part mask (True = may attend), or None (causal)."""
    if custom_mask is None or custom_mask.numel() == 0:
        return None
    flat = custom_mask.reshape(-1).to(torch.bool)
    if flat.numel() == bs * n * n:  # QLEN_ONLY
        return [flat[i * n * n : (i + 1) * n * n].view(n, n) for i in range(bs)]
    full = sum((s + n) * n for s in seq_lens)
    if flat.numel() >= full:  # FULL_MASK: rows of (seq_len + n) columns per request
        rows, start = [], 0
        for s in seq_lens:
            block = flat[start : start + (s + n) * n].view(n, s + n)
            rows.append(block[:, s:])
            start += (s + n) * n
        return rows
    raise ValueError(f"hvd_cpu_shims: verify custom_mask has {flat.numel()} entries; "
                     f"expected {bs * n * n} (QLEN_ONLY) or {full} (FULL_MASK)")


def target_verify_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
    """TARGET_VERIFY attention for ``TorchNativeAttnBackend`` (see module doc)."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    _check_layer(layer)
    if layer.qk_head_dim != layer.v_head_dim:
        o = q.new_empty((q.shape[0], layer.tp_q_head_num * layer.v_head_dim))
    else:
        o = torch.empty_like(q)
    if save_kv_cache and k is not None and v is not None:
        self.token_to_kv_pool.set_kv_buffer(
            layer, KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v)

    spec_info = forward_batch.spec_info
    if spec_info is None:
        raise RuntimeError("hvd_cpu_shims: TARGET_VERIFY batch without spec_info")
    n = int(spec_info.draft_token_num)
    seq_lens = forward_batch.seq_lens.tolist()
    bs = len(seq_lens)
    # one query token a row (a one-node verify) sees every key: no mask, as a decode step
    masks = _verify_mask_rows(getattr(spec_info, "custom_mask", None), bs, n, seq_lens) if n > 1 else None

    q_ = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
    o_ = o.view(-1, layer.tp_q_head_num, layer.v_head_dim)
    k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
    v_cache = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
    req_to_token = self.req_to_token_pool.req_to_token
    use_gqa = layer.tp_q_head_num != layer.tp_k_head_num
    reqs = forward_batch.req_pool_indices.tolist()
    for i, prefix in enumerate(seq_lens):
        tokens = req_to_token[reqs[i], : prefix + n]
        key = k_cache[tokens].movedim(0, 1).unsqueeze(0)  # [1, heads, kv, dim]
        value = v_cache[tokens].movedim(0, 1).unsqueeze(0)
        query = q_[i * n : (i + 1) * n].movedim(0, 1).unsqueeze(0)  # [1, heads, n, dim]
        if key.dtype != query.dtype:
            key, value = key.to(query.dtype), value.to(query.dtype)
        mask = None
        if n > 1:
            mask = torch.ones((n, prefix + n), dtype=torch.bool, device=query.device)
            if masks is None:
                mask[:, prefix:] = torch.ones((n, n), dtype=torch.bool, device=query.device).tril()
            else:
                mask[:, prefix:] = masks[i]
        out = scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=layer.scaling, enable_gqa=use_gqa)
        o_[i * n : (i + 1) * n] = out.squeeze(0).movedim(1, 0)
    return o


def patch_torch_native_backend(module) -> None:
    """Give ``TorchNativeAttnBackend.forward_extend`` a TARGET_VERIFY branch."""
    cls = module.TorchNativeAttnBackend
    original = cls.forward_extend
    if getattr(original, PATCH_MARK, False):
        return

    @functools.wraps(original)
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, *args, **kwargs):
        if forward_batch.forward_mode.is_target_verify():
            return target_verify_extend(self, q, k, v, layer, forward_batch, save_kv_cache)
        return original(self, q, k, v, layer, forward_batch, save_kv_cache, *args, **kwargs)

    setattr(forward_extend, PATCH_MARK, True)
    cls.forward_extend = forward_extend


@functools.cache
def classes():
    """(TorchNativeDraftStepBackend, TorchNativeMultiStepDraftBackend), built on first use."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    class TorchNativeDraftStepBackend(TorchNativeAttnBackend):
        """One draft-decode step: decode attention over a per-branch KV table."""

        def __init__(self, model_runner):
            super().__init__(model_runner)
            # (req_to_token table [bs*topk, width], seq_lens [bs*topk], row ids [bs*topk])
            self.draft_decode_metadata = None

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, *args, **kwargs):
            if self.draft_decode_metadata is None:
                return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, *args, **kwargs)
            _check_layer(layer)
            table, seq_lens, rows = self.draft_decode_metadata
            q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)
            if layer.qk_head_dim != layer.v_head_dim:
                o = q.new_empty((q.shape[0], layer.tp_q_head_num * layer.v_head_dim))
            else:
                o = torch.empty_like(q)
            if save_kv_cache and k is not None and v is not None:
                self.token_to_kv_pool.set_kv_buffer(
                    layer, KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v)
            if q.shape[0] != seq_lens.shape[0]:
                raise RuntimeError(f"hvd_cpu_shims: draft decode step got {q.shape[0]} queries "
                                   f"for {seq_lens.shape[0]} branches")
            self._run_sdpa_forward_decode(
                q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
                o.view(-1, layer.tp_q_head_num, layer.v_head_dim),
                self.token_to_kv_pool.get_key_buffer(layer.layer_id),
                self.token_to_kv_pool.get_value_buffer(layer.layer_id),
                table,
                rows,
                seq_lens,
                None,
                scaling=layer.scaling,
                enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num,
                causal=False,
                is_cross_attn=False,
                sliding_window_size=None,
            )
            return o

    class TorchNativeMultiStepDraftBackend:
        """The ``speculative_num_steps - 1`` draft-decode steps, one backend each
        (the interface of ``IntelAMXMultiStepDraftBackend``)."""

        def __init__(self, model_runner, topk: int, speculative_num_steps: int):
            page_size = getattr(model_runner, "page_size", 1) or 1
            if page_size != 1:
                raise NotImplementedError("hvd_cpu_shims: the torch_native draft-decode backend lays out draft slots "
                                          f"for page size 1, not {page_size}")
            self.topk = int(topk)
            self.speculative_num_steps = int(speculative_num_steps)
            self.device = model_runner.device
            self.attn_backends = [TorchNativeDraftStepBackend(model_runner)
                                  for _ in range(self.speculative_num_steps - 1)]

        def init_forward_metadata(self, forward_batch) -> None:
            table, seq_lens, rows = draft_decode_table(
                self.attn_backends[0].req_to_token_pool.req_to_token,
                forward_batch.req_pool_indices,
                forward_batch.seq_lens,
                self.topk,
                self.speculative_num_steps,
            )
            for step, backend in enumerate(self.attn_backends):
                backend.init_forward_metadata(forward_batch)
                backend.draft_decode_metadata = (table, seq_lens + step + 1, rows)

    return TorchNativeDraftStepBackend, TorchNativeMultiStepDraftBackend


def draft_decode_table(req_to_token, req_pool_indices, seq_lens, topk: int, num_steps: int):
    """Per draft branch, the KV slots of its prefix then of its own chain.

    Row ``b*topk + t`` is ``req_to_token[req_b, :seq_b]`` followed by
    ``req_to_token[req_b, seq_b + t*num_steps : seq_b + (t+1)*num_steps]``. Returns the
    table (``[bs*topk, max(seq) + num_steps]``, int64), the prefix lengths repeated per
    branch and the row ids ``0..bs*topk-1``.
    """
    lens = [int(x) for x in seq_lens.tolist()]
    reqs = [int(x) for x in req_pool_indices.tolist()]
    width = (max(lens) if lens else 0) + num_steps
    table = torch.zeros((len(lens) * topk, width), dtype=torch.int64, device=req_to_token.device)
    for b, (req, length) in enumerate(zip(reqs, lens)):
        for t in range(topk):
            row = table[b * topk + t]
            row[:length] = req_to_token[req, :length]
            start = length + t * num_steps
            row[length : length + num_steps] = req_to_token[req, start : start + num_steps]
    expanded = torch.tensor(lens, dtype=torch.int64, device=req_to_token.device).repeat_interleave(topk)
    rows = torch.arange(len(lens) * topk, dtype=torch.int64, device=req_to_token.device)
    return table, expanded, rows


def patch_draft_backend_factory(module) -> None:
    """Teach ``DraftBackendFactory`` the ``torch_native`` backend."""
    cls = module.DraftBackendFactory
    original = cls._create_backend
    if getattr(original, PATCH_MARK, False):
        return

    @functools.wraps(original)
    def _create_backend(self, backend_name, backend_map, error_template, stamps_children=False):
        if "torch_native" not in backend_map:
            backend_map = dict(backend_map)
            if stamps_children:  # create_decode_backend: the multi-step container
                backend_map["torch_native"] = lambda: (
                    "torch_native",
                    classes()[1](self.draft_model_runner, self.topk, self.speculative_num_steps),
                )
            else:  # create_draft_extend_backend
                from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

                backend_map["torch_native"] = lambda: ("torch_native", TorchNativeAttnBackend(self.draft_model_runner))
        return original(self, backend_name, backend_map, error_template, stamps_children)

    setattr(_create_backend, PATCH_MARK, True)
    cls._create_backend = _create_backend


def force_full_tree_mask(module) -> None:
    """EAGLE's draft workers build the verify tree mask in the layout
    ``default_tree_mask_mode()`` names (QLEN_ONLY on the CPU): make it FULL_MASK, the
    GPU layout (``target_verify_extend`` reads both)."""
    from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode

    module.default_tree_mask_mode = lambda: TreeMaskMode.FULL_MASK
