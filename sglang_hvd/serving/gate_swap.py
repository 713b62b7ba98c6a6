"""A hot gate swap: a new gate directory checked against the served one, then served.

The HVD server's endpoint ``POST /hvd/update_gate`` (patches/gate_endpoint.py) runs a swap
in two phases over every scheduler (one per data-parallel rank; tensor-parallel ranks > 0
hold no gate, they receive rank 0's plans):

  check   each rank loads the directory and checks it against what it serves
          (``load_candidate``); it keeps the checked gate aside
  commit  only if every rank's check passed: each rank serves its checked gate from its
          next step on (the scheduler handles the phase between two steps, so no step
          mixes two gates), and resets its online calibration (it learnt the old gate's
          errors)
  abort   otherwise: each rank drops what it checked; the old gate keeps serving

A refusal names the problem in one line (the endpoint's response and the server log).
What must match the served gate: the verify shape (the gate's labels and calibration
assume it), the cache drafter's settings (the drafter's state was built with them; only
resource bounds may differ) and the tokenizer (features index token ids). The server's
explicit decision settings (--hvd-threshold, --hvd-eagle-reserve, --hvd-cache-siblings,
--hvd-score-rule) apply to the new gate as to the old one.
"""

from __future__ import annotations

import dataclasses
import os

from ..drafter.protocol import RESOURCE_BOUNDS
from ..errors import HvdInputError
from ..scorer import ServedScorer
from ..verify import VerifyShape
from .config import HVDServingConfig
from .factory import check_shape, load_gate

CHECK, COMMIT, ABORT = "hvd_gate_check", "hvd_gate_commit", "hvd_gate_abort"
PHASES = (CHECK, COMMIT, ABORT)


def load_candidate(config: HVDServingConfig, shape: VerifyShape, current: ServedScorer, gate_dir: str) -> ServedScorer:
    """The gate in ``gate_dir``, loaded with the server's decision settings and checked
    against the served gate ``current``; raises HvdInputError naming what differs."""
    if not os.path.isdir(gate_dir):
        raise HvdInputError(f"{gate_dir}: no such gate directory on the server's machine (give a path the server "
                            "can read)")
    candidate = load_gate(dataclasses.replace(config, gate=gate_dir))
    check_shape(candidate, shape)
    old, new = current.drafter_config, candidate.drafter_config
    differ = [f"{f.name} {getattr(new, f.name)} (served: {getattr(old, f.name)})" for f in dataclasses.fields(old)
              if f.name not in RESOURCE_BOUNDS and getattr(new, f.name) != getattr(old, f.name)]
    if differ:
        raise HvdInputError(f"{gate_dir}: its cache drafter settings differ from the served gate's: "
                            f"{', '.join(differ)}; the drafter's state was built with the served ones: train the gate "
                            "with them, or restart the server with the new gate")
    if candidate.spec.tokenizer != current.spec.tokenizer:
        raise HvdInputError(f"{gate_dir}: trained for tokenizer {candidate.spec.tokenizer.name} "
                            f"({candidate.spec.tokenizer.digest}), the served gate for {current.spec.tokenizer.name} "
                            f"({current.spec.tokenizer.digest}): its features would index other token ids")
    return candidate
