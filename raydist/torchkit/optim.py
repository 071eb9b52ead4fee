"""Optimizer and learning-rate schedule built from the config."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from raydist.config import OptimConfig, ScheduleConfig


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.name == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.Adagrad(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def lr_factor(step: int, total_steps: int, cfg: ScheduleConfig) -> float:
    """Multiplier of the peak LR at optimizer step `step` (0-based) of `total_steps`."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.name == "constant":
        return 1.0
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.name == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        shape = 1.0 - progress
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def build_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, cfg: ScheduleConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, cfg))
