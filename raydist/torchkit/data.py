"""The data: yours (`data.factory`), or built-in sets that need no download (scikit-learn's digits, synthetic),
split once into train and test tensors."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from raydist.config import DataConfig
from raydist.errors import RaydistError

if TYPE_CHECKING:  # torch is imported where a data set is built: the driver's checks of a built-in set need none
    from torch.utils.data import Dataset


@dataclass
class Splits:
    """The train and test sets, and what a built-in model needs to know of them (a model factory gets this too)."""

    train: Dataset
    test: Dataset
    image_shape: tuple[int, int, int] | None  # (C, H, W) for image data
    known_features: int | None = None
    known_classes: int | None = None

    @property
    def num_train(self) -> int:
        return len(self.train)

    @property
    def num_features(self) -> int:
        """Input features of one sample (its input tensor's element count)."""
        if self.known_features is None:
            self.known_features = self.train[0][0].numel()
        return self.known_features

    @property
    def num_classes(self) -> int:
        """1 + the largest integer target of the train set (a scan of your data set, done only when asked)."""
        if self.known_classes is None:
            import torch

            self.known_classes = 1 + max(int(torch.as_tensor(self.train[i][1]).max()) for i in range(len(self.train)))
        return self.known_classes


def _digits(cfg: DataConfig) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int]]:
    # The file scikit-learn's load_digits reads, bundled inside its wheel (no network), read without importing
    # scikit-learn: with scipy that import is ~0.9 s of every worker's start-up.
    import importlib.util
    import os

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise RaydistError("data.name=digits needs scikit-learn installed (it ships the digits)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "datasets", "data", "digits.csv.gz")
    table = np.loadtxt(path, delimiter=",")
    x = (table[:, :-1] / 16.0).astype(np.float32)  # pixel intensities are 0..16
    return x, table[:, -1].astype(np.int64), (1, 8, 8)


def _approximate_mode(class_counts: np.ndarray, n_draws: int, rng: np.random.RandomState) -> np.ndarray:
    """scikit-learn's utils.extmath._approximate_mode: per-class draws that add up to n_draws, ties broken by rng."""
    continuous = class_counts / class_counts.sum() * n_draws
    floored = np.floor(continuous)
    need_to_add = int(n_draws - floored.sum())
    if need_to_add > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[::-1]:
            (inds,) = np.where(remainder == value)
            add_now = min(len(inds), need_to_add)
            floored[rng.choice(inds, size=add_now, replace=False)] += 1
            need_to_add -= add_now
            if need_to_add == 0:
                break
    return floored.astype(int)


def stratified_split(y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and test indices, the same as scikit-learn's train_test_split(stratify=y, random_state=seed) gives
    (its StratifiedShuffleSplit, step for step; tests/test_torchkit.py compares them), without importing it."""
    n = len(y)
    n_test = math.ceil(test_fraction * n)
    n_train = n - n_test
    _, y_indices, class_counts = np.unique(y, return_inverse=True, return_counts=True)
    class_indices = np.split(np.argsort(y_indices, kind="stable"), np.cumsum(class_counts)[:-1])
    rng = np.random.RandomState(seed)
    n_i = _approximate_mode(class_counts, n_train, rng)
    t_i = _approximate_mode(class_counts - n_i, n_test, rng)
    train: list[int] = []
    test: list[int] = []
    for i in range(len(class_counts)):
        members = class_indices[i].take(rng.permutation(class_counts[i]), mode="clip")
        train.extend(members[: n_i[i]])
        test.extend(members[n_i[i] : n_i[i] + t_i[i]])
    return rng.permutation(train), rng.permutation(test)


def _synthetic(cfg: DataConfig) -> tuple[np.ndarray, np.ndarray, None]:
    # A fixed random linear teacher with a little label noise: learnable, but not trivially.
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((cfg.synthetic_samples, cfg.synthetic_features)).astype(np.float32)
    teacher = rng.standard_normal((cfg.synthetic_features, cfg.synthetic_classes))
    logits = x @ teacher + 0.5 * rng.standard_normal((cfg.synthetic_samples, cfg.synthetic_classes))
    return x, logits.argmax(axis=1).astype(np.int64), None


@dataclass
class BuiltinArrays:
    """A built-in data set's split, as numpy arrays: what the driver's checks need, without torch."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    image_shape: tuple[int, int, int] | None

    @property
    def num_train(self) -> int:
        return len(self.x_train)

    @property
    def num_features(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def num_classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1


def builtin_arrays(cfg: DataConfig) -> BuiltinArrays:
    """A built-in set (data.name), split by a stratified shuffle that depends only on cfg.split_seed."""
    x, y, image_shape = _digits(cfg) if cfg.name == "digits" else _synthetic(cfg)
    train, test = stratified_split(y, cfg.test_fraction, cfg.split_seed)
    return BuiltinArrays(x[train], y[train], x[test], y[test], image_shape)


def load_splits(cfg: DataConfig) -> Splits:
    """Your data.factory's train and test sets; or a built-in set, all in memory (builtin_arrays)."""
    if cfg.factory:
        from raydist.factories import user_datasets

        train, test = user_datasets(cfg.factory, cfg.args)
        return Splits(train=train, test=test, image_shape=None)
    import torch
    from torch.utils.data import TensorDataset

    a = builtin_arrays(cfg)
    return Splits(
        train=TensorDataset(torch.from_numpy(a.x_train), torch.from_numpy(a.y_train)),
        test=TensorDataset(torch.from_numpy(a.x_test), torch.from_numpy(a.y_test)),
        image_shape=a.image_shape,
        known_features=a.num_features,
        known_classes=a.num_classes,
    )
