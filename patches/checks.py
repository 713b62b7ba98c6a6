"""Start-up checks: the sglang version and the server settings HVD supports today."""

from __future__ import annotations

from importlib import metadata

from sglang_hvd.errors import HvdInputError
from sglang_hvd.serving.config import PREFIX, TESTED_SGLANG_VERSION, HVDServingConfig


class UnsupportedSetup(HvdInputError):
    """A server configuration HVD refuses to run with; the message says what to change."""


def check_sglang_version(config: HVDServingConfig) -> str:
    found = metadata.version("sglang")
    if found != TESTED_SGLANG_VERSION and config.allow_sglang_version != found:
        raise UnsupportedSetup(
            f"sglang-hvd is tested with sglang {TESTED_SGLANG_VERSION}, found {found}. HVD patches SGLang's EAGLE3 worker, "
            f"whose internals change between releases. Install sglang=={TESTED_SGLANG_VERSION}, or run anyway with "
            f"--hvd-allow-sglang-version {found} ({PREFIX}ALLOW_SGLANG_VERSION={found})."
        )
    return found


def check_server_args(server_args) -> None:
    """Refuse setups the HVD worker does not handle (yet), naming the flag to change."""
    algo = str(getattr(server_args, "speculative_algorithm", None) or "")
    if algo.upper() != "EAGLE3":
        raise UnsupportedSetup(f"HVD runs on the EAGLE3 verify path: pass --speculative-algorithm EAGLE3 (got {algo or 'none'})")
    if getattr(server_args, "speculative_eagle_topk", 1) not in (None, 1):
        raise UnsupportedSetup("HVD needs chain drafts: pass --speculative-eagle-topk 1 "
                               f"(got {server_args.speculative_eagle_topk}); tree drafts are not supported yet")
    if getattr(server_args, "pp_size", 1) != 1:
        raise UnsupportedSetup(f"HVD does not support pipeline parallelism yet (--pp-size {server_args.pp_size}); use --pp-size 1")
    if not getattr(server_args, "disable_overlap_schedule", False):
        raise UnsupportedSetup("HVD needs every step's accepted tokens before the next draft: pass --disable-overlap-schedule "
                               "(the overlap scheduler is not handled yet)")
    if getattr(server_args, "speculative_use_rejection_sampling", False):
        raise UnsupportedSetup("HVD replaces draft rows but not their draft probabilities: drop "
                               "--speculative-use-rejection-sampling")
    if getattr(server_args, "enable_multi_layer_eagle", False):
        raise UnsupportedSetup("HVD patches the single-layer EAGLE3 worker: drop --enable-multi-layer-eagle")
