"""``POST /hvd/update_gate``: swap the served gate without a restart, on every rank or none.

Request body ``{"gate_path": DIR}`` (a directory the server's machine can read); answers
``{"success": bool, "message": str}`` with 200, or 400 when the swap was refused (the old
gate keeps serving; the message names the problem, one line per rank). In the style of
SGLang's ``/update_weights_from_disk``, and over its channel: the HTTP process sends an
``UpdateWeightFromDiskReqInput`` whose ``load_format`` names the swap's phase
(serving/gate_swap.py: check, then commit or abort) to every scheduler and gathers their
answers; each scheduler's weight updater hands such a request to its HVD worker
(``hvd_swap``) instead of loading weights. Requests keep flowing throughout: a phase runs
in each scheduler between two steps. One swap at a time.

Three hooks, installed by the plugin (patches/plugin.py):
  ``TokenizerManager.__init__``                  adds the route to SGLang's FastAPI app
  ``SchedulerWeightUpdaterManager.update_weights_from_disk``  a swap phase -> the worker
  ``TokenizerManager._update_model_path_info``   a swap is no weight update: the served
                                                 model's name and path stay
"""

from __future__ import annotations

import asyncio
import logging
import sys

from fastapi import Request
from fastapi.responses import JSONResponse

from sglang_hvd.serving.gate_swap import ABORT, CHECK, COMMIT, PHASES

log = logging.getLogger("sglang_hvd")
ROUTE = "/hvd/update_gate"
INIT_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.__init__"
UPDATER_TARGET = ("sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager."
                  "update_weights_from_disk")
PATH_INFO_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._update_model_path_info"
_lock: asyncio.Lock | None = None


def add_route(result, manager, *args, **kwargs):
    """After the tokenizer manager is made: the route on the HTTP server's app (none
    for an in-process engine, which has no HTTP server)."""
    http = sys.modules.get("sglang.srt.entrypoints.http_server")
    app = getattr(http, "app", None)
    if app is not None and not any(getattr(r, "path", None) == ROUTE for r in app.routes):
        app.add_api_route(ROUTE, update_gate, methods=["POST"])
    return result


async def _phase(manager, phase: str, gate_dir: str) -> tuple[bool, str]:
    from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqInput

    manager.auto_create_handle_loop()
    obj = UpdateWeightFromDiskReqInput(model_path=gate_dir, load_format=phase, flush_cache=False)
    success, message, _ = await manager._wait_for_model_update_from_disk(obj)
    return bool(success), message


async def swap(manager, gate_dir: str) -> tuple[bool, str]:
    """Check ``gate_dir`` on every rank; serve it on every rank if all passed, else drop it."""
    global _lock
    if _lock is None:
        _lock = asyncio.Lock()
    async with _lock:
        passed, message = await _phase(manager, CHECK, gate_dir)
        if passed:
            return await _phase(manager, COMMIT, gate_dir)
        await _phase(manager, ABORT, gate_dir)
        return False, message


async def update_gate(request: Request):
    try:
        body = await request.json()
    except ValueError:
        body = None
    gate_dir = body.get("gate_path") if isinstance(body, dict) else None
    if not isinstance(gate_dir, str) or not gate_dir:
        return JSONResponse({"success": False, "message": 'send {"gate_path": "DIR"}: a gate directory from '
                                                          "`hvd train` that the server's machine can read"},
                            status_code=400)
    http = sys.modules["sglang.srt.entrypoints.http_server"]
    try:
        passed, message = await swap(http.get_global_state().tokenizer_manager, gate_dir)
    except Exception as e:  # the endpoint answers; the server keeps serving
        log.exception("HVD gate swap failed")
        passed, message = False, f"the swap failed ({e.__class__.__name__}: {e}); the served gate is unchanged"
    (log.info if passed else log.warning)("HVD gate swap to %s: %s", gate_dir, message)
    return JSONResponse({"success": passed, "message": message}, status_code=200 if passed else 400)


def route_swap_phase(original, updater, recv_req, *args, **kwargs):
    """A scheduler's weight updater: a swap phase goes to its HVD worker, anything else
    loads weights as SGLang does."""
    if getattr(recv_req, "load_format", None) not in PHASES:
        return original(updater, recv_req, *args, **kwargs)
    from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqOutput

    worker = getattr(updater, "draft_worker", None)
    if not hasattr(worker, "hvd_swap"):
        passed, message = False, "this server runs no HVD worker"
    else:
        try:
            passed, message = worker.hvd_swap(recv_req.load_format, recv_req.model_path)
        except Exception as e:  # a scheduler must not die of a swap
            log.exception("HVD gate swap phase %s failed", recv_req.load_format)
            passed, message = False, f"{e.__class__.__name__}: {e}"
    return UpdateWeightFromDiskReqOutput(success=passed, message=message, num_paused_requests=0)


def keep_model_path(original, manager, model_path, load_format, *args, **kwargs):
    if load_format in PHASES:
        return None
    return original(manager, model_path, load_format, *args, **kwargs)
