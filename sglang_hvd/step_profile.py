"""Step-time profile: what one decode step costs, in milliseconds, by batch, row width and
context. One typed, versioned JSON record (``profile.json``).

Four terms, each a small roofline-shaped formula whose constants are fitted to
measurements (``fit_*``: ``hvd profile`` against a server's timed steps, and the server's
own online refit, serving/step_timing.py) or, for the shipped estimates, derived from a
model's size and a GPU's bandwidth and throughput:

  verify(B, N, C)   one target forward over B rows of N tokens (N = 1: a plain decode
                    step) with C context tokens in all rows together:
                      fixed_ms + per_row_ms * B + per_context_token_ms * C
                      + per_token_ms * max(knee_tokens, B * N)
                    Below ``knee_tokens`` query tokens the forward is memory-bound (the
                    weights are read once, whatever B * N is), above it compute-bound;
                    attention reads every row's KV once whatever N is. ``per_row_ms``:
                    what a row costs whatever its width (its attention and sampling set-up):
                    on the CPU harness four rows of one token cost ~27% more than one row of
                    four; the estimates leave it at 0 (format 1 profiles had no such term).
  eagle3(B, S, K, C)  EAGLE3's draft forwards for a verify of S steps at topk K: S - 1 of them
                    (SGLang's first draft step takes its tokens from the extend's top-k, and
                    eagle_worker_v2's draft loop stops before the last step's forward):
                      fixed_ms + per_row_ms * B
                      + (S - 1) * (per_step_ms + per_token_ms * B * K + per_context_token_ms * C)
                    (``fixed_ms`` and ``per_row_ms``: building the tree from the steps'
                    candidates, which on the CPU harness grows with the batch: a one-step
                    draft took 1.1 ms at batch 16, 0.5 at 4; format 4, 0 before). A step
                    none of whose rows verifies an EAGLE3 branch skips them.
  extend(B, C)      the draft model's extend after each verify (the accepted tokens through
                    the draft model, for its next draft): a server that holds an EAGLE3 model
                    runs it EVERY decode step, drafted or not (SGLang does so at steps 0 too,
                    to keep the draft's KV cache warm):
                      extend_ms + extend_per_token_ms * B + extend_per_context_token_ms * C
                    with constants of its own (format 4; a format 1-3 profile's extend used
                    the draft steps' per_token_ms and per_context_token_ms, and is read so):
                    on the CPU harness the extend's context term is ~8x a draft step's, and
                    priced by the draft steps' it was off by ~30% at held-back cells.
  hvd_cpu(B)        HVD's own host time per step: the cache drafts, and the decision
                    (features, gate, row trees):
                      fixed_ms + (draft_per_row_ms + decide_per_row_ms) * B
                    SuffixDecoding alone (cache_only) pays fixed_ms + draft_per_row_ms * B.

  untimed           what an HVD server's decode step costs beyond the timed parts: SGLang's
                    scheduler and speculative bookkeeping around the forwards, whatever
                    the tier (``hvd profile`` and the online refit measure it from each
                    step's wall time; 0 in the estimates, which do not model it, and in
                    format 1 and 2 profiles). Paid by the steps that draft on the host
                    (HVD's and cache_only's: an HVD server runs with
                    --disable-overlap-schedule); SGLang's own servers (greedy, EAGLE3)
                    can overlap their scheduling with the forwards, so replay charges
                    them none of it (in HVD's disfavour where they do not).

  step = verify + eagle3 (when drafted) + extend (a server with a draft model)
         + hvd_cpu (HVD's, or the drafts' alone) + untimed (HVD's server)

Shipped estimates (``ESTIMATES``; labelled ``kind: estimate``, used until a measured
profile exists) come from ``roofline``: Qwen3-8B in bf16 (16.4 GB of weights read per
forward, 15.1 GFLOP per token, 147,456 bytes of KV per context token: 36 layers x 8 KV
heads x 128 x K and V x 2 bytes), its EAGLE3 head (one decoder layer and a 32k-vocab
lm_head, ~0.35 B parameters, 4,096 KV bytes per context token), on an H200 (4.0 TB/s and
600 TFLOP/s usable, of 4.8 TB/s and 989 TFLOP/s peak) or an H100 SXM (2.8 TB/s and 550
TFLOP/s usable). Launch overheads: 0.4 ms per target forward, 0.3 ms per draft forward (a
draft step, or the extend) and 0.1 ms to build a tree, the order CUDA-graphed decode steps
show.
Attention FLOPs and sampling are left out. An estimate, not a measurement.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Sequence

import numpy as np

from .errors import HvdInputError
from .jsonl import write_json
from .tiers import Tier

# 2: verify.per_row_ms; 3: untimed_ms; 4: eagle3.extend_per_token_ms, extend_per_context_token_ms, per_row_ms
PROFILE_FORMAT = 4
# a format 1 profile is read with verify.per_row_ms = 0, a format 1 or 2 one with untimed_ms = 0, and a format 1-3
# one with the extend's per-token and context constants the draft steps' and eagle3.per_row_ms = 0 (what they meant)
READS_FORMATS = (1, 2, 3, 4)
KINDS = ("estimate", "measured")


def _check(owner: str, **values: float) -> None:
    for name, v in values.items():
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ValueError(f"{owner}.{name} must be a finite number >= 0, got {v!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class ForwardCost:
    """A target forward: fixed_ms + per_row_ms * B + per_context_token_ms * C
    + per_token_ms * max(knee_tokens, B * N)."""

    fixed_ms: float
    per_token_ms: float
    knee_tokens: float
    per_context_token_ms: float
    per_row_ms: float = 0.0

    def __post_init__(self):
        _check("verify", fixed_ms=self.fixed_ms, per_token_ms=self.per_token_ms, knee_tokens=self.knee_tokens,
               per_context_token_ms=self.per_context_token_ms, per_row_ms=self.per_row_ms)

    def ms(self, batch: int, tokens_per_row: int, context_tokens: float) -> float:
        return (self.fixed_ms + self.per_row_ms * batch + self.per_context_token_ms * context_tokens
                + self.per_token_ms * max(self.knee_tokens, batch * tokens_per_row))


@dataclasses.dataclass(frozen=True, slots=True)
class DraftCost:
    """EAGLE3's drafting per verify: fixed_ms + per_row_ms * B + (S - 1) * (per_step_ms + per_token_ms * B * K
    + per_context_token_ms * C), S - 1 draft forwards for S steps (the first step's tokens come from the extend);
    its extend, every step of a server that holds the draft model: extend_ms + extend_per_token_ms * B
    + extend_per_context_token_ms * C (each None: the draft steps' own, per_token_ms and
    per_context_token_ms, as format 1-3 profiles priced the extend)."""

    fixed_ms: float
    per_step_ms: float
    per_token_ms: float
    per_context_token_ms: float
    extend_ms: float
    extend_per_token_ms: float | None = None
    extend_per_context_token_ms: float | None = None
    per_row_ms: float = 0.0  # the tree's build per row, whatever the steps

    def __post_init__(self):
        if self.extend_per_token_ms is None:
            object.__setattr__(self, "extend_per_token_ms", self.per_token_ms)
        if self.extend_per_context_token_ms is None:
            object.__setattr__(self, "extend_per_context_token_ms", self.per_context_token_ms)
        _check("eagle3", fixed_ms=self.fixed_ms, per_step_ms=self.per_step_ms, per_token_ms=self.per_token_ms,
               per_context_token_ms=self.per_context_token_ms, extend_ms=self.extend_ms,
               extend_per_token_ms=self.extend_per_token_ms,
               extend_per_context_token_ms=self.extend_per_context_token_ms, per_row_ms=self.per_row_ms)

    def ms(self, batch: int, steps: int, topk: int, context_tokens: float) -> float:
        forwards = max(steps - 1, 0)
        return self.fixed_ms + self.per_row_ms * batch + forwards * (
            self.per_step_ms + self.per_token_ms * batch * topk + self.per_context_token_ms * context_tokens)

    def extend(self, batch: int, context_tokens: float) -> float:
        return self.extend_ms + self.extend_per_token_ms * batch + self.extend_per_context_token_ms * context_tokens


HOST_NONE, HOST_DRAFTS, HOST_HVD = "none", "drafts", "hvd"  # what host work a step pays (StepProfile.step_ms)
# When a step pays EAGLE3's draft extend (StepProfile.step_ms): never (no draft model), every
# step (SGLang's rule, steps 0 included), or only steps that draft (a server started with
# --hvd-skip-idle-extend: it skips the extend after a step without an EAGLE3 draft)
EXTEND_NONE, EXTEND_EVERY_STEP, EXTEND_WHEN_DRAFTED = "none", "every-step", "when-drafted"


@dataclasses.dataclass(frozen=True, slots=True)
class HostCost:
    """HVD's host time per step: fixed_ms + (draft_per_row_ms + decide_per_row_ms) * B."""

    fixed_ms: float
    draft_per_row_ms: float
    decide_per_row_ms: float

    def __post_init__(self):
        _check("hvd_cpu", fixed_ms=self.fixed_ms, draft_per_row_ms=self.draft_per_row_ms,
               decide_per_row_ms=self.decide_per_row_ms)

    def ms(self, batch: int, host: str = HOST_HVD) -> float:
        if host == HOST_NONE:
            return 0.0
        per_row = self.draft_per_row_ms + (self.decide_per_row_ms if host == HOST_HVD else 0.0)
        return self.fixed_ms + per_row * batch


@dataclasses.dataclass(frozen=True, slots=True)
class StepProfile:
    """What a decode step costs on one deployment (model pair, hardware, SGLang flags)."""

    name: str
    kind: str  # "estimate" or "measured"
    target_model: str
    draft_model: str
    hardware: str
    verify: ForwardCost
    eagle3: DraftCost
    hvd_cpu: HostCost
    untimed_ms: float = 0.0  # an HVD server's step beyond the timed parts (the module docstring)
    note: str = ""
    fit_error: dict[str, float] = dataclasses.field(default_factory=dict)  # mean |predicted/measured - 1| per term

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"profile kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        _check("profile", untimed_ms=self.untimed_ms)

    def step_ms(self, tier: Tier, batch: int, context_tokens: float, eagle3: bool, host: str = HOST_HVD,
                extend: str = EXTEND_EVERY_STEP) -> float:
        """One decode step of ``batch`` rows at ``tier``: the verify forward, EAGLE3's
        draft forwards when ``eagle3`` (a speculating tier only), its extend as ``extend``
        says (EXTEND_EVERY_STEP, EXTEND_WHEN_DRAFTED or EXTEND_NONE), and ``host`` work:
        HOST_HVD (drafts and decision), HOST_DRAFTS (cache drafts alone) or HOST_NONE; and,
        with host work (HVD's server), ``untimed_ms``."""
        t = self.verify.ms(batch, tier.tokens_per_row, context_tokens)
        drafted = eagle3 and tier.shape is not None
        if drafted:
            t += self.eagle3.ms(batch, tier.shape.steps, tier.shape.topk, context_tokens)
        if extend == EXTEND_EVERY_STEP or (extend == EXTEND_WHEN_DRAFTED and drafted):
            t += self.eagle3.extend(batch, context_tokens)
        return t + (0.0 if host == HOST_NONE else self.hvd_cpu.ms(batch, host) + self.untimed_ms)

    def describe(self) -> str:
        return f"{self.name} ({self.kind}: {self.target_model} + {self.draft_model} on {self.hardware})"

    def to_json(self) -> dict:
        return {"format_version": PROFILE_FORMAT, "name": self.name, "kind": self.kind,
                "target_model": self.target_model, "draft_model": self.draft_model, "hardware": self.hardware,
                "note": self.note, "verify": dataclasses.asdict(self.verify),
                "eagle3": dataclasses.asdict(self.eagle3), "hvd_cpu": dataclasses.asdict(self.hvd_cpu),
                "untimed_ms": self.untimed_ms, "fit_error": dict(self.fit_error)}

    @classmethod
    def from_json(cls, d: dict, where: str = "profile") -> StepProfile:
        if not isinstance(d, dict):
            raise HvdInputError(f"{where}: expected a JSON object (a step-time profile; {_FIX})")
        version = d.get("format_version")
        if version not in READS_FORMATS:
            raise HvdInputError(f"{where}: profile format_version {version!r}, this sglang-hvd reads "
                                f"{', '.join(map(str, READS_FORMATS[:-1]))} and {READS_FORMATS[-1]}; {_FIX}")
        try:
            return cls(name=str(d["name"]), kind=str(d["kind"]), target_model=str(d["target_model"]),
                       draft_model=str(d["draft_model"]), hardware=str(d["hardware"]), note=str(d.get("note", "")),
                       verify=ForwardCost(**d["verify"]), eagle3=DraftCost(**d["eagle3"]),
                       hvd_cpu=HostCost(**d["hvd_cpu"]), untimed_ms=d["untimed_ms"] if version >= 3 else 0.0,
                       fit_error={str(k): float(v) for k, v in d.get("fit_error", {}).items()})
        except KeyError as e:
            raise HvdInputError(f"{where}: the profile lacks {e}; {_FIX}") from None
        except (TypeError, ValueError) as e:
            raise HvdInputError(f"{where}: bad profile ({e}); {_FIX}") from None

    def write(self, path: str) -> None:
        write_json(path, self.to_json())


def roofline(name: str, hardware: str, bandwidth_tb_s: float, tflop_s: float, weight_gb: float = 16.4,
             gflop_per_token: float = 15.1, kv_bytes_per_token: float = 147_456, draft_params_b: float = 0.35,
             draft_kv_bytes_per_token: float = 4_096, forward_overhead_ms: float = 0.4,
             draft_step_overhead_ms: float = 0.3, tree_build_ms: float = 0.1,
             hvd_cpu: HostCost = HostCost(0.15, 0.01, 0.02)) -> StepProfile:
    """A profile from first principles (the module docstring's formula and constants)."""
    bw = bandwidth_tb_s * 1e12  # bytes/s
    flops = tflop_s * 1e12
    per_token_ms = gflop_per_token * 1e9 / flops * 1e3
    weights_ms = weight_gb * 1e9 / bw * 1e3
    verify = ForwardCost(forward_overhead_ms, per_token_ms, weights_ms / per_token_ms, kv_bytes_per_token / bw * 1e3)
    draft_weights_ms = 2 * draft_params_b * 1e9 / bw * 1e3  # bf16
    eagle3 = DraftCost(tree_build_ms, draft_step_overhead_ms + draft_weights_ms,
                       2 * draft_params_b * 1e9 / flops * 1e3, draft_kv_bytes_per_token / bw * 1e3,
                       extend_ms=draft_step_overhead_ms + draft_weights_ms)
    return StepProfile(name=name, kind="estimate", target_model="Qwen/Qwen3-8B",
                       draft_model="EAGLE3 head for Qwen3-8B", hardware=hardware, verify=verify, eagle3=eagle3,
                       hvd_cpu=hvd_cpu, note=f"roofline estimate: {bandwidth_tb_s} TB/s, {tflop_s} TFLOP/s usable, "
                       f"{weight_gb} GB of weights, {gflop_per_token} GFLOP per token (sglang_hvd/step_profile.py)")


ESTIMATES = {
    "qwen3-8b-h200": lambda: roofline("qwen3-8b-h200", "NVIDIA H200", 4.0, 600.0),
    "qwen3-8b-h100": lambda: roofline("qwen3-8b-h100", "NVIDIA H100 SXM", 2.8, 550.0),
}
DEFAULT_PROFILE = "qwen3-8b-h200"
_FIX = f"pass a shipped estimate instead ({', '.join(ESTIMATES)}) or a profile StepProfile.write wrote"


def load_profile(spec: str) -> StepProfile:
    """A shipped estimate by name (``qwen3-8b-h200``) or a profile file (StepProfile.write)."""
    if spec in ESTIMATES:
        return ESTIMATES[spec]()
    try:
        with open(spec) as f:
            d = json.load(f)
    except FileNotFoundError:
        raise HvdInputError(f"{spec}: no such profile file, and not a shipped estimate "
                            f"({', '.join(ESTIMATES)})") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HvdInputError(f"{spec}: cannot read the profile ({e})") from None
    return StepProfile.from_json(d, where=spec)


# ------------------------------------------------------------------------------ fitting


def _nnls(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Least squares with every coefficient >= 0, by trying each subset of columns (a
    handful of columns): ``(coefficients, sum of squared residuals)``. Of fits equal but for
    rounding, the one of fewer columns (a constant the data do not ask for stays 0)."""
    c, sse = _nnls_many(x[None], y)
    return c[0], float(sse[0])


def _nnls_many(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``_nnls`` of M designs at once (``x``: M x samples x columns, one ``y``): the
    coefficients (M x columns) and each fit's sum of squared residuals (M). Each subset is
    solved for all M from its columns' Gram matrix (columns scaled to unit norm; the
    pseudo-inverse keeps a collinear subset's least-norm solution, as lstsq does), its sum
    of squares too (so "equal but for rounding" is within 1e-12 of y's): the online refit
    fits hundreds of knees over 2,048 served steps on the scheduler's thread."""
    m, _, k = x.shape
    norm = np.linalg.norm(x, axis=1)  # M x k
    norm[norm == 0] = 1.0
    xs = x / norm[:, None, :]
    xt = xs.transpose(0, 2, 1)
    gram, xty = xt @ xs, xt @ y
    yy = float(np.sum(y ** 2))
    best, best_sse = np.zeros((m, k)), np.full(m, yy)
    for r in range(1, k + 1):
        for cols in itertools.combinations(range(k), r):
            idx = list(cols)
            g = gram[:, idx][:, :, idx]
            c = np.einsum("mkj,mj->mk", np.linalg.pinv(g), xty[:, idx])
            sse = np.maximum(yy - np.sum(c * (2 * xty[:, idx] - (g @ c[:, :, None])[:, :, 0]), axis=1), 0.0)
            better = np.all(c >= 0, axis=1) & (sse < best_sse * (1 - 1e-9) - 1e-12 * yy)
            best[better] = 0.0
            best[np.ix_(better, idx)] = c[better]
            best_sse[better] = sse[better]
    return best / norm, best_sse


@dataclasses.dataclass(frozen=True, slots=True)
class VerifySample:
    batch: int
    tokens_per_row: int
    context_tokens: int
    ms: float


@dataclasses.dataclass(frozen=True, slots=True)
class DraftSample:
    batch: int
    steps: int
    topk: int
    context_tokens: int
    ms: float


def fit_verify(samples: Sequence[VerifySample]) -> ForwardCost:
    """The ForwardCost closest to the samples in relative error: the knee is searched over
    the sampled B * N (and 1) and between them, the other four constants fitted >= 0 at each
    (of equal fits, the one of fewer non-zero constants)."""
    if len(samples) < 3:
        raise ValueError(f"fitting a verify cost needs >= 3 samples, got {len(samples)}")
    rows = np.array([s.batch for s in samples], dtype=np.float64)
    bn = rows * np.array([s.tokens_per_row for s in samples], dtype=np.float64)
    ctx = np.array([s.context_tokens for s in samples], dtype=np.float64)
    y = np.array([s.ms for s in samples], dtype=np.float64)
    w = 1.0 / y  # relative error
    best = None
    sampled = np.array(sorted(set(bn.tolist()) | {1.0}))
    # the knee rarely sits on a sampled B * N: between two sampled values, try up to 16 more (geometric
    # steps), fewer where the sampled values are close (steps of 2%: the online refit's 2,048 steps span
    # hundreds of B * N, whose 16 each made a refit on the scheduler's thread take seconds)
    gaps = [np.geomspace(lo, hi, 2 + min(16, max(0, math.ceil(math.log(hi / lo) / math.log(1.02)) - 1)))[1:-1]
            for lo, hi in zip(sampled, sampled[1:])]
    knees = np.unique(np.concatenate([sampled] + gaps))
    base = np.stack([np.ones_like(y), ctx, np.zeros_like(y), rows], axis=1) * w[:, None]
    for at in range(0, len(knees), 64):  # 64 knees x 2,048 steps x 4 columns: 4 MB at a time
        chunk = knees[at:at + 64]
        x = np.repeat(base[None], len(chunk), axis=0)
        x[:, :, 2] = np.maximum(chunk[:, None], bn[None, :]) * w[None, :]
        c, sse = _nnls_many(x, y * w)
        i = int(np.argmin(sse))  # the first of equal fits, as knees rise
        if best is None or sse[i] < best[0]:
            best = (float(sse[i]), float(chunk[i]), c[i])
    _, knee, (fixed, per_ctx, per_tok, per_row) = best
    return ForwardCost(float(fixed), float(per_tok), float(knee), float(per_ctx), float(per_row))


def fit_draft(samples: Sequence[DraftSample], extend_ms: float, extend_per_token_ms: float | None = None,
              extend_per_context_token_ms: float | None = None) -> DraftCost:
    """The draft forwards' constants from samples of S steps at topk K; the extend's are kept as
    given: ``extend_ms`` its fixed part, and its per-token and context constants (None: the
    draft steps' fitted here; ``fit_extend`` fits its own)."""
    if len(samples) < 2:
        raise ValueError(f"fitting a draft cost needs >= 2 samples, got {len(samples)}")
    s = np.array([max(x.steps - 1, 0) for x in samples], dtype=np.float64)  # draft forwards
    bk = np.array([x.batch * x.topk for x in samples], dtype=np.float64)
    ctx = np.array([x.context_tokens for x in samples], dtype=np.float64)
    y = np.array([x.ms for x in samples], dtype=np.float64)
    w = 1.0 / y
    b = np.array([x.batch for x in samples], dtype=np.float64)
    c, _ = _nnls(np.stack([np.ones_like(y), s, s * bk, s * ctx, b], axis=1) * w[:, None], y * w)
    fixed, per_step, per_token, per_ctx, per_row = (float(v) for v in c)
    return DraftCost(fixed, per_step, per_token, per_ctx, extend_ms=float(extend_ms), per_row_ms=per_row,
                     extend_per_token_ms=extend_per_token_ms, extend_per_context_token_ms=extend_per_context_token_ms)


@dataclasses.dataclass(frozen=True, slots=True)
class ExtendSample:
    batch: int
    context_tokens: int
    ms: float


def fit_extend(samples: Sequence[ExtendSample], draft: DraftCost) -> DraftCost:
    """``draft`` with the extend's constants fitted to the samples, in relative error and >= 0:
    its fixed part always; its per-token constant where the samples span 2 batch sizes or
    more, its context constant where their contexts span a factor of 2 or more (a constant
    the samples cannot tell keeps ``draft``'s). With neither, the fixed part is the median
    of what the kept constants leave (a pause in one step does not pull it)."""
    if not samples:
        raise ValueError("fitting the draft extend needs >= 1 sample")
    b = np.array([x.batch for x in samples], dtype=np.float64)
    ctx = np.array([x.context_tokens for x in samples], dtype=np.float64)
    y = np.array([x.ms for x in samples], dtype=np.float64)
    per_token, per_ctx = draft.extend_per_token_ms, draft.extend_per_context_token_ms
    fit_tokens = len(np.unique(b)) >= 2
    fit_ctx = ctx.max() >= 2 * max(ctx.min(), 1.0)
    rest = y - (0.0 if fit_tokens else per_token * b) - (0.0 if fit_ctx else per_ctx * ctx)
    if not (fit_tokens or fit_ctx):
        return dataclasses.replace(draft, extend_ms=max(float(np.median(rest)), 0.0))
    cols = [np.ones_like(y)] + ([b] if fit_tokens else []) + ([ctx] if fit_ctx else [])
    w = 1.0 / y
    c, _ = _nnls(np.stack(cols, axis=1) * w[:, None], rest * w)
    fitted = iter(float(v) for v in c[1:])
    return dataclasses.replace(draft, extend_ms=float(c[0]),
                               extend_per_token_ms=next(fitted) if fit_tokens else per_token,
                               extend_per_context_token_ms=next(fitted) if fit_ctx else per_ctx)


def fit_host(batches: Sequence[int], draft_ms: Sequence[float], total_ms: Sequence[float]) -> HostCost:
    """From the host time per step by batch: the drafts' part and the whole (drafts and decision)."""
    if len(batches) < 2:
        raise ValueError(f"fitting HVD's host cost needs >= 2 samples, got {len(batches)}")
    b = np.asarray(batches, dtype=np.float64)
    x = np.stack([np.ones_like(b), b], axis=1)
    (fixed, per_row), _ = _nnls(x, np.asarray(total_ms, dtype=np.float64))
    (_, draft_per_row), _ = _nnls(x, np.asarray(draft_ms, dtype=np.float64))
    draft_per_row = min(draft_per_row, per_row)
    return HostCost(float(fixed), float(draft_per_row), float(per_row - draft_per_row))


def relative_error(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Mean |predicted / measured - 1|."""
    p, m = np.asarray(predicted, dtype=np.float64), np.asarray(measured, dtype=np.float64)
    return float(np.mean(np.abs(p / m - 1.0))) if len(m) else 0.0
