"""What the launcher does about what happened to its ranks: pure decisions, acted on by raydist.launcher.driver.

`decide(event, restarts, cfg)` is the restart policy (as Ray Train V2's FailurePolicy decides and its controller
acts); `hung_rank` is the hang rule; `culprit` chooses which of several silent ranks to name; `exit_fault` tells a
rank that failed on its way out (after its script returned) from one whose training failed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from raydist.launcher.settings import LaunchConfig

USAGE_EXIT = 2  # a script that exits 2 refused its input (argparse does): a restart cannot help
MAX_DETAIL = 300  # characters of a rank's last line quoted in the one line that names it


class Kind(str, enum.Enum):
    COMPLETED = "completed"  # every rank exited 0
    EXIT_FAULT = "exit_fault"  # every rank's script returned; one or more then died or hung on its way out
    EXITED = "exited"  # a rank exited non-zero, or was ended by a signal
    LOST = "lost"  # a rank's agent (and so the rank) died: its node went away, or it was killed
    HUNG = "hung"  # a rank printed nothing and reported no step for hang_timeout_s
    STOP = "stop"  # the cluster asked its runs to stop (time limit, preemption), or the launcher was interrupted
    GROW = "grow"  # an elastic run below its MAX: more processes fit the cluster again


class Action(str, enum.Enum):
    DONE = "done"  # exit 0
    FINISHED_FAULTY = "finished_faulty"  # exit 1, status exit_fault: the training finished, never rerun it
    RESTART = "restart"  # stop every rank, start the group again (TORCHELASTIC_RESTART_COUNT + 1)
    FAIL = "fail"  # stop every rank, exit 1 (2 for a usage exit) with the event's line
    STOP = "stop"  # stop_signal to every rank, wait grace_s, then exit as a stopped run


@dataclass(frozen=True)
class Event:
    kind: Kind
    rank: int | None = None
    node: str = ""
    pid: int | None = None
    exit_code: int | None = None
    detail: str = ""  # the rank's last output line, the stop's reason, ...

    def describe(self) -> str:
        who = f"rank {self.rank} on {self.node or '?'}" + (f" (pid {self.pid})" if self.pid else "")
        detail = self.detail if len(self.detail) <= MAX_DETAIL else self.detail[: MAX_DETAIL - 3] + "..."
        if self.kind == Kind.EXITED:
            how = (
                f"was killed by signal {-self.exit_code}"
                if self.exit_code is not None and self.exit_code < 0
                else f"exited {self.exit_code}"
            )
            return f"{who} {how}" + (f": {detail}" if detail else "")
        if self.kind == Kind.LOST:
            return f"{who} was lost" + (f": {detail}" if detail else "")
        if self.kind == Kind.HUNG:
            return f"{who} {self.detail}"
        return self.detail or self.kind.value


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    exit_code: int = 0
    counts: bool = field(default=True)  # whether a RESTART uses up one of max_restarts


def decide(event: Event, restarts: int, cfg: LaunchConfig) -> Decision:
    """RESTART, FAIL, STOP or DONE for one event, given the restarts that counted so far (failures)."""
    if event.kind == Kind.COMPLETED:
        return Decision(Action.DONE, "every rank exited 0")
    if event.kind == Kind.EXIT_FAULT:  # a restart would train from the start again, for something at exit
        return Decision(
            Action.FINISHED_FAULTY, f"every rank's script returned, but {event.detail}; not restarted", exit_code=1
        )
    if event.kind == Kind.STOP:
        return Decision(Action.STOP, event.describe())
    if event.kind == Kind.GROW:  # as Ray Train's elastic policy: not a failure, not counted
        return Decision(Action.RESTART, f"{event.describe()}; restarting every rank with more", counts=False)
    if event.kind == Kind.EXITED and event.exit_code == USAGE_EXIT:
        return Decision(
            Action.FAIL,
            f"{event.describe()} (exit 2: the script refused its input; not restarted)",
            exit_code=USAGE_EXIT,
        )
    if cfg.max_restarts == -1 or restarts < cfg.max_restarts:
        limit = "unlimited" if cfg.max_restarts == -1 else f"of at most {cfg.max_restarts}"
        return Decision(Action.RESTART, f"{event.describe()}; restarting every rank ({restarts + 1} {limit})")
    tail = f" (max_restarts={cfg.max_restarts} used up)" if cfg.max_restarts else ""
    return Decision(Action.FAIL, f"{event.describe()}{tail}", exit_code=1)


def exit_fault(
    returned_s_ago: float | None, silent_s: float, exit_code: int | None, exit_timeout_s: float
) -> str | None:
    """How a rank whose script had returned failed on its way out (non-daemon threads, atexit, interpreter
    teardown, destructors): 'signal' (a crash: a destructor's SIGSEGV, an abort), 'hung' (running, and silent for
    exit_timeout_s since it returned: output, an upload's progress say, restarts the clock), or None (no exit
    fault: not returned yet, exited with a code, which is the script's own sys.exit, or within the bound)."""
    if returned_s_ago is None:
        return None
    if exit_code is not None:
        return "signal" if exit_code < 0 else None
    return "hung" if min(returned_s_ago, silent_s) >= exit_timeout_s else None


@dataclass(frozen=True)
class Activity:
    """One rank as the driver last saw it."""

    rank: int
    last_active: float  # monotonic time of its last output line or step report (or its start)
    state: str  # /proc state letter of its process: R, S, D, T (stopped), Z, ...
    in_collective: bool | None = None  # from its stack, once dumped: waiting in torch.distributed or DDP


def hung_rank(ranks: list[Activity], now: float, timeout_s: float) -> Activity | None:
    """The rank silent longest, if it has been silent for timeout_s; None while all are within it (or off)."""
    if not timeout_s or not ranks:
        return None
    silent = min(ranks, key=lambda a: (a.last_active, a.rank))
    return silent if now - silent.last_active >= timeout_s else None


def culprit(ranks: list[Activity]) -> Activity:
    """Which silent rank to blame: a stopped process (SIGSTOP, a debugger) first, then one whose stack is not in a
    collective while others wait in one (they wait for it), then the one silent longest."""
    stopped = [a for a in ranks if a.state in ("T", "t")]
    if stopped:
        return min(stopped, key=lambda a: a.rank)
    outside = [a for a in ranks if a.in_collective is False]
    if outside and any(a.in_collective for a in ranks):
        return min(outside, key=lambda a: (a.last_active, a.rank))
    return min(ranks, key=lambda a: (a.last_active, a.rank))
