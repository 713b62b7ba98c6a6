"""The gate model: an MLP regressing accept_len, trained with MSE on the CPU (torch).

Inputs are standardised inside the model (mean/std buffers from the training rows), so
the exported graph takes raw features and the sidecar needs no normalisation block.

With a payoff curve of W widths (``curve_width``) the last layer has 1 + W outputs:
accept_len, then W logits of the chain's survival s_k = P(its first k tokens are all
accepted), each trained with binary cross-entropy on 1[the chain's accepted length >= k]
for k <= min(draft length, W) (longer k say nothing of a shorter draft). The loss is
the MSE plus the survival terms summed over k; early stopping watches that sum.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from torch import nn

from sglang_hvd.report import progress


@dataclasses.dataclass(frozen=True, slots=True)
class TrainConfig:
    hidden: tuple[int, ...] = (64, 64)
    learning_rate: float = 1e-3
    weight_decay: float = 1e-5
    batch_size: int = 512
    max_epochs: int = 40
    patience: int = 4  # epochs without validation improvement before stopping
    seed: int = 0
    max_label: float = 64.0  # accept_len labels are clipped here (the longest draft)

    def __post_init__(self):
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"hidden layers must be positive sizes, got {self.hidden}")
        if self.max_epochs < 1 or self.batch_size < 1 or self.patience < 1:
            raise ValueError("max_epochs, batch_size and patience must be >= 1")


class GateMLP(nn.Module):
    def __init__(self, num_features: int, hidden: tuple[int, ...], mean: np.ndarray, std: np.ndarray,
                 curve_width: int = 0):
        super().__init__()
        self.curve_width = curve_width
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32))
        layers: list[nn.Module] = []
        width = num_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1 + curve_width))
        self.net = nn.Sequential(*layers)

    def heads(self, x: torch.Tensor) -> torch.Tensor:  # [batch, F] -> [batch, 1 + W]: accept_len, survival logits
        return self.net((x - self.mean) / self.std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [batch, F] -> [batch] accept_len
        return self.heads(x)[:, 0]

    def survival(self, x: torch.Tensor) -> torch.Tensor:  # [batch, F] -> [batch, W]
        return torch.sigmoid(self.heads(x)[:, 1:])


@dataclasses.dataclass(slots=True)
class TrainResult:
    model: GateMLP
    epochs: int
    best_epoch: int
    train_mse: list[float]
    validation_mse: list[float]
    validation_loss: list[float]  # what early stopping watched: the MSE, plus the survival terms with a curve


@dataclasses.dataclass(frozen=True, slots=True)
class CurveLabels:
    """What the payoff curve learns from, per example: the cache chain's accepted length
    (capped at the row) and the draft's length."""

    chain_accept: np.ndarray  # [examples] int
    draft_len: np.ndarray  # [examples] int

    def targets(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[examples, W]`` float32 survival labels and their mask (k <= min(draft length, W))."""
        k = np.arange(1, width + 1)[None, :]
        hits = (np.asarray(self.chain_accept)[:, None] >= k).astype(np.float32)
        mask = (k <= np.minimum(np.asarray(self.draft_len), width)[:, None]).astype(np.float32)
        return torch.from_numpy(hits), torch.from_numpy(mask)


def standardisation(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = features.mean(axis=0)
    std = features.std(axis=0)
    std[std < 1e-6] = 1.0  # constant features pass through centred
    return mean.astype(np.float32), std.astype(np.float32)


def _losses(model: GateMLP, x: torch.Tensor, y: torch.Tensor, hits: torch.Tensor | None,
            mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per example: the squared error of accept_len and the survival terms (0 without a curve)."""
    out = model.heads(x)
    squared = (out[:, 0] - y) ** 2
    if hits is None:
        return squared, torch.zeros_like(squared)
    terms = nn.functional.binary_cross_entropy_with_logits(out[:, 1:], hits, reduction="none") * mask
    return squared, terms.sum(1)


def _evaluate(model: GateMLP, x, y, hits, mask) -> tuple[float, float]:
    """(MSE, MSE + mean survival terms) over a whole set, in chunks."""
    with torch.no_grad():
        sq = su = 0.0
        for i in range(0, len(x), 8192):
            part = slice(i, i + 8192)
            a, b = _losses(model, x[part], y[part], None if hits is None else hits[part],
                           None if mask is None else mask[part])
            sq, su = sq + float(a.sum()), su + float(b.sum())
        n = max(len(x), 1)
        return sq / n, (sq + su) / n


def train_mlp(x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray, y_val: np.ndarray,
              config: TrainConfig, curve_width: int = 0, curve_train: CurveLabels | None = None,
              curve_val: CurveLabels | None = None) -> TrainResult:
    """Adam + MSE (and, with ``curve_width`` W > 0, the payoff curve's terms), seeded; early
    stopping on the validation loss, keeping the best epoch."""
    if curve_width and (curve_train is None or curve_val is None):
        raise ValueError("a payoff curve needs curve labels for the train and validation rows")
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    mean, std = standardisation(x_train)
    model = GateMLP(x_train.shape[1], config.hidden, mean, std, curve_width)
    opt = torch.optim.Adam(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    xt = torch.from_numpy(np.ascontiguousarray(x_train, dtype=np.float32))
    yt = torch.from_numpy(np.minimum(y_train, config.max_label).astype(np.float32))
    xv = torch.from_numpy(np.ascontiguousarray(x_val, dtype=np.float32))
    yv = torch.from_numpy(np.minimum(y_val, config.max_label).astype(np.float32))
    ht, mt = curve_train.targets(curve_width) if curve_width else (None, None)
    hv, mv = curve_val.targets(curve_width) if curve_width else (None, None)
    best, best_epoch, best_state = math.inf, 0, None
    train_curve, val_curve, val_loss = [], [], []
    batches = math.ceil(len(xt) / config.batch_size)
    # early stopping ends most runs before max_epochs: a time left from it would mislead
    with progress(total=config.max_epochs, desc="train", unit="epoch", eta=False) as bar:
        for epoch in range(1, config.max_epochs + 1):
            model.train()
            order = torch.from_numpy(rng.permutation(len(xt)))
            total = 0.0
            for b in range(batches):
                idx = order[b * config.batch_size : (b + 1) * config.batch_size]
                squared, terms = _losses(model, xt[idx], yt[idx], None if ht is None else ht[idx],
                                         None if mt is None else mt[idx])
                loss = (squared + terms).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += float(squared.detach().sum())
            model.eval()
            train_curve.append(total / max(len(xt), 1))
            mse, val = _evaluate(model, xv, yv, hv, mv) if len(xv) else (train_curve[-1], train_curve[-1])
            val_curve.append(mse)
            val_loss.append(val)
            bar.set_postfix(train_mse=f"{train_curve[-1]:.3f}", val_mse=f"{mse:.3f}")
            bar.update(1)
            if val < best - 1e-6:
                best, best_epoch = val, epoch
                best_state = {k: v.clone() for k, v in model.state_dict().items()}
            elif epoch - best_epoch >= config.patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return TrainResult(model, len(train_curve), best_epoch, train_curve, val_curve, val_loss)
