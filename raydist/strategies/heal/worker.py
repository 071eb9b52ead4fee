"""Heal in place: DDP across replica groups (one worker each) through torchft's Manager, on Ray Train's torchft
backend (`TorchftConfig`, which starts the lighthouse and replaces only a failed replica group).

Every step starts with a quorum of the replicas alive. Gradients are averaged over the quorum (one all-reduce of a flat
gradient buffer through torchft's Manager, which records a peer's failure instead of raising it); a step a peer
failed during is not committed, and the loop takes it again. A replacement joins a later quorum and
takes the loop's whole state from a live peer (`FaultTolerant.share_state`), not from a checkpoint.

Reports, evaluation and checkpoints go through Ray Train's barrier, which waits for every worker: so sync points are
only the steps every replica took together. A replica alone never enters the barrier, where it would miss the
quorum its replacement waits for.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch.distributed import ReduceOp

from raydist.torchkit.checkpoint import Progress
from raydist.torchkit.commstats import allreduce_bytes
from raydist.torchkit.flat import flatten_
from raydist.train.collectives import Collectives, SumOnlyCollectives
from raydist.train.strategy import DesyncCheck, FaultTolerant, FinalMetrics, Strategy


class QuorumCollectives(SumOnlyCollectives):
    """The loop's collectives over the current quorum (at sync points: every replica)."""

    def __init__(self, manager, world_size: int, rank: int):
        super().__init__(world_size, rank)
        self.manager = manager

    def _sum(self, tensor: torch.Tensor) -> None:
        manager = self.manager
        manager.allreduce(tensor, reduce_op=ReduceOp.SUM).wait()
        if manager.errored():  # torchft swallows the error and leaves the tensor as it was: unusable
            why = str(manager.errored().original_exception).splitlines()[0][:160]
            raise PeerLost(f"a peer failed during the sync point's collective ({why})")


class PeerLost(RuntimeError):
    """A replica failed during one of the loop's collectives at a sync point."""


class HealBook:
    """Heals as a survivor sees them: from the first failed commit or short quorum to a whole one again."""

    def __init__(self, world_size: int, clock: Callable[[], float] = time.monotonic):
        self.world_size, self.clock = world_size, clock
        self.whole_once = False  # a replica that started alone is not healed from a failure
        self.since: float | None = None
        self.failed_at = 0
        self.steps = 0
        self.stall: float | None = None
        self.last_commit: float | None = None
        self.heals: list[tuple[int, float, float]] = []
        """Per heal: steps committed without the lost worker, seconds to whole again, seconds without a step."""

    def step(self, committed: bool, participants: int, step: int) -> str | None:
        """One step's outcome (`step`: the loop's, after it); returns what changed, in words, if anything did."""
        now = self.clock()
        short = not committed or participants < self.world_size
        news = None
        if short and self.whole_once and self.since is None:
            # from the last step that went through: the failed step's own time is lost too
            self.since, self.steps, self.stall = self.last_commit or now, 0, None
            self.failed_at = step  # the same on every survivor: the key of this heal in the run's file
            news = f"a worker failed at step {step}; the others go on while it is replaced"
        if self.since is not None and committed and participants < self.world_size:
            self.steps += 1
        if self.since is not None and committed and self.stall is None:
            self.stall = now - self.since
        if committed and participants == self.world_size:
            if self.since is not None:
                self.heals.append((self.steps, round(now - self.since, 3), round(self.stall or 0.0, 3)))
                self.stall = None
                news = (
                    f"healed at step {step}: the replacement took the state from a peer, {now - self.since:.1f} s "
                    f"and {self.steps} steps after the failure"
                )
                self.since = None
            self.whole_once = True
        if committed:
            self.last_commit = now
        return news


class Heal(Strategy, FaultTolerant, DesyncCheck, FinalMetrics):
    name = "heal"
    peer_lost = (PeerLost,)

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if not self.cfg.run.verbose:
            _quiet_torchft()
        self.model = model
        # One flat gradient buffer, averaged over the quorum after backward: a step is one fault-tolerant all-reduce
        # (torchft's DDP wrapper fails its own assertion when a peer dies mid-step, in torchft 0.2.0).
        _, self.grads = flatten_(model, self.ctx.device)
        self.grad_bytes = self.grads.numel() * self.grads.element_size()
        self.book = HealBook(self.world_size)
        self.end_wait_since: float | None = None
        self.speaker: bool | None = None
        self.untold: str | None = None
        # Heartbeats first: the lighthouse holds a quorum for the replicas that beat, so that after the barrier no
        # replica starts alone (survivors that were whole before a failure are not held: torchft's fast quorum).
        self.manager = self._manager()
        self._start_together()
        return model

    def _manager(self):
        """torchft's Manager of this replica group; its heartbeats start here."""
        from torchft import Manager

        pg, transport = _process_group(self.ctx.device, self.cfg.faults.collective_timeout_s)
        # init_sync=False: at step 0 the replicas already agree (one seed, or one checkpoint each reads itself);
        # torchft's default would make all but one take a peer's state before that peer has read its checkpoint.
        return Manager(
            pg=pg,
            load_state_dict=None,
            state_dict=None,
            min_replica_size=1,
            world_size=1,
            rank=0,
            init_sync=False,
            replica_id=f"raydist_{self.ctx.rank}",
            timeout=timedelta(seconds=self.cfg.heal.quorum_timeout_s),
            quorum_timeout=timedelta(seconds=self.cfg.heal.quorum_timeout_s),
            checkpoint_transport=transport,
            hostname=_reachable_hostname(),
        )

    def _start_together(self) -> None:
        """The group's first start waits for every worker (Ray Train's barrier), so that none trains alone while
        the others import; a replacement, which finds the marker, joins the running ones at once."""
        import ray.train.collective

        marker = Path(self.cfg.run.run_dir) / f".heal-started-{self.ctx.fit_id}"
        if not marker.exists():
            ray.train.collective.barrier()
            if self.ctx.rank == 0:
                marker.touch()

    def share_state(
        self,
        get: Callable[[], dict[str, Any]],
        put: Callable[[dict[str, Any]], None],
        progress: Callable[[], Progress],
        total_steps: int,
    ) -> bool:
        """The first step's quorum (each later one starts in zero_grad): a replica behind the others (a replacement,
        whose torchft step is 0) is healing, and takes their state in that step. When none is ahead (a fresh start,
        or every worker restarted) the loop reads the checkpoint, if any, as the other strategies do."""
        self.manager.register_state_dict_fn("raydist", put, get)
        self.progress, self.last_step = progress, total_steps
        self.manager.start_quorum()
        self.manager.wait_quorum()
        # not among the replicas at the quorum's highest step: torchft heals it from one of them in this step
        self.from_peer = self.manager.participating_rank() is None and not self.manager.errored()
        return self.from_peer

    def collectives(self) -> Collectives:
        return QuorumCollectives(self.manager, self.world_size, self.ctx.rank)

    def commit(self) -> bool:
        committed = self.manager.should_commit()
        participants = self.manager.num_participants()
        if committed:
            self.comm.add(allreduce_bytes(self.grad_bytes, participants))
        committed = committed and not self._hold_last_step(participants)
        healed = len(self.book.heals)
        news = self.book.step(committed, participants, self.progress().step + int(committed))
        self._tell(news, committed and participants < self.world_size)
        if len(self.book.heals) > healed:  # every survivor writes it down: any of them may die next
            steps, seconds, stall = self.book.heals[-1]
            with self._heals_file().open("a") as f:
                f.write(json.dumps({"at": self.book.failed_at, "steps": steps, "s": seconds, "stall": stall}) + "\n")
        return committed

    def _tell(self, news: str | None, short_commit: bool) -> None:
        """One survivor says what happened: the first of the survivors' own quorum (known at their first step
        without the lost worker; until then the failure's line waits)."""
        if short_commit and self.speaker is None:
            self.speaker = self.manager.participating_rank() == 0
            if self.speaker and self.untold:
                print(f"[raydist] heal: {self.untold}", flush=True)
        if news and news.startswith("healed"):
            if self.speaker or (self.speaker is None and self.manager.participating_rank() == 0):
                print(f"[raydist] heal: {news}", flush=True)
            self.speaker, self.untold = None, None
        elif news:
            self.untold = news

    def _heals_file(self) -> Path:
        """This run's heals, on the storage every worker shares: a book in memory dies with its worker, and any
        worker may be the next to die."""
        return Path(self.cfg.run.run_dir) / f".heals-{self.ctx.fit_id}.jsonl"

    def _hold_last_step(self, participants: int) -> bool:
        """The last step waits (up to heal.end_wait_s) for a replacement: finished survivors would leave it
        nobody to heal from, and it would train the whole run again alone."""
        if participants == self.world_size or self.progress().step + 1 < self.last_step:
            return False
        self.end_wait_since = self.end_wait_since or time.monotonic()
        holding = time.monotonic() - self.end_wait_since < self.cfg.heal.end_wait_s
        if holding:
            time.sleep(0.1)  # the cores are the replacement's while it starts
        return holding

    def after_backward(self, step: int) -> None:
        """The mean gradient over the quorum; a failure in it is torchft's to record, and the step is not committed."""
        with self.comm.waiting():
            self.manager.allreduce(self.grads).wait()

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        self.grads.zero_()  # not set_to_none: the gradients stay views of the flat buffer
        self.manager.start_quorum()

    def is_sync_point(self, step: int, final: bool) -> bool:
        return self.manager.num_participants() == self.world_size

    def replicas_agree(self, final: bool) -> bool:
        return True  # every replica in the quorum applied the same averaged gradient to the same weights

    def eval_model(self, final: bool) -> torch.nn.Module:
        return self.model

    def final_metrics(self, coll: Collectives) -> dict[str, Any]:
        """The heals of this run as the survivors wrote them down, and how many workers now alive took a peer's
        state."""
        joined = sum(coll.all_gather_object(int(self.from_peer)))
        path = self._heals_file()
        lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        heals = list({h["at"]: h for h in reversed(lines)}.values())[::-1]  # each heal once, as first written
        return {
            "heals": len(heals),
            "joined_from_peer": joined,
            "steps_during_heals": [h["steps"] for h in heals],
            "heal_s": [h["s"] for h in heals],
            "heal_stall_s": [h["stall"] for h in heals],
        }

    def close(self) -> None:
        self.manager.shutdown(wait=False)

    def describe(self) -> str:
        return f"torchft quorum over {self.world_size} replica groups"


def _quiet_torchft() -> None:
    """torchft logs every quorum and commit, and a peer's failure with its traceback (its Rust part through
    RUST_LOG, read when it is loaded): raydist says in one line what happened instead (run.verbose shows them)."""
    os.environ.setdefault("RUST_LOG", "error")
    for name in ("torchft", "torchft_quorums", "torchft_commits", "torchft_errors"):  # a peer's failure: our line
        logging.getLogger(name).setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", module=r"torchft\.")  # its own use of torch.frombuffer on a read-only buffer


def _process_group(device: torch.device, timeout_s: float):
    """torchft's reconfigurable process group (NCCL on GPUs, gloo else) and the transport a replacement's state
    comes over."""
    from torchft import ProcessGroupGloo, ProcessGroupNCCL
    from torchft.checkpointing.pg_transport import PGTransport

    timeout = timedelta(seconds=timeout_s)
    pg = ProcessGroupNCCL(timeout=timeout) if device.type == "cuda" else ProcessGroupGloo(timeout=timeout)
    return pg, PGTransport(pg, timeout=timeout, device=device)


def _reachable_hostname() -> str:
    """The address peers reach this replica's manager at: this node's Ray address (on a SLURM node, the interface
    raydist chose), not its host name, which another node may not resolve."""
    import ray

    return ray.util.get_node_ip_address()
