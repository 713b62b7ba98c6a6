"""The gate model: an MLP regressing accept_len, trained with MSE on the CPU (torch).

Inputs are standardised inside the model (mean/std buffers from the training rows), so
the exported graph takes raw features and the sidecar needs no normalisation block.
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
    def __init__(self, num_features: int, hidden: tuple[int, ...], mean: np.ndarray, std: np.ndarray):
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32))
        layers: list[nn.Module] = []
        width = num_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [batch, F] -> [batch]
        return self.net((x - self.mean) / self.std).squeeze(-1)


@dataclasses.dataclass(slots=True)
class TrainResult:
    model: GateMLP
    epochs: int
    best_epoch: int
    train_mse: list[float]
    validation_mse: list[float]


def standardisation(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = features.mean(axis=0)
    std = features.std(axis=0)
    std[std < 1e-6] = 1.0  # constant features pass through centred
    return mean.astype(np.float32), std.astype(np.float32)


def _mse(model: GateMLP, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        total = sum(((model(x[i : i + 8192]) - y[i : i + 8192]) ** 2).sum() for i in range(0, len(x), 8192))
        return float(total / max(len(x), 1))


def train_mlp(x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray, y_val: np.ndarray,
              config: TrainConfig) -> TrainResult:
    """Adam + MSE, seeded; early stopping on validation MSE, keeping the best epoch."""
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    mean, std = standardisation(x_train)
    model = GateMLP(x_train.shape[1], config.hidden, mean, std)
    opt = torch.optim.Adam(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    xt = torch.from_numpy(np.ascontiguousarray(x_train, dtype=np.float32))
    yt = torch.from_numpy(np.minimum(y_train, config.max_label).astype(np.float32))
    xv = torch.from_numpy(np.ascontiguousarray(x_val, dtype=np.float32))
    yv = torch.from_numpy(np.minimum(y_val, config.max_label).astype(np.float32))
    best, best_epoch, best_state = math.inf, 0, None
    train_curve, val_curve = [], []
    batches = math.ceil(len(xt) / config.batch_size)
    # early stopping ends most runs before max_epochs: a time left from it would mislead
    with progress(total=config.max_epochs, desc="train", unit="epoch", eta=False) as bar:
        for epoch in range(1, config.max_epochs + 1):
            model.train()
            order = torch.from_numpy(rng.permutation(len(xt)))
            total = 0.0
            for b in range(batches):
                idx = order[b * config.batch_size : (b + 1) * config.batch_size]
                loss = ((model(xt[idx]) - yt[idx]) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += float(loss.detach()) * len(idx)
            model.eval()
            train_curve.append(total / max(len(xt), 1))
            val = _mse(model, xv, yv) if len(xv) else train_curve[-1]
            val_curve.append(val)
            bar.set_postfix(train_mse=f"{train_curve[-1]:.3f}", val_mse=f"{val:.3f}")
            bar.update(1)
            if val < best - 1e-6:
                best, best_epoch = val, epoch
                best_state = {k: v.clone() for k, v in model.state_dict().items()}
            elif epoch - best_epoch >= config.patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return TrainResult(model, len(train_curve), best_epoch, train_curve, val_curve)
