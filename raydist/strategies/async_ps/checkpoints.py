"""The async PS's checkpoints on disk: every server shard's state and the workers' data positions, one directory
per step, complete or absent; the newest that verifies is where a session or a restart begins (`Resume`)."""

from __future__ import annotations

import glob
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

import torch

from raydist.errors import RaydistError, UsageError
from raydist.torchkit.checkpoint import (
    checkpoint_dirs,
    newest_valid,
    publish_dir,
    skipped_line,
    verify,
    write_atomic,
    write_manifest,
)

STATE_FILE = "ps_state.pt"


def latest_checkpoint(run_dir: str) -> str | None:
    """The newest checkpoint of the run that verifies; one line names each newer, broken one it passed over."""
    found, skipped = newest_valid(run_dir, STATE_FILE)
    if skipped:
        print(skipped_line(skipped, found), flush=True)
    return found


def load_params(checkpoint_dir: str) -> torch.Tensor:
    """The flat parameter vector a checkpoint holds (the shards' slices, joined)."""
    why = verify(checkpoint_dir, required=STATE_FILE)
    if why is not None:
        raise RaydistError(f"checkpoint {checkpoint_dir} is broken: {why}")
    state = torch.load(os.path.join(checkpoint_dir, STATE_FILE), map_location="cpu", weights_only=False)
    return torch.cat([s["param"] for s in state["shards"]])


def save(run_dir: str, steps: int, state: dict[str, Any], keep: int) -> str:
    """Write the state and its manifest into a hidden staging directory, then rename it into place: a
    checkpoint_step directory is complete or absent."""
    name = f"checkpoint_step{steps:08d}"
    staging = os.path.join(run_dir, f".tmp-{name}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    write_atomic(os.path.join(staging, STATE_FILE), lambda f: torch.save(state, f))
    write_manifest(staging, steps)
    final = os.path.join(run_dir, name)
    publish_dir(staging, final)
    _prune(run_dir, steps, keep)
    return final


def _prune(run_dir: str, newest: int, keep: int) -> None:
    """Keep the checkpoint just written and the keep-1 newest valid ones before it. Anything after it is from a
    session that ended in a broken save (resume chose an older one), and staging leftovers are from killed saves."""
    kept = 1
    for step, path in checkpoint_dirs(run_dir):
        if step == newest:
            continue
        if step < newest and kept < keep and verify(path, required=STATE_FILE) is None:
            kept += 1
            continue
        shutil.rmtree(path, ignore_errors=True)
    for leftover in glob.glob(os.path.join(run_dir, ".tmp-checkpoint_step*")) + glob.glob(
        os.path.join(run_dir, ".old-checkpoint_step*")
    ):
        shutil.rmtree(leftover, ignore_errors=True)


@dataclass(frozen=True)
class Resume:
    """Where a start of the actors begins: a checkpoint's server shards and data positions, or (no shards) the
    initial parameters at step 0."""

    shards: list[dict[str, Any]] | None = None
    """Each server shard's state_dict, in shard order."""
    done: dict[int, int] = field(default_factory=dict)
    """worker -> steps of its shard of the data already done: where it starts."""
    steps: int = 0

    @classmethod
    def read(cls, checkpoint_dir: str | None, num_servers: int, num_workers: int) -> Resume:
        if not checkpoint_dir:
            return cls()
        state = torch.load(os.path.join(checkpoint_dir, STATE_FILE), map_location="cpu", weights_only=False)
        if len(state["shards"]) != num_servers:
            raise UsageError(
                f"{checkpoint_dir} holds {len(state['shards'])} server shards but "
                f"async_ps.num_servers={num_servers}: keep the shard count or use a new run.name"
            )
        done = {int(k): v for k, v in state["shards"][0]["done"].items()}
        if state["workers"] != num_workers:  # other shards of the data now: each worker starts at the average position
            done = {k: sum(done.values()) // num_workers for k in range(num_workers)}
        return cls(state["shards"], done, state["steps"])
