"""Start-up checks: the sglang version and the server settings HVD supports today."""

from __future__ import annotations

from importlib import metadata

from sglang_hvd.errors import HvdInputError
from sglang_hvd.serving.config import PREFIX, TESTED_SGLANG_VERSION, HVDServingConfig
from sglang_hvd.verify import MAX_TREE_NODES, VerifyShape

SHAPE_FLAGS = (("speculative_eagle_topk", "--speculative-eagle-topk"),
               ("speculative_num_steps", "--speculative-num-steps"),
               ("speculative_num_draft_tokens", "--speculative-num-draft-tokens"))
# Attention backends whose target verify cannot take a tree (SGLang refuses topk > 1 there).
CHAIN_ONLY_BACKENDS = ("trtllm_mha",)


class UnsupportedSetup(HvdInputError):
    """A server configuration HVD refuses to run with; the message says what to change."""


def check_sglang_version(config: HVDServingConfig) -> str:
    found = metadata.version("sglang")
    if found != TESTED_SGLANG_VERSION and config.allow_sglang_version != found:
        raise UnsupportedSetup(
            f"sglang-hvd is tested with sglang {TESTED_SGLANG_VERSION}, found {found}. "
            "HVD patches SGLang's EAGLE3 worker, "
            f"whose internals change between releases. Install sglang=={TESTED_SGLANG_VERSION}, or run anyway with "
            f"--hvd-allow-sglang-version {found} ({PREFIX}ALLOW_SGLANG_VERSION={found})."
        )
    return found


def check_server_args(server_args, config: HVDServingConfig | None = None) -> None:
    """Refuse setups the HVD worker does not handle (yet), naming the flag to change
    (``config``: the HVD settings, by default from the environment)."""
    algo = str(getattr(server_args, "speculative_algorithm", None) or "")
    if algo.upper() != "EAGLE3":
        raise UnsupportedSetup("HVD runs on the EAGLE3 verify path: pass --speculative-algorithm EAGLE3 "
                               f"(got {algo or 'none'})")
    topk = getattr(server_args, "speculative_eagle_topk", None) or 1
    if topk > 1:
        for name in ("attention_backend", "decode_attention_backend", "prefill_attention_backend"):
            backend = getattr(server_args, name, None)
            if backend in CHAIN_ONLY_BACKENDS:
                raise UnsupportedSetup(f"--{name.replace('_', '-')} {backend} verifies chains only, but "
                                       f"--speculative-eagle-topk {topk} makes tree rows: choose another attention "
                                       "backend (e.g. flashinfer or fa3) or a topk-1 gate")
        nodes = getattr(server_args, "speculative_num_draft_tokens", None) or 0
        if nodes - 1 > MAX_TREE_NODES:
            raise UnsupportedSetup(f"--speculative-num-draft-tokens {nodes}: HVD's tree rows hold at most "
                                   f"{MAX_TREE_NODES} draft nodes (one 64-bit ancestor mask per node); use at most "
                                   f"{MAX_TREE_NODES + 1}")
    if getattr(server_args, "pp_size", 1) != 1:
        raise UnsupportedSetup(f"HVD does not support pipeline parallelism yet (--pp-size {server_args.pp_size}); "
                               "use --pp-size 1")
    if not getattr(server_args, "disable_overlap_schedule", False):
        raise UnsupportedSetup("HVD needs every step's accepted tokens before the next draft: "
                               "pass --disable-overlap-schedule "
                               "(the overlap scheduler is not handled yet)")
    if getattr(server_args, "speculative_use_rejection_sampling", False):
        raise UnsupportedSetup("HVD replaces draft rows but not their draft probabilities: drop "
                               "--speculative-use-rejection-sampling")
    if getattr(server_args, "speculative_adaptive", False):
        raise UnsupportedSetup("SGLang's adaptive rule would switch the verify shape behind HVD's decision: drop "
                               "--speculative-adaptive (--hvd-profile P makes HVD pick the verify tier each step)")
    config = HVDServingConfig.from_env() if config is None else config
    if (config.profile is not None or config.tier_cycle) and getattr(server_args, "enable_dp_attention", False):
        raise UnsupportedSetup("HVD's verify tiers switch per step, and attention-DP ranks run their forwards "
                               "together: drop --enable-dp-attention, or --hvd-profile / --hvd-tier-cycle")
    if getattr(server_args, "enable_multi_layer_eagle", False):
        raise UnsupportedSetup("HVD patches the single-layer EAGLE3 worker: drop --enable-multi-layer-eagle")


def served_shape(server_args) -> VerifyShape:
    """The verify shape the server will run, from its arguments (all three flags given)."""
    values = {name: getattr(server_args, name, None) for name, _ in SHAPE_FLAGS}
    missing = [flag for name, flag in SHAPE_FLAGS if values[name] is None]
    if missing:
        raise UnsupportedSetup(f"HVD needs the verify shape its gate was trained for: pass {', '.join(missing)} "
                               "(SGLang would choose them itself); `hvd eval --gate GATE_DIR` prints the gate's shape")
    try:
        return VerifyShape(topk=values["speculative_eagle_topk"], steps=values["speculative_num_steps"],
                           nodes=values["speculative_num_draft_tokens"])
    except ValueError as e:
        raise UnsupportedSetup(f"{' / '.join(flag for _, flag in SHAPE_FLAGS)}: {e}") from None
