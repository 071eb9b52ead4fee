"""What a training checkpoint holds (model, optimizer, schedule, position, RNG of every rank) and how it is written and read.

A checkpoint is a directory that is complete or absent: each file is written under a temporary name, fsynced and
renamed, and `manifest.json` (step, each file's name, size and sha256) is written last. A directory whose manifest
is missing or does not match its files is broken (a write that was killed, a disk that lost data) and resume skips it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from raydist.atomic import write_atomic
from raydist.errors import RaydistError

if TYPE_CHECKING:  # torch is imported where it is used: a driver that only reads manifests needs none
    import torch

STATE_FILE = "train_state.pt"
# One per rank, for a strategy whose replicas differ between sync points: each rank writes its own, in parallel.
REPLICA_FILE = "replica_rank{rank:05d}.pt"
MANIFEST = "manifest.json"
CHECKPOINT_DIR = re.compile(r"^checkpoint_step(\d+)$")
# Ray Train V2 rewrites this file in place (ray-project/ray#41700): a kill mid-write truncates it.
RAY_SNAPSHOT = "checkpoint_manager_snapshot.json"


@dataclass
class Progress:
    """Where training stands: optimizer steps done, current epoch, micro-batches of that epoch already consumed."""

    step: int = 0
    epoch: int = 0
    micro_in_epoch: int = 0


def rng_state() -> dict[str, Any]:
    import torch

    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def save_state(
    directory: str,
    *,
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    progress: Progress,
    rng_per_rank: list[dict[str, Any]],
    extra: dict[str, Any] | None = None,
    fsync: bool = True,
) -> str:
    """Write the state and then its manifest into `directory`; returns the state file's path. `model` and
    `optimizer` are None when the ranks have already written them into `directory` (a sharded strategy's shards,
    or every replica's `save_replica` file): the manifest, written last, covers those files too."""
    import torch

    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, STATE_FILE)
    state = {
        "model": model.state_dict() if model is not None else None,
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict(),
        "progress": asdict(progress),
        "rng_per_rank": rng_per_rank,
        "extra": extra or {},
    }
    write_atomic(path, lambda f: torch.save(state, f), fsync=fsync)
    write_manifest(directory, progress.step, fsync=fsync)
    return path


def save_replica(
    directory: str, rank: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, fsync: bool = True
) -> None:
    """This rank's own model and optimizer, into the checkpoint directory every rank shares; before the manifest,
    which then covers it. No rank gathers another's state, so a checkpoint costs no traffic between workers."""
    import torch

    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    write_atomic(os.path.join(directory, REPLICA_FILE.format(rank=rank)), lambda f: torch.save(state, f), fsync=fsync)


def load_replica(directory: str, rank: int) -> dict[str, Any]:
    """The model and optimizer state `rank` wrote with `save_replica` (the manifest has already been verified)."""
    import torch

    return torch.load(os.path.join(directory, REPLICA_FILE.format(rank=rank)), map_location="cpu", weights_only=True)


def load_state(directory: str) -> dict[str, Any]:
    """The state a checkpoint holds; refuses (RaydistError) one that fails verification."""
    why = verify(directory, required=STATE_FILE)
    if why is not None:
        raise RaydistError(f"checkpoint {directory} is broken: {why}")
    import torch

    # weights_only=False: the file holds RNG states (numpy and python tuples) that we wrote ourselves.
    state = torch.load(os.path.join(directory, STATE_FILE), map_location="cpu", weights_only=False)
    state["progress"] = Progress(**state["progress"])
    return state


# ---- complete or absent: atomic files, the manifest, verification -------------------------------------------


def fsync_dir(directory: str) -> None:
    """Make a rename or a new file inside `directory` durable (the entry lives in the directory, not the file)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _payload_files(directory: str) -> list[str]:
    """The files a manifest covers: every plain file but the manifest and leftovers of unfinished writes."""
    return sorted(
        n
        for n in os.listdir(directory)
        if n != MANIFEST and ".tmp" not in n and os.path.isfile(os.path.join(directory, n))
    )


def write_manifest(directory: str, step: int, *, fsync: bool = True) -> dict[str, Any]:
    """Record the step and every file's size and sha256; written last, so its presence means the rest is there."""
    files = []
    for name in _payload_files(directory):
        path = os.path.join(directory, name)
        files.append({"name": name, "size": os.path.getsize(path), "sha256": sha256_of(path)})
    manifest = {"format": 1, "step": step, "files": files}
    write_atomic(
        os.path.join(directory, MANIFEST), lambda f: f.write(json.dumps(manifest, indent=1).encode()), fsync=fsync
    )
    return manifest


def read_manifest(directory: str) -> dict[str, Any]:
    with open(os.path.join(directory, MANIFEST), "rb") as f:
        manifest = json.loads(f.read())
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list) or "step" not in manifest:
        raise ValueError("not a manifest")
    return manifest


def verify(directory: str, required: str | None = None) -> str | None:
    """Why the checkpoint in `directory` cannot be used, in a few words; None when it is complete and intact.
    `required`: a file the manifest must list (the state file of the strategy that reads it)."""
    if not os.path.isdir(directory):
        return "no such directory"
    if not os.path.exists(os.path.join(directory, MANIFEST)):
        return f"no {MANIFEST}: the save did not finish"
    try:
        manifest = read_manifest(directory)
    except (OSError, ValueError) as e:
        return f"{MANIFEST} unreadable ({type(e).__name__})"
    names = {entry.get("name") for entry in manifest["files"]}
    if required is not None and required not in names:
        return f"{MANIFEST} does not list {required}"
    for entry in manifest["files"]:
        why = _check_file(directory, entry)
        if why is not None:
            return why
    return None


def _check_file(directory: str, entry: dict[str, Any]) -> str | None:
    name = str(entry.get("name"))
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        return f"{name} missing"
    size = os.path.getsize(path)
    if size != entry.get("size"):
        return f"{name} has {size} bytes, the manifest says {entry.get('size')}"
    if sha256_of(path) != entry.get("sha256"):
        return f"{name} does not match its sha256"
    return None


# ---- finding the newest valid checkpoint of a run -------------------------------------------------------------


def checkpoint_dirs(run_dir: str) -> list[tuple[int, str]]:
    """(step, path) of every checkpoint_stepNNNNNNNN directory in the run, newest first."""
    try:
        names = os.listdir(run_dir)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), os.path.join(run_dir, n)) for n in names if (m := CHECKPOINT_DIR.match(n))]
    return sorted((x for x in found if os.path.isdir(x[1])), reverse=True)


def newest_valid(run_dir: str, required: str, skip: tuple[str, ...] = ()) -> tuple[str | None, list[tuple[str, str]]]:
    """The newest checkpoint of the run that verifies, and (directory, why) of each newer one it passed over.
    `skip`: directories already known to be broken (not verified again, not listed)."""
    skipped = []
    for _, path in checkpoint_dirs(run_dir):
        if path in skip:
            continue
        why = verify(path, required=required)
        if why is None:
            return path, skipped
        skipped.append((path, why))
    return None, skipped


def resume_choice(known: str | None, run_dir: str | None, required: str) -> tuple[str | None, list[tuple[str, str]]]:
    """Which checkpoint a resume uses: `known` (the one the runtime names, e.g. Ray Train's) if it verifies, else
    the newest valid one in `run_dir`; and (directory, why) of each broken one passed over."""
    skipped: list[tuple[str, str]] = []
    if known is not None:
        why = verify(known, required=required)
        if why is None:
            return known, []
        skipped.append((os.path.normpath(known), why))
    if not run_dir:
        return None, skipped
    found, passed = newest_valid(run_dir, required, skip=tuple(p for p, _ in skipped))
    return found, skipped + passed


def skipped_line(skipped: list[tuple[str, str]], chosen: str | None) -> str:
    """The one line a user sees when resume passed over broken checkpoints."""
    which = ", ".join(f"{os.path.basename(p)} ({why})" for p, why in skipped)
    plural = "s" if len(skipped) > 1 else ""
    then = f"resuming from {os.path.basename(chosen)}" if chosen else "no valid checkpoint left: starting from step 0"
    return f"[raydist] skipped broken checkpoint{plural} {which}; {then}"


def publish_dir(staging: str, final: str) -> None:
    """Move a finished checkpoint directory into place with renames only, so `final` is never half there. A
    directory already at `final` (the same step written again) is moved aside first, then removed."""
    parent = os.path.dirname(final)
    old = os.path.join(parent, f".old-{os.path.basename(final)}-{os.getpid()}")
    if os.path.exists(final):
        os.rename(final, old)
    os.rename(staging, final)
    fsync_dir(parent)
    shutil.rmtree(old, ignore_errors=True)


def set_aside_broken_snapshot(run_dir: str) -> str | None:
    """Move Ray Train's checkpoint-manager snapshot aside when it is not valid JSON (a kill while Ray rewrote
    it): Ray would refuse to start, while without it the loop finds the newest valid checkpoint itself.
    Returns the one line to print, or None when there is nothing to do."""
    path = os.path.join(run_dir, RAY_SNAPSHOT)
    try:
        with open(path, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    try:
        ok = isinstance(json.loads(text), dict)
    except ValueError:
        ok = False
    if ok:
        return None
    aside = f"{path}.broken-{time.strftime('%Y%m%d-%H%M%S')}"
    os.replace(path, aside)
    return (
        f"[raydist] {RAY_SNAPSHOT} is truncated or corrupt ({len(text)} bytes); moved it to "
        f"{os.path.basename(aside)} and resuming from the newest valid checkpoint"
    )
