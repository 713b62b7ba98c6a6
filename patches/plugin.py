"""SGLang plugin entry point (group ``sglang.srt.plugins``, name ``hvd``).

SGLang calls ``register()`` with no arguments in the launcher and in every spawned
process. It does nothing unless SGLANG_HVD_ENABLE=1; then it installs one AROUND hook on
``SpeculativeAlgorithm.create_worker`` that returns the HVD worker class for EAGLE3 (after
checking the sglang version and the server settings), hooks that add the worker's HVD
statistics to ``/server_info``, and the per-request control's two (request_control.py):
a request's ``custom_params["hvd"]`` is checked where SGLang checks its sampling
parameters (a bad value: HTTP 400), and its figures reach ``meta_info["hvd"]`` as one
dict; and the three of the hot gate swap's endpoint ``POST /hvd/update_gate``
(patches/gate_endpoint.py). Idempotent.
"""

from __future__ import annotations

import logging

log = logging.getLogger("sglang_hvd")
_registered = False
TARGET = "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker"
# /server_info's internal state gains an "hvd" block (verify counts, pick rate, CPU time).
STATE_TARGET = ("sglang.srt.managers.scheduler_components.internal_state."
                "SchedulerInternalStateController._add_speculative")
# ... and, where the HTTP server gathers them (one per DP rank), one more entry
# {"hvd_total": ...}: the ranks' counts summed, rates recomputed (serving/status.py).
TOTAL_TARGET = "sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.get_internal_state"
# A request's custom_params["hvd"] is refused with its other sampling parameters (a 400).
VERIFY_TARGET = "sglang.srt.sampling.sampling_params.SamplingParams.verify"
# meta_info["hvd"] arrives as SGLang's per-token customized_info list: keep its last dict.
META_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info"


def create_worker_hook(original, algorithm, server_args, *args, **kwargs):
    cls = original(algorithm, server_args, *args, **kwargs)
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    if not (algorithm.is_eagle3() and cls is EAGLEWorkerV2):
        return cls
    from sglang_hvd.serving.config import HVDServingConfig

    from .checks import check_server_args, check_sglang_version

    # Raised here, not in register(): SGLang logs and ignores plugin exceptions, but an
    # error while creating the worker stops the server with this message.
    check_sglang_version(HVDServingConfig.from_env())
    check_server_args(server_args)
    from .worker import HVDEagleWorkerV2

    return HVDEagleWorkerV2


def add_hvd_state(result, controller, state, *args, **kwargs):
    worker = getattr(getattr(controller, "scheduler", None), "draft_worker", None)
    if hasattr(worker, "hvd_stats"):
        state["hvd"] = worker.hvd_stats()
    return result


def add_hvd_total(original, *args, **kwargs):
    async def gathered():
        states = await original(*args, **kwargs)
        try:
            from sglang_hvd.serving.status import fleet_status

            status = fleet_status([("server", {"internal_states": states})])
            if status.ranks and isinstance(states, list):
                states = [*states, {"hvd_total": dict(status.totals)}]
        except Exception as e:  # /server_info must answer whatever HVD's summary does
            log.warning("HVD: could not sum the ranks' figures for /server_info (%s)", e)
        return states

    return gathered()


def check_request_control(result, params, *args, **kwargs):
    from sglang_hvd.request_control import control_of

    control_of(getattr(params, "custom_params", None))  # raises ValueError: SGLang answers 400
    return result


def flatten_meta_info(result, manager, meta_info, *args, **kwargs):
    from sglang_hvd.request_control import META_KEY

    values = meta_info.get(META_KEY) if isinstance(meta_info, dict) else None
    if isinstance(values, list):
        figures = next((v for v in reversed(values) if isinstance(v, dict)), None)
        if figures is None:  # another request of the batch carried figures, this one none (yet)
            del meta_info[META_KEY]
        else:
            meta_info[META_KEY] = figures
    return result


def register() -> bool:
    """Install the hook when HVD is enabled; returns whether it (already) is installed."""
    global _registered
    if _registered:
        return True
    from sglang_hvd.serving.config import HVDServingConfig

    config = HVDServingConfig.from_env()
    if not config.enable:
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, create_worker_hook, HookType.AROUND)
    HookRegistry.register(STATE_TARGET, add_hvd_state, HookType.AFTER)
    HookRegistry.register(TOTAL_TARGET, add_hvd_total, HookType.AROUND)
    HookRegistry.register(VERIFY_TARGET, check_request_control, HookType.AFTER)
    HookRegistry.register(META_TARGET, flatten_meta_info, HookType.AFTER)
    from . import gate_endpoint as ge

    HookRegistry.register(ge.INIT_TARGET, ge.add_route, HookType.AFTER)
    HookRegistry.register(ge.UPDATER_TARGET, ge.route_swap_phase, HookType.AROUND)
    HookRegistry.register(ge.PATH_INFO_TARGET, ge.keep_model_path, HookType.AROUND)
    _registered = True
    log.info("HVD plugin registered (gate %s)", config.gate)
    return True
