"""The parameter-server actor: one slice of the parameters, its optimizer, version counter and staleness log.

Every shard counts the steps it has received from each worker (`done`); the shards of a consistent checkpoint
agree on these counts, and they are the workers' data positions on resume. Shard 0 also keeps the run's books:
the sample budget it hands out to workers and one record per update for metrics.jsonl.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import torch

from raydist.config import Config
from raydist.observability.ray_metrics import Exporter
from raydist.strategies.async_ps.messages import Drained, PullReply
from raydist.torchkit.flat import as_tensor
from raydist.torchkit.optim import build_optimizer, lr_factor


class ParameterShard:
    """Applies each gradient as it arrives (Downpour); a plain actor, so calls run one at a time in arrival order."""

    def __init__(self, index: int, init: np.ndarray, config: dict[str, Any], schedule_steps: int, grant_limit: int):
        """`schedule_steps`: the run's length in updates, which the LR schedule spans; `grant_limit`: the steps
        shard 0 may grant in this session (the run's length, or less when the run stops early)."""
        torch.set_num_threads(1)
        cfg = Config.from_dict(config)
        self.index = index
        self.param = torch.nn.Parameter(torch.tensor(init))  # a private, writable copy
        self.optimizer = build_optimizer([self.param], cfg.optim)
        self.base_lr = cfg.optim.lr
        self.schedule = cfg.schedule
        self.schedule_steps = schedule_steps
        ps = cfg.async_ps
        # The server enforces the bound only for `drop`; `wait` is enforced before the gradient exists (gate.py).
        self.drop_past = ps.max_staleness if ps.on_stale == "drop" else -1
        self.staleness_lr = ps.staleness_lr
        self.version = 0  # updates applied to this slice
        self.staleness = Counter()  # staleness -> updates applied with it
        self.dropped = 0
        self.done = Counter()  # worker rank -> its steps this shard has received (applied or dropped)
        # shard 0 only
        self.grant_limit = grant_limit
        self.granted = 0
        self.records: list[dict[str, Any]] = []
        self.bytes_moved = 0.0  # gradients in, parameters out
        self.export = Exporter(cfg.run.name, "async", "server", index)
        self.export.observe(total_steps=schedule_steps)

    def lr(self) -> float:
        return self.base_lr * lr_factor(self.version, self.schedule_steps, self.schedule)

    def push(self, grad: np.ndarray, base_version: int, worker: int, meta: dict[str, Any] | None = None) -> bool:
        """Apply one gradient computed on parameters of version `base_version`; False if dropped as too stale."""
        staleness = self.version - base_version
        self.bytes_moved += grad.nbytes
        applied = not (0 <= self.drop_past < staleness)
        lr = self.lr() / (max(1, staleness) if self.staleness_lr else 1)
        if applied:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.param.grad = as_tensor(grad)  # zero-copy: the optimizers only read the gradient
            self.optimizer.step()
            self.param.grad = None
            self.version += 1
            self.staleness[staleness] += 1
        else:
            self.dropped += 1
        self.done[worker] += 1  # the worker's step is done either way (its samples are spent)
        if meta is not None:  # shard 0
            record = {"step": self.version, **meta, "lr": lr, "staleness": staleness}
            if not applied:  # no new version: keep it out of the per-step records (`read_steps`)
                record["dropped_at_step"] = record.pop("step")
            self.records.append(record)
            self.export.observe_worker("staleness", worker, staleness)
        self.export.count("ps_updates_per_s", int(applied))
        self.export.communication(self.bytes_moved, 0.0)
        self.export.observe(step=self.version, lr=lr)
        self.export.maybe_export()
        return applied

    def pull(self, want: int = 0) -> PullReply:
        """This slice now; shard 0 also grants up to `want` more steps of the session's budget.

        The array is a view of the live parameters: Ray serializes it when this call returns, before the
        actor runs the next one, so the caller gets a consistent snapshot with a single copy.
        """
        granted = 0
        if want:
            granted = max(0, min(want, self.grant_limit - self.granted))
            self.granted += granted
        self.bytes_moved += self.param.numel() * self.param.element_size()
        return PullReply(self.version, self.param.detach().numpy(), granted, self.lr())

    def stop_granting(self) -> int:
        """Shard 0: grant nothing more, so every worker ends after the steps it already holds; returns the steps
        granted in this session."""
        self.grant_limit = self.granted
        return self.granted

    def drain(self) -> Drained:
        """Shard 0: the update records since the last call, and the steps done in total."""
        records, self.records = self.records, []
        return Drained(records, sum(self.done.values()))

    def stats(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "staleness": dict(self.staleness),
            "dropped": self.dropped,
            "done": dict(self.done),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "param": self.param.detach(),
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "staleness": dict(self.staleness),
            "dropped": self.dropped,
            "done": dict(self.done),
        }

    def load_state_dict(self, state: dict[str, Any], done: dict[int, int]) -> None:
        """Restore a checkpointed slice; `done` are the workers' completed steps the run resumes from."""
        with torch.no_grad():
            self.param.copy_(state["param"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = state["version"]
        self.staleness = Counter(state["staleness"])
        self.dropped = state["dropped"]
        self.done = Counter(done)
        self.granted = sum(self.done.values())  # grants not yet used when the checkpoint was taken go back
