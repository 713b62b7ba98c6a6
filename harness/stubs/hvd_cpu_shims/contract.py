"""Every private SGLang 0.5.23 symbol the CPU shims rely on, checked by name.

If SGLang changes any of these, the shims would break in ways that show up late
(wrong argument order into a kernel port, a patch that silently stops applying).
``check_module`` runs before each patch is applied (in the server processes) and
``check_all`` backs the guard test ``tests/sglang_cpu/test_contract.py``; both name
the symbol that is missing or changed.
"""

from __future__ import annotations

import importlib
import inspect


class ShimContractError(RuntimeError):
    pass


# (module, qualified name) -> the parameter names the shims expect, in order.
SIGNATURES: dict[tuple[str, str], list[str]] = {
    # patched by attention.patch_torch_native_backend / used by the draft-step backend
    ("sglang.srt.layers.attention.torch_native_backend", "TorchNativeAttnBackend.__init__"): ["self", "model_runner"],
    ("sglang.srt.layers.attention.torch_native_backend", "TorchNativeAttnBackend.forward_extend"): [
        "self", "q", "k", "v", "layer", "forward_batch", "save_kv_cache"],
    ("sglang.srt.layers.attention.torch_native_backend", "TorchNativeAttnBackend.forward_decode"): [
        "self", "q", "k", "v", "layer", "forward_batch", "save_kv_cache"],
    ("sglang.srt.layers.attention.torch_native_backend", "TorchNativeAttnBackend.init_forward_metadata"): [
        "self", "forward_batch"],
    ("sglang.srt.layers.attention.torch_native_backend", "TorchNativeAttnBackend._run_sdpa_forward_decode"): [
        "self", "query", "output", "k_cache", "v_cache", "req_to_token", "req_pool_indices", "seq_lens",
        "encoder_lens", "scaling", "enable_gqa", "causal", "is_cross_attn", "sliding_window_size"],
    # patched by attention.patch_draft_backend_factory
    ("sglang.srt.speculative.draft_utils", "DraftBackendFactory.__init__"): [
        "self", "draft_model_runner", "topk", "speculative_num_steps", "seed_dsa_topk_from_draft_extend",
        "qsa_profile"],
    ("sglang.srt.speculative.draft_utils", "DraftBackendFactory._create_backend"): [
        "self", "backend_name", "backend_map", "error_template", "stamps_children"],
    # the wrappers that call the kernel ports (argument order into the ports)
    ("sglang.kernels.ops.speculative.spec_tree", "build_tree_kernel_efficient_func"): [
        "parent_list", "top_scores_index", "seq_lens", "tree_mask", "positions", "retrieve_index",
        "retrieve_next_token", "retrieve_next_sibling", "topk", "spec_steps", "num_verify_tokens", "tree_mask_mode"],
    ("sglang.kernels.ops.speculative.spec_tree", "verify_tree_greedy_func"): [
        "predicts", "accept_index", "accept_token_num", "candidates", "retrieve_index", "retrieve_next_token",
        "retrieve_next_sibling", "target_predict", "topk"],
    ("sglang.kernels.ops.speculative.cache_locs", "assign_draft_cache_locs_contiguous_func"): [
        "req_pool_indices", "req_to_token", "seq_lens", "out_cache_loc", "topk", "num_cols", "positions", "mrope"],
    ("sglang.kernels.ops.speculative.cache_locs", "assign_extend_cache_locs_func"): [
        "req_pool_indices", "req_to_token", "start_offset", "end_offset", "batch_size", "draft_token_num", "device"],
    ("sglang.srt.mem_cache.allocation", "assign_req_to_token_pool_func"): [
        "req_pool_indices", "req_to_token", "start_offset", "end_offset", "out_cache_loc", "batch_size"],
    ("sglang.kernels.ops.speculative.eagle", "fill_bonus_tokens_func"): [
        "accept_tokens", "accept_lens", "bonus_tokens", "accept_stride", "batch_size"],
    ("sglang.kernels.ops.speculative.eagle", "fill_accept_out_cache_loc_func"): [
        "accept_index", "out_cache_loc", "accept_out_cache_loc", "size"],
    # patched by distributed.patch_parallel_state (every GPU communicator switched off)
    ("sglang.srt.distributed.parallel_state", "init_model_parallel_group"): [
        "group_ranks", "local_rank", "backend", "use_pynccl", "use_custom_allreduce", "use_message_queue_broadcaster",
        "group_name", "use_mscclpp", "use_torch_symm_mem_allreduce", "recovered_rank", "rank_offset", "max_world_size"],
    # patched by sampling.patch_eagle_utils; the port keeps the CUDA wrapper's parameters
    ("sglang.srt.speculative.eagle_utils", "_verify_uses_greedy"): [
        "is_all_greedy", "is_cpu", "is_hip", "is_xpu", "use_rejection_sampling"],
    ("sglang.kernels.ops.speculative.sampling", "tree_speculative_sampling_target_only"): [
        "predicts", "accept_index", "accept_token_num", "candidates", "retrive_index", "retrive_next_token",
        "retrive_next_sibling", "uniform_samples", "uniform_samples_for_final_sampling", "target_probs",
        "draft_probs", "threshold_single", "threshold_acc", "deterministic"],
    ("sglang.kernels.ops.kvcache.cache_move", "copy_all_layer_kv_cache_func"): [
        "data_ptrs", "strides", "tgt_loc", "src_loc", "num_locs", "num_locs_upper", "kv_copy_config"],
}

# (module, text) that must appear in the module's source: the CPU-path imports of the
# ported kernels and the facts the patches lean on.
SOURCE_FACTS: list[tuple[str, str]] = [
    ("sglang.kernels.ops.speculative.spec_tree",
     "build_tree_kernel_efficient_cpu as sgl_build_tree_kernel_efficient_cpu"),
    ("sglang.kernels.ops.speculative.spec_tree",
     "from sgl_kernel import verify_tree_greedy_cpu as sgl_verify_tree_greedy_cpu"),
    ("sglang.kernels.ops.speculative.spec_tree", "retrive_next_sibling=retrieve_next_sibling"),
    ("sglang.kernels.ops.speculative.cache_locs", "assign_draft_cache_locs_contiguous_cpu,"),
    ("sglang.kernels.ops.speculative.cache_locs", "assign_extend_cache_locs_cpu,"),
    ("sglang.srt.mem_cache.allocation", "from sgl_kernel import assign_req_to_token_pool_cpu"),
    ("sglang.kernels.ops.speculative.eagle",
     "from sgl_kernel import fill_accept_out_cache_loc_cpu, fill_bonus_tokens_cpu"),
    ("sglang.kernels.ops.kvcache.cache_move", "from sgl_kernel import copy_all_layer_kv_cache_cpu"),
    # the CPU verify builds a QLEN_ONLY tree mask (attention.target_verify_extend reads it)
    ("sglang.srt.speculative.eagle_utils", "return TreeMaskMode.QLEN_ONLY if _is_cpu else TreeMaskMode.FULL_MASK"),
    # only the multi-step draft-decode backend is created with stamps_children=True
    ("sglang.srt.speculative.draft_utils",
     '"EAGLE is not supported in decode attention backend {backend_type}",\n'
     '            stamps_children=True,'),
    ("sglang.srt.speculative.draft_utils", '"intel_amx": self._create_intel_amx_decode_backend,'),
    # the draft-decode out_cache_loc layout the multi-step backend mirrors: [bs, topk, steps]
    ("sglang.srt.speculative.eagle_utils", "out_cache_loc.view(batch_size, topk, num_steps)"),
    # the sampling verify names sampling.patch_eagle_utils rebinds, read as globals at call time
    ("sglang.srt.speculative.eagle_utils",
     "    if _verify_uses_greedy(\n"
     "        is_all_greedy=sampling_info.is_all_greedy,\n"
     "        is_cpu=_is_cpu,"),
    ("sglang.srt.speculative.eagle_utils", "            sampling_fn = tree_speculative_sampling_target_only\n"),
    ("sglang.srt.speculative.eagle_utils", "            target_probs = top_k_renorm_prob(\n"),
    ("sglang.srt.speculative.eagle_utils", "            target_probs = top_p_renorm_prob(\n"),
    ("sglang.srt.speculative.eagle_utils", "            else torch.zeros_like(target_probs)\n"),
    # HVD_TEST_TREE_MASK_MODE=full rebinds this name in the EAGLE worker module
    ("sglang.srt.speculative.eagle_worker_v2", "    _eagle_prefill_tail_tokens,\n    default_tree_mask_mode,"),
    ("sglang.srt.speculative.eagle_worker_v2", "self.tree_mask_mode = default_tree_mask_mode()"),
    # the torch_native backend keeps these pool references
    ("sglang.srt.layers.attention.torch_native_backend", "self.req_to_token_pool = model_runner.req_to_token_pool"),
    ("sglang.srt.layers.attention.torch_native_backend", "self.token_to_kv_pool = model_runner.token_to_kv_pool"),
    ("sglang.srt.layers.attention.torch_native_backend", "self.swa_out_cache_loc = None"),
]

# (module, attribute) that must exist.
ATTRIBUTES: list[tuple[str, str]] = [
    ("sglang.srt.mem_cache.memory_pool", "KVWriteLoc"),
    ("sglang.srt.model_executor.forward_batch_info", "ForwardMode.TARGET_VERIFY"),
    ("sglang.srt.model_executor.forward_batch_info", "ForwardMode.is_target_verify"),
    ("sglang.srt.speculative.eagle_info", "EagleVerifyInput.tree_topk"),
    ("sglang.srt.speculative.draft_utils", "DraftBackendFactory.create_decode_backend"),
    ("sglang.srt.speculative.draft_utils", "DraftBackendFactory.create_draft_extend_backend"),
    ("sglang.kernels.ops.speculative.spec_tree", "TreeMaskMode.QLEN_ONLY"),
]

# dataclass fields of EagleVerifyInput read by target_verify_extend
VERIFY_INPUT_FIELDS = ["draft_token_num", "custom_mask"]

# The module-level names each wrapper module binds to a port when SGLANG_USE_CPU_ENGINE=1.
CPU_BINDINGS: list[tuple[str, str, str]] = [
    ("sglang.kernels.ops.speculative.spec_tree", "sgl_build_tree_kernel_efficient_cpu",
     "build_tree_kernel_efficient_cpu"),
    ("sglang.kernels.ops.speculative.spec_tree", "sgl_verify_tree_greedy_cpu", "verify_tree_greedy_cpu"),
    ("sglang.kernels.ops.speculative.cache_locs", "assign_draft_cache_locs_contiguous_cpu",
     "assign_draft_cache_locs_contiguous_cpu"),
    ("sglang.kernels.ops.speculative.cache_locs", "assign_extend_cache_locs_cpu", "assign_extend_cache_locs_cpu"),
    ("sglang.srt.mem_cache.allocation", "assign_req_to_token_pool_cpu", "assign_req_to_token_pool_cpu"),
    ("sglang.kernels.ops.speculative.eagle", "fill_bonus_tokens_cpu", "fill_bonus_tokens_cpu"),
    ("sglang.kernels.ops.speculative.eagle", "fill_accept_out_cache_loc_cpu", "fill_accept_out_cache_loc_cpu"),
    ("sglang.kernels.ops.kvcache.cache_move", "copy_all_layer_kv_cache_cpu", "copy_all_layer_kv_cache_cpu"),
]


def _resolve(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _module_problems(name: str, module) -> list[str]:
    problems = []
    for (mod, qual), expected in SIGNATURES.items():
        if mod != name:
            continue
        try:
            got = _params(_resolve(module, qual))
        except AttributeError:
            problems.append(f"{mod}.{qual} is missing")
            continue
        got = [p for p in got if p not in ("args", "kwargs")]
        if got != expected:
            problems.append(f"{mod}.{qual} signature changed: expected {expected}, found {got}")
    source = None
    for mod, text in SOURCE_FACTS:
        if mod != name:
            continue
        if source is None:
            source = inspect.getsource(module)
        if text not in source:
            problems.append(f"{mod} no longer contains {text!r}")
    for mod, attr in ATTRIBUTES:
        if mod != name:
            continue
        try:
            _resolve(module, attr)
        except AttributeError:
            problems.append(f"{mod}.{attr} is missing")
    if name == "sglang.srt.speculative.eagle_info":
        fields = getattr(module.EagleVerifyInput, "__dataclass_fields__", {})
        for field in VERIFY_INPUT_FIELDS:
            if field not in fields:
                problems.append(f"{name}.EagleVerifyInput.{field} is missing")
    return problems


def _modules() -> list[str]:
    names = {mod for mod, _ in SIGNATURES} | {mod for mod, _ in SOURCE_FACTS} | {mod for mod, _ in ATTRIBUTES}
    names.add("sglang.srt.speculative.eagle_info")
    return sorted(names)


def check_module(name: str, module) -> None:
    """Raise ShimContractError listing what changed in ``module`` (a just-imported one)."""
    problems = _module_problems(name, module)
    if problems:
        raise ShimContractError("the CPU harness shims (sglang_hvd.harness) do not fit this SGLang:\n  "
                                + "\n  ".join(problems))


def check_all(cpu_bindings: bool = False) -> list[str]:
    """Every problem found, as readable lines (empty when all is well).

    With ``cpu_bindings`` (a process with ``SGLANG_USE_CPU_ENGINE=1`` and the shims
    installed) it also checks that each wrapper module bound the ported kernel.
    """
    problems = []
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - report, do not hide
            problems.append(f"import {name} failed: {type(exc).__name__}: {exc}")
            continue
        problems += _module_problems(name, module)
    if cpu_bindings:
        from . import kernels

        for mod, attr, port in CPU_BINDINGS:
            module = importlib.import_module(mod)
            if getattr(module, attr, None) is not getattr(kernels, port):
                problems.append(f"{mod}.{attr} is not bound to the port kernels.{port}")
    return problems


def probe_cpu_engine() -> list[str]:
    """In a process with ``SGLANG_USE_CPU_ENGINE=1`` and the shims installed: the
    contract, the bindings, the patches, and every kernel wrapper called once through
    SGLang's own ``*_func`` (so a changed argument order shows up as a wrong result)."""
    import torch

    from . import kernels as K

    problems = check_all(cpu_bindings=True)
    import sgl_kernel

    if not getattr(sgl_kernel, "HVD_CPU_TEST_STUB", False):
        problems.append(f"sgl_kernel is not the test stub: {sgl_kernel!r}")
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    for owner, attr in ((TorchNativeAttnBackend, "forward_extend"), (DraftBackendFactory, "_create_backend")):
        if not getattr(getattr(owner, attr), "_hvd_cpu_shim", False):
            problems.append(f"{owner.__name__}.{attr} is not patched")

    from sglang.srt.speculative import eagle_utils

    from . import sampling

    if not getattr(eagle_utils._verify_uses_greedy, "hvd_cpu_shim", False):
        problems.append("eagle_utils._verify_uses_greedy is not patched")
    elif eagle_utils._verify_uses_greedy(is_all_greedy=False, is_cpu=True, is_hip=False, is_xpu=False,
                                         use_rejection_sampling=False):
        problems.append("eagle_utils._verify_uses_greedy still forces greedy verify on the CPU")
    for name in ("tree_speculative_sampling_target_only", "top_k_renorm_prob", "top_p_renorm_prob"):
        if getattr(eagle_utils, name, None) is not getattr(sampling, name):
            problems.append(f"eagle_utils.{name} is not bound to the port sampling.{name}")

    from sglang.kernels.ops.kvcache import cache_move
    from sglang.kernels.ops.speculative import cache_locs, eagle, spec_tree
    from sglang.srt.mem_cache import allocation

    def same(label, a, b):
        if not all(torch.equal(x, y) for x, y in zip(a, b)):
            problems.append(f"{label}: SGLang's wrapper and the port disagree")

    # tree (topk 2) through build_tree_kernel_efficient_func
    parents, sel, seq = torch.tensor([[-1, 0, 1, 2, 4]]), torch.tensor([[0, 1, 2, 4, 6]]), torch.tensor([7])
    outs = []
    for fn in (spec_tree.build_tree_kernel_efficient_func, K.build_tree_kernel_efficient_cpu):
        mask, pos, ret = torch.ones(36, dtype=torch.bool), torch.empty(6, dtype=torch.long), torch.full((3, 1, 6), -1)
        fn(parents, sel, seq, mask, pos, ret[0], ret[1], ret[2], 2, 3, 6, spec_tree.TreeMaskMode.QLEN_ONLY)
        outs.append((mask, pos, ret))
    same("build_tree_kernel_efficient_func", *outs)
    ret = outs[1][2]
    cand, target = torch.tensor([[9, 1, 2, 3, 5, 7]]), torch.tensor([[2, 0, 5, 0, 8, 0]])
    outs = []
    for call in (lambda p, a, n: spec_tree.verify_tree_greedy_func(p, a, n, cand, ret[0], ret[1], ret[2], target,
                                                                   topk=2),
                 lambda p, a, n: K.verify_tree_greedy_cpu(p, a, n, cand, ret[0], ret[1], ret[2], target)):
        p, a, n = (torch.zeros(6, dtype=torch.int32), torch.full((1, 4), -1, dtype=torch.int32),
                   torch.zeros(1, dtype=torch.int32))
        call(p, a, n)
        outs.append((p, a, n))
    same("verify_tree_greedy_func", *outs)
    if outs[0][1].tolist() != [[0, 2, 4, -1]]:
        problems.append(f"verify_tree_greedy_func accepted {outs[0][1].tolist()}, expected [[0, 2, 4, -1]]")

    r2t = torch.arange(48).view(3, 16).to(torch.int32)
    reqs, seq = torch.tensor([2, 0]), torch.tensor([3, 5])
    a, b = torch.zeros(8, dtype=torch.int64), torch.zeros(8, dtype=torch.int64)
    cache_locs.assign_draft_cache_locs_contiguous_func(reqs, r2t, seq, a, 2, 2)
    K.assign_draft_cache_locs_contiguous_cpu(reqs, r2t, seq, b, 16, 2, 2)
    same("assign_draft_cache_locs_contiguous_func", (a,), (b,))
    a = cache_locs.assign_extend_cache_locs_func(reqs, r2t, seq, seq + 3, 2, 3, "cpu")
    b = torch.zeros(6, dtype=torch.int64)
    K.assign_extend_cache_locs_cpu(reqs, r2t, seq, seq + 3, b, 16)
    same("assign_extend_cache_locs_func", (a,), (b,))
    a, b = r2t.clone(), r2t.clone()
    src = torch.arange(100, 106)
    allocation.assign_req_to_token_pool_func(reqs, a, seq, seq + 3, src, 2)
    K.assign_req_to_token_pool_cpu(reqs, b, seq, seq + 3, src, 16)
    same("assign_req_to_token_pool_func", (a,), (b,))
    tokens, lens = torch.arange(8, dtype=torch.int32), torch.tensor([3, 1], dtype=torch.int32)
    a, b = torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    eagle.fill_bonus_tokens_func(tokens, lens, a, 4, 2)
    K.fill_bonus_tokens_cpu(tokens, lens, b, 4)
    same("fill_bonus_tokens_func", (a,), (b,))
    index = torch.tensor([[0, 1, 3, -1], [4, -1, -1, -1]], dtype=torch.int32)
    a, b = torch.zeros(8, dtype=torch.int64), torch.zeros(8, dtype=torch.int64)
    eagle.fill_accept_out_cache_loc_func(index, torch.arange(10, 18), a, 8)
    K.fill_accept_out_cache_loc_cpu(index, torch.arange(10, 18), b)
    same("fill_accept_out_cache_loc_func", (a,), (b,))
    buf = torch.arange(24, dtype=torch.float32).view(6, 4)
    ptrs, strides = torch.tensor([buf.data_ptr()], dtype=torch.uint64), torch.tensor([16])
    cache_move.copy_all_layer_kv_cache_func(ptrs, strides, torch.tensor([4, 5, 0]), torch.tensor([1, 2, 0]), 2, 2, {})
    if (buf[4].tolist() != [4.0, 5.0, 6.0, 7.0] or buf[5].tolist() != [8.0, 9.0, 10.0, 11.0]
            or buf[0].tolist() != [0.0, 1.0, 2.0, 3.0]):
        problems.append(f"copy_all_layer_kv_cache_func moved the wrong rows: {buf.tolist()}")
    return problems
