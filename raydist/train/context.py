"""Where a worker runs: under Ray Train, as a process of `raydist launch` (scaling.engine), or plain torchrun (the
benchmark baseline), behind one interface."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any, Protocol

import torch
import torch.distributed as dist


class WorkerContext(Protocol):
    rank: int
    world_size: int
    device: torch.device
    fit_id: str
    """The same on every worker of one run of the runtime (Ray Train's fit), across restarts; '' where there is none."""

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, step: int, on_storage: bool = False) -> None:
        """Hand metrics (and a directory to persist as a checkpoint) to the runtime; every rank calls it together.
        `on_storage`: the directory is already on the run's storage (every rank wrote its part there): publish it
        in place instead of copying it."""

    def latest_checkpoint(self) -> contextlib.AbstractContextManager[str | None]:
        """The newest persisted checkpoint of this run as a local directory, or None on a fresh start."""

    def preemption(self) -> str | None:
        """Why the runtime wants this run to stop now (a node is being preempted), or None; every rank calls it
        together and gets the same answer."""

    def stop_request(self) -> str | None:
        """Why the cluster asks its runs to stop (raydist.cluster.preemption), or None; rank 0 polls it."""


class RayTrainContext:
    """Ray Train V2: metrics and checkpoints go through ray.train.report; restore through get_checkpoint, or the
    newest valid checkpoint directory of `run_dir` when Ray's is missing or broken."""

    def __init__(self, async_upload: bool = False, run_dir: str | None = None, fit_id: str = ""):
        import ray.train
        import ray.train.torch

        ctx = ray.train.get_context()
        self.rank = ctx.get_world_rank()
        self.world_size = ctx.get_world_size()
        self.device = ray.train.torch.get_device()
        self._async = async_upload
        self._run_dir = run_dir
        self.fit_id = fit_id
        """The same on every worker of one `fit()`, across its restarts and replacements."""

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, step: int, on_storage: bool = False) -> None:
        import ray.train
        from ray.train import Checkpoint, CheckpointUploadMode

        if checkpoint_dir is None:
            ray.train.report(metrics)
            return
        name = f"checkpoint_step{step:08d}"
        if on_storage and self._run_dir:
            # Every rank's files are complete in the staging directory: a rename publishes them, and Ray records
            # the checkpoint where it is rather than copying every rank's part once more over the storage network.
            from raydist.torchkit.checkpoint import publish_dir

            final = os.path.join(self._run_dir, name)
            publish_dir(checkpoint_dir, final)
            ray.train.report(
                metrics,
                checkpoint=Checkpoint.from_directory(final),
                checkpoint_dir_name=name,
                checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD,
            )
            return
        ray.train.report(
            metrics,
            checkpoint=Checkpoint.from_directory(checkpoint_dir),
            checkpoint_dir_name=name,
            checkpoint_upload_mode=CheckpointUploadMode.ASYNC if self._async else CheckpointUploadMode.SYNC,
        )
        if not self._async:  # async mode deletes the local copy itself once uploaded
            shutil.rmtree(checkpoint_dir, ignore_errors=True)

    def preemption(self) -> str | None:
        import ray.train

        info = ray.train.get_preemption_info()  # a barrier: every rank calls it at the same sync point
        if info is None:
            return None
        from raydist.cluster.watch import preempted

        return preempted(info.preempted_node_to_ranks)

    def stop_request(self) -> str | None:
        from raydist.cluster.preemption import stop_requested

        request = stop_requested()
        return request.describe() if request else None

    @contextlib.contextmanager
    def latest_checkpoint(self) -> Iterator[str | None]:
        import ray.train

        from raydist.torchkit.checkpoint import STATE_FILE, resume_choice, skipped_line

        # Ray's own choice can be a checkpoint whose save was killed; with none (a snapshot set aside by
        # raytrain.fit_on_ray_train, a kill before Ray's first snapshot) complete ones may still be on disk.
        checkpoint = ray.train.get_checkpoint()
        with checkpoint.as_directory() if checkpoint is not None else contextlib.nullcontext(None) as known:
            found, skipped = resume_choice(known, self._run_dir, STATE_FILE)
            if skipped and self.rank == 0:
                print(skipped_line(skipped, found), flush=True)
            yield found


class TorchrunContext:
    """Plain torch.distributed under torchrun: the same loop without Ray, for side-by-side benchmarks."""

    def __init__(self, run_dir: str):
        dist.init_process_group("gloo")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.device = torch.device("cpu")
        self.run_dir = run_dir
        self.fit_id = ""
        self.last_metrics: dict[str, Any] = {}
        self.last_checkpoint: str | None = None

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, step: int, on_storage: bool = False) -> None:
        self.last_metrics = metrics
        if checkpoint_dir is not None:
            target = os.path.join(self.run_dir, f"checkpoint_step{step:08d}")
            shutil.rmtree(target, ignore_errors=True)
            shutil.move(checkpoint_dir, target)
            self.last_checkpoint = target
        dist.barrier()

    @contextlib.contextmanager
    def latest_checkpoint(self) -> Iterator[str | None]:
        yield None

    def preemption(self) -> str | None:
        return None

    def stop_request(self) -> str | None:
        return None


class LaunchedContext:
    """A rank started by `raydist launch`'s agents (scaling.engine=launch): torch.distributed from the torchrun-style
    environment the launcher gives every rank; checkpoints published in the run directory by rank 0, the newest
    `checkpoint.keep` kept; the launcher's stop signal (the SLURM time limit, a drained node, an interrupt) becomes
    this rank's stop request, which rank 0's poll turns into a checkpoint and a stop for every rank."""

    def __init__(self, cfg: Any, fit_id: str, stop_signal: str = "SIGTERM"):
        import datetime
        import signal

        self.cfg, self.run_dir, self.fit_id = cfg, cfg.run.run_dir, fit_id
        self._stop_why: str | None = None
        signal.signal(signal.Signals[stop_signal], self._note_stop)
        if cfg.scaling.use_gpu:
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        dist.init_process_group(
            cfg.scaling.resolved_backend, timeout=datetime.timedelta(seconds=cfg.faults.collective_timeout_s)
        )
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def _note_stop(self, signum: int, _frame: Any) -> None:
        import signal

        self._stop_why = f"raydist launch sent {signal.Signals(signum).name} (a time limit, a drained node, a stop)"

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, step: int, on_storage: bool = False) -> None:
        from raydist import hook

        hook.report(step=step, loss=metrics.get("loss"))  # raydist top, and progress for the launcher's hang check
        if checkpoint_dir is not None:
            self._publish(metrics, checkpoint_dir, step, on_storage)
        dist.barrier()  # as Ray Train's report: no rank runs ahead of a checkpoint being published

    def _publish(self, metrics: dict[str, Any], checkpoint_dir: str, step: int, on_storage: bool) -> None:
        import json

        from raydist.atomic import write_json_atomic
        from raydist.torchkit.checkpoint import checkpoint_dirs, publish_dir

        name = f"checkpoint_step{step:08d}"
        staging = checkpoint_dir
        if not on_storage:  # a temp directory, maybe on another filesystem: onto the run's storage first
            staging = os.path.join(self.run_dir, f".staging-{name}")
            shutil.rmtree(staging, ignore_errors=True)
            shutil.move(checkpoint_dir, staging)
        # The report's metrics travel with the checkpoint (as Ray Train keeps them): a run resumed at its very end
        # takes no step, and its summary comes from here.
        write_json_atomic(os.path.join(staging, REPORT_FILE), json.loads(json.dumps(metrics, default=str)))
        publish_dir(staging, os.path.join(self.run_dir, name))
        for _, old in checkpoint_dirs(self.run_dir)[self.cfg.checkpoint.keep :]:
            shutil.rmtree(old, ignore_errors=True)

    @contextlib.contextmanager
    def latest_checkpoint(self) -> Iterator[str | None]:
        from raydist.torchkit.checkpoint import STATE_FILE, resume_choice, skipped_line

        found, skipped = resume_choice(None, self.run_dir, STATE_FILE)
        if skipped and self.rank == 0:
            print(skipped_line(skipped, found), flush=True)
        yield found

    def preemption(self) -> str | None:
        return None  # the launcher watches for drains and sends the stop signal: stop_request has it

    def stop_request(self) -> str | None:
        return self._stop_why


REPORT_FILE = "report.json"
"""The metrics rank 0 reported with a checkpoint, in its directory (scaling.engine=launch)."""


def new_checkpoint_dir() -> str:
    return tempfile.mkdtemp(prefix="raydist-ckpt-")
