"""Data sets that need no download (scikit-learn's digits, synthetic), split once into train and test tensors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import TensorDataset

from raydist.config import DataConfig


@dataclass
class Splits:
    train: TensorDataset
    test: TensorDataset
    num_features: int
    num_classes: int
    image_shape: tuple[int, int, int] | None  # (C, H, W) for image data


def _digits(cfg: DataConfig) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int]]:
    from sklearn.datasets import load_digits

    d = load_digits()  # bundled inside scikit-learn's wheel: no network
    x = (d.data / 16.0).astype(np.float32)  # pixel intensities are 0..16
    return x, d.target.astype(np.int64), (1, 8, 8)


def _synthetic(cfg: DataConfig) -> tuple[np.ndarray, np.ndarray, None]:
    # A fixed random linear teacher with a little label noise: learnable, but not trivially.
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((cfg.synthetic_samples, cfg.synthetic_features)).astype(np.float32)
    teacher = rng.standard_normal((cfg.synthetic_features, cfg.synthetic_classes))
    logits = x @ teacher + 0.5 * rng.standard_normal((cfg.synthetic_samples, cfg.synthetic_classes))
    return x, logits.argmax(axis=1).astype(np.int64), None


def load_splits(cfg: DataConfig) -> Splits:
    """The whole data set in memory, split by a stratified shuffle that depends only on cfg.split_seed."""
    from sklearn.model_selection import train_test_split

    x, y, image_shape = _digits(cfg) if cfg.name == "digits" else _synthetic(cfg)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=cfg.test_fraction, random_state=cfg.split_seed, stratify=y
    )
    return Splits(
        train=TensorDataset(torch.from_numpy(x_tr), torch.from_numpy(y_tr)),
        test=TensorDataset(torch.from_numpy(x_te), torch.from_numpy(y_te)),
        num_features=x.shape[1],
        num_classes=int(y.max()) + 1,
        image_shape=image_shape,
    )
