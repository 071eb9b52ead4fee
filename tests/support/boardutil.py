"""Read a run's TensorBoard event files with TensorBoard's own reader (what `tensorboard --logdir` loads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raydist.observability.tensorboard_log import CONFIG_TAG, tensorboard_dir


def read_board(run_dir: str | Path) -> Any:
    """The EventAccumulator of the run's tensorboard/ directory, every point kept (its default samples some tags)."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(tensorboard_dir(str(run_dir)), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    return acc


def scalar_steps(acc: Any, tag: str) -> list[int]:
    return [e.step for e in acc.Scalars(tag)]


def config_texts(acc: Any) -> dict[int, str]:
    """step -> the config text written there (one per session, at the step it starts from)."""
    return {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors(f"{CONFIG_TAG}/text_summary")}
