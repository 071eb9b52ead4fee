"""What a data-parallel strategy supplies to the shared training loop: a small core, and capabilities it opts into.

The loop (raydist/train/loop.py) owns everything else: data, progress, resume, the report / evaluation /
checkpoint schedule, metrics, the straggler hook and the step boundary where a run can be stopped.

`Strategy` is the core every strategy has; its defaults are the plainest strategy: one model, no communication.
What only some strategies do is a capability, a small base class a strategy adds to its bases and the loop asks for
with `isinstance`: a new kind of strategy adds a capability of its own instead of hooks every strategy inherits.

- `DesyncCheck`: when its replicas must hold the same parameters, and its local gradient norm (the desync check).
- `PerRankState`: its ranks' models differ between sync points; checkpoints keep each rank's.
- `ShardedState`: each rank holds a shard; every rank writes and reads its part of a checkpoint.
- `FaultTolerant`: peers may fail and be replaced mid-run; its own group, a commit gate, state from a live peer.
- `FinalMetrics`: summary fields of its own, gathered at the run's last sync point.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from raydist.config import Config
from raydist.torchkit.checkpoint import Progress
from raydist.torchkit.commstats import CommStats
from raydist.train.collectives import Collectives
from raydist.train.context import WorkerContext


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: a DTensor's local shard (a sharded strategy's parameters), else the tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def held_param_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameters this rank holds between steps: the full model, or its shard of a sharded one."""
    return sum(local_tensor(p).numel() * p.element_size() for p in model.parameters())


class Strategy:
    name = "base"

    def __init__(self, cfg: Config, ctx: WorkerContext, comm: CommStats):
        self.cfg, self.ctx, self.comm = cfg, ctx, comm
        self.world_size = ctx.world_size

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Prepare the (already seeded, on-device) model; returns the module the forward pass runs through."""
        self.model = model
        return model

    def micro_step(self, last: bool) -> contextlib.AbstractContextManager:
        """Context of one micro-batch's forward and backward; `last` is the step's final micro-batch."""
        return contextlib.nullcontext()

    def after_backward(self, step: int) -> None:
        """Gradients of step `step` (0-based) are complete on this rank; runs before clipping and the optimizer."""

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip the step's gradients to `max_norm` (inf: only measure); returns their global norm as a plain tensor."""
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad(set_to_none=True)

    def after_step(self, step: int) -> None:
        """The optimizer has taken step `step` (1-based) on this rank."""

    def is_sync_point(self, step: int, final: bool) -> bool:
        """May every rank meet here? Collectives (reports, evaluation, checkpoints, stop votes) run only at sync
        points, and every rank must answer the same for the same step. `final`: the run ends at this step."""
        return True

    def synchronize(self, final: bool) -> None:
        """At a sync point, before the loop's own collective: the strategy's exchange (e.g. averaging)."""

    def global_step_loss(self) -> bool:
        """Whether the loss all-reduced at this sync point is the model's loss for this step (sync) rather than
        a mix of diverged local models."""
        return True

    def eval_model(self, final: bool) -> torch.nn.Module:
        """The model evaluation scores; every rank calls it at the same sync point."""
        return self.model

    def state_dict(self) -> dict[str, Any]:
        """The strategy's own state to checkpoint (rank 0's; ranks agree on it at sync points)."""
        return {}

    def load_state_dict(self, state: dict[str, Any], same_world: bool) -> None:
        """Restore `state_dict()`; `same_world` is False when the worker count changed since the checkpoint."""

    def close(self) -> None:
        """The loop is done with this worker (the last report is made)."""

    def describe(self) -> str:
        """Extra words for the start line, e.g. the averaging period."""
        return ""


class DesyncCheck(abc.ABC):
    """A strategy that knows when its replicas must agree. Without it the desync check compares parameter
    checksums only with one worker, and takes the loop's gradient norm as this rank's own."""

    @abc.abstractmethod
    def replicas_agree(self, final: bool) -> bool:
        """Right after this sync point's exchange, must every rank hold the same parameters? The desync check
        compares parameter checksums only where they must."""

    def measure_local_grad_norm(self, on: bool) -> None:  # noqa: B027 (optional: most strategies need not act)
        """Whether the next step must keep this rank's gradient norm from before any exchange (a desync check
        is due); only strategies that exchange gradients inside backward need to act on it."""

    def local_grad_norm(self) -> torch.Tensor | None:
        """This rank's gradient norm before any exchange, if the strategy exchanged gradients this step; None
        when the loop's own norm (taken after `after_backward`) is still this rank's alone."""
        return None


class PerRankState:
    """Ranks' models and optimizers differ between sync points: a checkpoint keeps each rank's (`save_replica`), and
    a resume with the same world size gives each rank its own back."""


class ShardedState(abc.ABC):
    """Each rank holds only a shard of the model and optimizer: every rank writes and reads its part of the
    checkpoint itself, beside the loop's state file."""

    sharded_state: ClassVar[bool] = True
    """For the driver's check of a run's checkpoints, which reads the class without importing raydist.train."""

    @abc.abstractmethod
    def save_sharded(self, directory: str, optimizer: torch.optim.Optimizer) -> None:
        """Every rank writes its part of the model and optimizer into `directory` (the same path on every rank, on
        storage they share); returns once every rank's part is written."""

    @abc.abstractmethod
    def load_sharded(self, directory: str, optimizer: torch.optim.Optimizer) -> None:
        """Every rank reads its part back from a checkpoint's `directory`."""


class FaultTolerant(abc.ABC):
    """Peers may fail and be replaced while the others train on: the loop's collectives run over the strategy's
    own group, a step is applied only when the strategy commits it, and a replacement takes its state from a live
    peer instead of a checkpoint."""

    peer_lost: ClassVar[tuple[type[Exception], ...]] = ()
    """What the loop's collectives raise when a peer fails during a sync point and the others go on without it:
    the loop drops that sync point's report and trains on."""

    @abc.abstractmethod
    def collectives(self) -> Collectives:
        """The group of the loop's own collectives (votes, gathers, evaluation), whose members may change."""

    @abc.abstractmethod
    def commit(self) -> bool:
        """Whether this step's gradients may be applied, alike on every rank that took it: no when a peer failed
        during the step. Runs after clipping, before the optimizer."""

    @abc.abstractmethod
    def share_state(
        self,
        get: Callable[[], dict[str, Any]],
        put: Callable[[dict[str, Any]], None],
        progress: Callable[[], Progress],
        total_steps: int,
    ) -> bool:
        """The loop's whole state (model, optimizer, scheduler, progress) to read and to replace, its live progress
        and its step count. Called before the loop reads a checkpoint; True when `put` was given a peer's state
        (the loop then reads none)."""


class FinalMetrics(abc.ABC):
    """Summary fields of the strategy's own (its registry entry's `summary_fields`)."""

    @abc.abstractmethod
    def final_metrics(self, coll: Collectives) -> dict[str, Any]:
        """The fields, at the run's last sync point; every rank calls it (`coll` gathers over the loop's group)."""
