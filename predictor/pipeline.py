"""``hvd train`` end to end: split, label by replay at the verify shape, train,
calibrate the decision rule, export."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np

from sglang_hvd import __version__
from sglang_hvd.cost import CostModel
from sglang_hvd.decision import DecisionRule
from sglang_hvd.drafter import DrafterConfig
from sglang_hvd.drafter.native_drafter import default_drafter_name
from sglang_hvd.gate import Gate
from sglang_hvd.gate_spec import GateSpec, GateSplit
from sglang_hvd.replay.metrics import HIGH_PAYOFF_ACCEPT_LEN
from sglang_hvd.replay.sweep import (
    DEFAULT_GATE_THRESHOLDS,
    DEFAULT_RULE_THRESHOLDS,
    default_cache_siblings,
    default_reserves,
    sweep,
)
from sglang_hvd.report import Ticking, progress
from sglang_hvd.trace import TokenizerId, TraceRecord
from sglang_hvd.verify import VerifyModel

from .dataset import build_dataset, records_digest
from .export import to_onnx, write_gate_dir
from .mlp import CurveLabels, TrainConfig, train_mlp
from .split import TEST, TRAIN, VALIDATION, split_conversations


@dataclasses.dataclass(frozen=True, slots=True)
class TrainOptions:
    validation_fraction: float = 0.2
    test_fraction: float = 0.0
    split_seed: int = 0
    split_by: str = "conversation"  # split.GROUPINGS
    model: TrainConfig = TrainConfig()
    positions: str = "serving"  # where training examples are taken: dataset.POSITION_MODES
    drafter_name: str = dataclasses.field(default_factory=default_drafter_name)
    drafter: DrafterConfig = DrafterConfig()
    verify: VerifyModel = VerifyModel()
    costs: CostModel = CostModel()
    threshold: float | None = None  # fixed threshold; None calibrates it
    eagle_reserve: int | None = None  # fixed EAGLE3 reserve; None calibrates it
    cache_siblings: int | None = None  # siblings of a cache row (labels and rule); None: default_cache_siblings
    gate_thresholds: tuple[float, ...] = DEFAULT_GATE_THRESHOLDS
    rule_thresholds: tuple[float, ...] = DEFAULT_RULE_THRESHOLDS
    parity_rows: int = 4096
    payoff_curve: bool = True  # learn each draft's survival by width (mlp.py; payoff.py prices by it)

    def __post_init__(self):
        """What train_gate would refuse after reading the traces, refused when the options are built."""
        if not (0 <= self.validation_fraction < 1 and 0 <= self.test_fraction < 1
                and self.validation_fraction + self.test_fraction < 1):
            raise ValueError("validation and test fractions must be in [0, 1) and sum to less than 1")
        if self.cache_siblings and not self.verify.shape.allows_branches:
            raise ValueError(f"cache siblings need tree rows (topk > 1); the shape is {self.verify.shape.describe()}")
        if self.cache_siblings and self.positions != "serving":
            raise ValueError("dense positions are labelled with the chain's payoff only: with --positions dense pass "
                             "--cache-siblings 0 (or use --positions serving, whose labels are the row tree's payoff)")


def _high_payoff(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    hp, ht = pred >= HIGH_PAYOFF_ACCEPT_LEN, true >= HIGH_PAYOFF_ACCEPT_LEN
    tp = int((hp & ht).sum())
    return {"precision_at_6": tp / max(int(hp.sum()), 1), "recall_at_6": tp / max(int(ht.sum()), 1),
            "mae": float(np.abs(pred - true).mean()) if len(true) else 0.0}


def train_gate(records: Sequence[TraceRecord], token_flags: np.ndarray, tokenizer: TokenizerId, out_dir: str,
               opts: TrainOptions, log: Callable[[str], None] = print) -> dict:
    """Train, calibrate and write a gate directory; returns the metrics (also metrics.json)."""
    import torch

    t0 = time.perf_counter()
    # dense positions carry chain labels only: their gates verify chains unless told otherwise (and then refused)
    default = default_cache_siblings(opts.verify.shape) if opts.positions == "serving" else 0
    siblings = default if opts.cache_siblings is None else opts.cache_siblings
    if siblings and not opts.verify.shape.allows_branches:
        raise ValueError(f"cache siblings need tree rows (topk > 1); the shape is {opts.verify.shape.describe()}")
    side = split_conversations(records, opts.validation_fraction, opts.test_fraction, opts.split_seed, opts.split_by)
    parts = {name: [r for r in records if side[r.conv_id] == name] for name in (TRAIN, VALIDATION, TEST)}
    if not parts[TRAIN] or not parts[VALIDATION]:
        raise ValueError(f"need conversations on both the train and validation sides; got {len(parts[TRAIN])} train "
                         f"and {len(parts[VALIDATION])} validation requests "
                         "(add traces or change --validation-fraction)")
    log(f"split by {opts.split_by}: {len(parts[TRAIN])} train, {len(parts[VALIDATION])} validation, "
        f"{len(parts[TEST])} held-out test requests")
    train = build_dataset(parts[TRAIN], opts.drafter_name, opts.drafter, token_flags, desc="label train",
                          positions=opts.positions, model=opts.verify, siblings=siblings)
    val = build_dataset(parts[VALIDATION], opts.drafter_name, opts.drafter, token_flags, desc="label validation",
                        positions=opts.positions, model=opts.verify, siblings=siblings)
    if len(train) == 0 or len(val) == 0:
        raise ValueError("no cache drafts to learn from (the traces never repeat themselves?)")
    t_label = time.perf_counter()
    log(f"labelled {len(train):,} train and {len(val):,} validation drafts in {t_label - t0:.0f} s")
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    width = opts.verify.shape.draft_nodes if opts.payoff_curve else 0
    fit = train_mlp(train.features, train.accept_len, val.features, val.accept_len, opts.model, width,
                    CurveLabels(train.chain_accept, train.draft_len), CurveLabels(val.chain_accept, val.draft_len))
    t_fit = time.perf_counter()
    log(f"trained {fit.epochs} epochs (best {fit.best_epoch}, "
        f"validation MSE {fit.validation_mse[fit.best_epoch - 1]:.3f}) "
        f"in {t_fit - t_label:.0f} s")
    with torch.no_grad():
        val_pred = fit.model(torch.from_numpy(val.features)).numpy()

    provenance = {
        "threshold_source": "fixed" if opts.threshold is not None else "calibrated",
        "eagle_reserve_source": "fixed" if opts.eagle_reserve is not None else "calibrated",
        "labels": f"row tree payoff: the chain and up to {siblings} siblings" if siblings else "chain payoff",
        "model": {"hidden": list(opts.model.hidden),
                  "loss": f"mse + survival cross-entropy at {width} widths" if width else "mse",
                  "epochs": fit.epochs, "best_epoch": fit.best_epoch, "seed": opts.model.seed},
        "training": {"positions": opts.positions, "digest": records_digest(parts[TRAIN]), "requests": len(parts[TRAIN]),
                     "rows": len(train), "validation_requests": len(parts[VALIDATION]), "validation_rows": len(val)},
        "validation": {"mse": fit.validation_mse[fit.best_epoch - 1], **_high_payoff(val_pred, val.accept_len)},
        "sglang_hvd_version": __version__,
    }
    spec = GateSpec(
        decision=DecisionRule(opts.threshold if opts.threshold is not None else 1.0, opts.eagle_reserve or 0, siblings),
        drafter=opts.drafter, verify=opts.verify, tokenizer=tokenizer, costs=opts.costs,
        split=GateSplit(seed=opts.split_seed, validation_fraction=opts.validation_fraction,
                        test_fraction=opts.test_fraction, group_by=opts.split_by,
                        test_conversations=tuple(sorted({r.conv_id for r in parts[TEST]})),
                        validation_conversations=tuple(sorted({r.conv_id for r in parts[VALIDATION]}))),
        drafter_impl=opts.drafter_name, payoff_curve=width, provenance=provenance)
    # Calibrate on validation conversations, replayed as a server would run them.
    gate = Gate.in_memory(spec, token_flags.astype(np.uint16), to_onnx(fit.model).SerializeToString())
    thresholds = (opts.threshold,) if opts.threshold is not None else opts.gate_thresholds
    reserves = (opts.eagle_reserve,) if opts.eagle_reserve is not None else default_reserves(opts.verify.shape)
    log(f"calibrating on validation replay: {len(thresholds) * len(reserves)} decision rules and "
        f"{len(opts.rule_thresholds)} rule constants at once")
    with progress(total=sum(len(r.output_ids) for r in parts[VALIDATION]), desc="calibrate", unit="tok",
                  unit_scale=True) as bar:
        cal = sweep(Ticking(parts[VALIDATION], bar, lambda r: len(r.output_ids)), gate, opts.drafter_name, opts.verify,
                    opts.costs, thresholds, opts.rule_thresholds, reserves, (siblings,))
    spec = dataclasses.replace(spec, decision=cal.best, rule_threshold=cal.best_rule_threshold)
    t_cal = time.perf_counter()
    log(f"calibrated on validation replay in {t_cal - t_fit:.0f} s: threshold {cal.best.threshold:g} "
        f"({provenance['threshold_source']}), EAGLE3 reserve {cal.best.eagle_reserve} "
        f"({provenance['eagle_reserve_source']}), cache siblings {cal.best.cache_siblings}, best rule constant "
        f"{cal.best_rule_threshold:g}")
    rows = val.features[: opts.parity_rows]
    parity = write_gate_dir(out_dir, fit.model, spec, token_flags, rows)
    metrics = {
        "train_mse": fit.train_mse, "validation_mse": fit.validation_mse,
        "validation": provenance["validation"], "calibration": cal.to_json(), "decision": cal.best.to_json(),
        "verify": opts.verify.to_json(),
        "parity_max_abs_diff": parity,
        "seconds": {"label": t_label - t0, "train": t_fit - t_label, "calibrate": t_cal - t_fit,
                    "total": time.perf_counter() - t0},
    }
    return metrics
