"""What the ranks' latest poll says happened, as one event for the policy: a lost rank, a failed one (the first to
fail), the group's end (completed, or finished with exit faults), or a training hang. Exit faults are noted on
the ranks as they happen (a rank hung on its way out has its stack dumped and is killed); a hang has every rank's
stack dumped and its culprit named (raydist.launcher.policy.culprit)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from raydist.launcher import policy
from raydist.launcher.errorfile import describe as describe_error
from raydist.launcher.output import say
from raydist.launcher.settings import LaunchConfig

COLLECTIVE_FRAMES = (
    "torch/distributed/",
    "torch/nn/parallel/distributed.py",
    "torch/autograd/",
    "_engine_run_backward",
)


class RankEvents:
    """The events of one start (`start`: its number from 1, which names its stacks' directory)."""

    def __init__(self, cfg: LaunchConfig, group, start: int):
        self.cfg, self.group = cfg, group
        self.stacks = Path(cfg.run_dir) / "stacks" / f"start{start}"

    def event(self) -> policy.Event | None:
        ranks = self.group.ranks
        for r in ranks:
            if r.lost:
                return policy.Event(policy.Kind.LOST, r.rank, r.node, r.pid, detail=r.lost)
        self.note_exit_faults()
        failed = [r for r in ranks if r.exit_code not in (None, 0) and not r.exit_fault]
        if failed:
            r = first_failed(failed)  # its peers followed
            return policy.Event(
                policy.Kind.EXITED, r.rank, r.node, r.pid, r.exit_code, describe_error(r.error) or r.last_line
            )
        if all(r.exit_code == 0 or r.exit_fault for r in ranks):
            faults = [r.exit_fault for r in ranks if r.exit_fault]
            if faults:
                return policy.Event(policy.Kind.EXIT_FAULT, detail="; ".join(faults))
            return policy.Event(policy.Kind.COMPLETED)
        return self.hang([r for r in ranks if r.returned_s_ago is None])

    def note_exit_faults(self) -> None:
        """A rank whose script had returned and that then died by a signal, or has been silent without exiting for
        exit_timeout_s (its stack dumped, then killed): an exit fault, reported, never restarted."""
        for r in self.group.ranks:
            how = (
                None
                if r.exit_fault
                else policy.exit_fault(r.returned_s_ago, r.silent_s, r.exit_code, self.cfg.exit_timeout_s)
            )
            who = f"rank {r.rank} on {r.node} (pid {r.pid})"
            if how == "signal":
                r.exit_fault = f"{who} was then killed by signal {-r.exit_code} on its way out"
            elif how == "hung":
                where = self.write_stacks(self.group.dump_stacks([r]), "exit-")
                self.group.kill(r)
                r.exit_fault = (
                    f"{who} then printed nothing and did not exit for {self.cfg.exit_timeout_s:g} s "
                    f"(exit_timeout_s); its stack is in {where / f'exit-rank{r.rank}.txt'}; killed"
                )
            if how:
                say(f"exit fault: {r.exit_fault}")

    def hang(self, training: list) -> policy.Event | None:
        """A training hang among the ranks whose scripts have not returned (a rank on its way out has its own
        bound, exit_timeout_s)."""
        now = time.monotonic()
        running = [r for r in training if r.exit_code is None]
        acts = [policy.Activity(r.rank, now - r.silent_s, r.state) for r in running]
        if policy.hung_rank(acts, now, self.cfg.hang_timeout_s) is None:
            return None
        stacks = self.group.dump_stacks()
        where = self.write_stacks(stacks)
        acts = [
            policy.Activity(a.rank, a.last_active, a.state, in_collective(stacks.get(a.rank, {}).get("text", "")))
            for a in acts
        ]
        bad = policy.culprit(acts)
        r = self.group.ranks[bad.rank]
        state = " (its process was stopped)" if bad.state in ("T", "t") else ""
        return policy.Event(
            policy.Kind.HUNG,
            r.rank,
            r.node,
            r.pid,
            detail=(
                f"printed nothing and reported no step for {now - bad.last_active:.0f} s (hang_timeout_s="
                f"{self.cfg.hang_timeout_s:g}){state}; every rank's stack is in {where}"
            ),
        )

    def write_stacks(self, stacks: dict[int, dict[str, Any]], prefix: str = "") -> Path:
        self.stacks.mkdir(parents=True, exist_ok=True)
        for rank, s in stacks.items():
            (self.stacks / f"{prefix}rank{rank}.txt").write_text(
                f"# {s.get('how')}, {s.get('seconds', 0):.2f} s\n{s['text']}\n"
            )
        return self.stacks


def first_failed(failed: list):
    """The rank that ended first of these (its agent noted when); the lowest rank of a tie."""
    return max(failed, key=lambda r: (r.ended_s_ago, -r.rank))


def in_collective(stack: str) -> bool | None:
    """Whether a dumped stack waits on its peers (in torch.distributed, or in a DDP backward's all-reduce)."""
    if not stack.strip() or stack.startswith("("):
        return None
    return any(frame in stack for frame in COLLECTIVE_FRAMES)
