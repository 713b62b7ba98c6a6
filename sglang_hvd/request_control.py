"""Per-request control of HVD: the request field ``hvd`` and the figures a response carries.

A request picks what its verify rows may hold, through SGLang's ``custom_params`` (the
native ``/generate`` API: ``"sampling_params": {"custom_params": {"hvd": "off"}}``; the
OpenAI-compatible API: ``"custom_params": {"hvd": "off"}`` in the request body, e.g. the
OpenAI client's ``extra_body``):

  auto     the decision as for every request (the default, also when the field is absent)
  off      no speculation: every verify row of the request holds no draft, so each step
           emits exactly the target's own next token (as a server without speculation)
  cache    its cache draft whenever it has one, the whole row (no EAGLE3 nodes beside it,
           whatever the gate predicts); a step without a cache draft verifies nothing
  eagle3   EAGLE3's draft always, never the cache draft

The decision (decision.decide) honours the field row by row; the step's verify tier stays
the batch's (a cost-aware server prices the batch as it would without the field). Any
other value is refused before the request is scheduled (an HTTP 400 naming the values).

Each response's ``meta_info["hvd"]`` carries the request's figures (``FIGURES``): the
same counts as ``/server_info``'s ``hvd`` block, for this request alone, so the figures of
all finished requests add up to the server's.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

FIELD = "hvd"  # the key in custom_params
META_KEY = "hvd"  # the key in a response's meta_info
AUTO, OFF, CACHE, EAGLE3 = 0, 1, 2, 3
NAMES = ("auto", "off", "cache", "eagle3")  # NAMES[code]
# A request's figures in meta_info["hvd"] (besides "mode"), named as /server_info's counts:
#   rows             decode steps HVD planned for it (one verify row each)
#   plain_rows       rows that verified no draft
#   cache_rows       rows with a cache branch (a chain, a tree, or beside EAGLE3's nodes)
#   cache_accepted   cache tokens accepted in them
#   eagle3_verifies  rows whose EAGLE3 draft was verified (alone, or its branch won)
#   eagle3_accepted  EAGLE3 tokens accepted
FIGURES = ("rows", "plain_rows", "cache_rows", "cache_accepted", "eagle3_verifies", "eagle3_accepted")


def parse_control(value) -> int:
    """The code of a request's ``hvd`` value (None: auto). Raises ValueError naming the
    accepted values for anything else."""
    if value is None:
        return AUTO
    if isinstance(value, str) and value in NAMES:
        return NAMES.index(value)
    raise ValueError(f'custom_params "{FIELD}" must be one of {", ".join(NAMES)} (got {value!r}); '
                     f'leave it out for "auto"')


def control_of(custom_params: Mapping | None) -> int:
    """The control a request's ``custom_params`` asks for (auto when absent). Raises
    ValueError for a bad value."""
    return parse_control(custom_params.get(FIELD) if isinstance(custom_params, Mapping) else None)


def any_control(controls: np.ndarray | None) -> bool:
    """Whether some row of a batch asks for anything but auto."""
    return controls is not None and bool(controls.any())


def figures(control: int, counts: Mapping[str, int]) -> dict:
    """``meta_info["hvd"]`` of a request: its mode and its FIGURES."""
    return {"mode": NAMES[control], **{k: int(counts.get(k, 0)) for k in FIGURES}}
