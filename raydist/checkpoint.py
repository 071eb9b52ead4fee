"""What a training checkpoint holds (model, optimizer, schedule, position, RNG of every rank) and how it is written and read."""

from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

STATE_FILE = "train_state.pt"


@dataclass
class Progress:
    """Where training stands: optimizer steps done, current epoch, micro-batches of that epoch already consumed."""

    step: int = 0
    epoch: int = 0
    micro_in_epoch: int = 0


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def save_state(
    directory: str,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    progress: Progress,
    rng_per_rank: list[dict[str, Any]],
    extra: dict[str, Any] | None = None,
) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, STATE_FILE)
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "progress": asdict(progress),
            "rng_per_rank": rng_per_rank,
            "extra": extra or {},
        },
        path + ".tmp",
    )
    os.replace(path + ".tmp", path)  # a reader never sees half a file
    return path


def load_state(directory: str) -> dict[str, Any]:
    # weights_only=False: the file holds RNG states (numpy and python tuples) that we wrote ourselves.
    state = torch.load(os.path.join(directory, STATE_FILE), map_location="cpu", weights_only=False)
    state["progress"] = Progress(**state["progress"])
    return state
