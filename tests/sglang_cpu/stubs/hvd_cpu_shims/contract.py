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
    ("sglang.srt.layers.attention.torch_native_backend", "TorchNativeAttnBackend.init_forward_metadata"): ["self", "forward_batch"],
    ("sglang.srt.layers.attention.torch_native_backend", "TorchNativeAttnBackend._run_sdpa_forward_decode"): [
        "self", "query", "output", "k_cache", "v_cache", "req_to_token", "req_pool_indices", "seq_lens",
        "encoder_lens", "scaling", "enable_gqa", "causal", "is_cross_attn", "sliding_window_size"],
    # patched by attention.patch_draft_backend_factory
    ("sglang.srt.speculative.draft_utils", "DraftBackendFactory.__init__"): [
        "self", "draft_model_runner", "topk", "speculative_num_steps", "seed_dsa_topk_from_draft_extend", "qsa_profile"],
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
    ("sglang.kernels.ops.kvcache.cache_move", "copy_all_layer_kv_cache_func"): [
        "data_ptrs", "strides", "tgt_loc", "src_loc", "num_locs", "num_locs_upper", "kv_copy_config"],
}

# (module, text) that must appear in the module's source: the CPU-path imports of the
# ported kernels and the facts the patches lean on.
SOURCE_FACTS: list[tuple[str, str]] = [
    ("sglang.kernels.ops.speculative.spec_tree", "build_tree_kernel_efficient_cpu as sgl_build_tree_kernel_efficient_cpu"),
    ("sglang.kernels.ops.speculative.spec_tree", "from sgl_kernel import verify_tree_greedy_cpu as sgl_verify_tree_greedy_cpu"),
    ("sglang.kernels.ops.speculative.spec_tree", "retrive_next_sibling=retrieve_next_sibling"),
    ("sglang.kernels.ops.speculative.cache_locs", "assign_draft_cache_locs_contiguous_cpu,"),
    ("sglang.kernels.ops.speculative.cache_locs", "assign_extend_cache_locs_cpu,"),
    ("sglang.srt.mem_cache.allocation", "from sgl_kernel import assign_req_to_token_pool_cpu"),
    ("sglang.kernels.ops.speculative.eagle", "from sgl_kernel import fill_accept_out_cache_loc_cpu, fill_bonus_tokens_cpu"),
    ("sglang.kernels.ops.kvcache.cache_move", "from sgl_kernel import copy_all_layer_kv_cache_cpu"),
    # the CPU verify builds a QLEN_ONLY tree mask (attention.target_verify_extend reads it)
    ("sglang.srt.speculative.eagle_utils", "return TreeMaskMode.QLEN_ONLY if _is_cpu else TreeMaskMode.FULL_MASK"),
    # only the multi-step draft-decode backend is created with stamps_children=True
    ("sglang.srt.speculative.draft_utils", '"EAGLE is not supported in decode attention backend {backend_type}",\n            stamps_children=True,'),
    ("sglang.srt.speculative.draft_utils", '"intel_amx": self._create_intel_amx_decode_backend,'),
    # the draft-decode out_cache_loc layout the multi-step backend mirrors: [bs, topk, steps]
    ("sglang.srt.speculative.eagle_utils", "out_cache_loc.view(batch_size, topk, num_steps)"),
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
    ("sglang.kernels.ops.speculative.spec_tree", "sgl_build_tree_kernel_efficient_cpu", "build_tree_kernel_efficient_cpu"),
    ("sglang.kernels.ops.speculative.spec_tree", "sgl_verify_tree_greedy_cpu", "verify_tree_greedy_cpu"),
    ("sglang.kernels.ops.speculative.cache_locs", "assign_draft_cache_locs_contiguous_cpu", "assign_draft_cache_locs_contiguous_cpu"),
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
        raise ShimContractError("tests/sglang_cpu shims do not fit this SGLang:\n  " + "\n  ".join(problems))


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
