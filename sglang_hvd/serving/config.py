"""HVD serving settings, carried to SGLang's spawned processes in environment variables.

SGLang starts its scheduler processes with ``spawn``: only environment variables reach
them. ``python -m sglang_hvd.launch_server`` turns its ``--hvd-*`` flags into these
variables; ``sglang serve`` and ``sgl.Engine`` users set them directly:

  SGLANG_HVD_ENABLE=1                 turn HVD on (else the plugin does nothing)
  SGLANG_HVD_GATE=DIR                 gate directory (hvd train); required when enabled
  SGLANG_HVD_THRESHOLD=T              override the gate's threshold
  SGLANG_HVD_SCORE_RULE=C             decide by the score rule (cache draft score >= C), not the gate
  SGLANG_HVD_EAGLE_RESERVE=M          override the EAGLE3 nodes kept beside a cache draft (topk > 1)
  SGLANG_HVD_CACHE_SIBLINGS=S         override the tree-draft nodes a cache row adds to its chain (topk > 1)
  SGLANG_HVD_DRAFTER=native|python    cache drafter implementation (default: fastest built)
  SGLANG_HVD_GLOBAL_MAX_TOKENS, _MAX_OCCURRENCES,
  _MAX_SCAN                           drafter resource bounds (default: the gate's own)
  SGLANG_HVD_MAX_DEPTH, _MAX_SPEC_TOKENS, _MAX_SPEC_FACTOR, _MAX_SPEC_OFFSET,
  _MIN_TOKEN_PROB                     drafter settings that shape drafts: refused unless equal
                                      to the gate's own (its features describe those drafts)
  SGLANG_HVD_RECORD_TRACES=PATH       write token traces of served requests to PATH
  SGLANG_HVD_RECORD_QUEUE=N           recorder queue bound; beyond it records are dropped (4096)
  SGLANG_HVD_ALLOW_SGLANG_VERSION=V   run on an sglang version other than the tested one
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping

from ..drafter.protocol import RESOURCE_BOUNDS, DrafterConfig
from ..errors import HvdInputError

PREFIX = "SGLANG_HVD_"
TESTED_SGLANG_VERSION = "0.5.23"
_DRAFTER_FIELDS = tuple(f.name for f in dataclasses.fields(DrafterConfig))


@dataclasses.dataclass(frozen=True, slots=True)
class HVDServingConfig:
    enable: bool = False
    gate: str | None = None
    threshold: float | None = None
    score_rule: float | None = None  # decide by the cache draft's score >= this instead of the gate
    eagle_reserve: int | None = None
    cache_siblings: int | None = None
    drafter: str | None = None  # None: the fastest built
    drafter_overrides: tuple[tuple[str, float], ...] = ()  # DrafterConfig fields set explicitly
    record_traces: str | None = None
    record_queue: int = 4096
    allow_sglang_version: str | None = None

    def __post_init__(self):
        if self.enable and not self.gate:
            raise HvdInputError(f"{PREFIX}ENABLE=1 needs a gate: set {PREFIX}GATE=DIR (or --hvd-gate DIR)")
        if self.record_queue < 1:
            raise HvdInputError(f"{PREFIX}RECORD_QUEUE must be >= 1, got {self.record_queue}")
        if self.score_rule is not None and self.threshold is not None:
            raise HvdInputError(f"{PREFIX}THRESHOLD is the gate's and {PREFIX}SCORE_RULE replaces the gate: set one")
        if self.score_rule is not None and not math.isfinite(self.score_rule):
            raise HvdInputError(f"{PREFIX}SCORE_RULE must be a finite score, got {self.score_rule}")
        if self.eagle_reserve is not None and self.eagle_reserve < 0:
            raise HvdInputError(f"{PREFIX}EAGLE_RESERVE must be >= 0, got {self.eagle_reserve}")
        if self.cache_siblings is not None and self.cache_siblings < 0:
            raise HvdInputError(f"{PREFIX}CACHE_SIBLINGS must be >= 0, got {self.cache_siblings}")

    def drafter_config(self, base: DrafterConfig) -> DrafterConfig:
        """The gate's drafter settings (``base``) with any explicit overrides applied. Only
        resource bounds (protocol.RESOURCE_BOUNDS) may differ from the gate's: the other
        settings shape the drafts its features describe, so another value is refused."""
        for k, v in self.drafter_overrides:
            if k not in RESOURCE_BOUNDS and type(getattr(base, k))(v) != getattr(base, k):
                raise HvdInputError(
                    f"{PREFIX}{k.upper()}={v}: the gate was trained with {k} {getattr(base, k)}, and its features "
                    f"describe drafts of those settings; drop {PREFIX}{k.upper()} (or --hvd-{k.replace('_', '-')}) "
                    f"or train a gate with it (hvd train ... --{k.replace('_', '-')} {v})")
        try:
            return dataclasses.replace(base, **{k: type(getattr(base, k))(v) for k, v in self.drafter_overrides})
        except ValueError as e:
            raise HvdInputError(f"HVD drafter settings: {e}") from None

    def to_env(self) -> dict[str, str]:
        env = {f"{PREFIX}ENABLE": "1" if self.enable else "0"}
        for key, value in (("GATE", self.gate), ("THRESHOLD", self.threshold), ("SCORE_RULE", self.score_rule),
                           ("EAGLE_RESERVE", self.eagle_reserve), ("CACHE_SIBLINGS", self.cache_siblings),
                           ("DRAFTER", self.drafter),
                           ("RECORD_TRACES", self.record_traces), ("ALLOW_SGLANG_VERSION", self.allow_sglang_version)):
            if value is not None:
                env[PREFIX + key] = str(value)
        env[f"{PREFIX}RECORD_QUEUE"] = str(self.record_queue)
        for k, v in self.drafter_overrides:
            env[PREFIX + k.upper()] = repr(v) if isinstance(v, float) else str(v)
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HVDServingConfig:
        env = os.environ if environ is None else environ

        def get(key: str) -> str | None:
            value = env.get(PREFIX + key)
            return value if value not in (None, "") else None

        def number(key: str, kind):
            text = get(key)
            if text is None:
                return None
            try:
                return kind(text)
            except ValueError:
                raise HvdInputError(f"{PREFIX}{key}={text!r} is not a valid {kind.__name__}") from None

        enable = get("ENABLE")
        if enable not in (None, "0", "1"):
            raise HvdInputError(f"{PREFIX}ENABLE must be 0 or 1, got {enable!r}")
        overrides = []
        for name in _DRAFTER_FIELDS:
            kind = type(getattr(DrafterConfig(), name))
            value = number(name.upper(), kind)
            if value is not None:
                overrides.append((name, value))
        queue = number("RECORD_QUEUE", int)
        return cls(
            enable=enable == "1",
            gate=get("GATE"),
            threshold=number("THRESHOLD", float),
            score_rule=number("SCORE_RULE", float),
            eagle_reserve=number("EAGLE_RESERVE", int),
            cache_siblings=number("CACHE_SIBLINGS", int),
            drafter=get("DRAFTER"),
            drafter_overrides=tuple(overrides),
            record_traces=get("RECORD_TRACES"),
            record_queue=queue if queue is not None else 4096,
            allow_sglang_version=get("ALLOW_SGLANG_VERSION"),
        )
