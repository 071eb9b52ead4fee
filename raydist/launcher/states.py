"""The states of one `raydist launch` run and the transitions between them, in one place (as Ray Train V2's
controller has its TrainControllerState): the loop (raydist.launcher.driver) acts in a state, and only `Machine.to`
moves it on. Pure: no Ray, no processes.

    CONNECTING ─► STARTING ─► RUNNING ─┬─► RESTARTING ─► STARTING ...
        └──────────────────────► ▲     ├─► STOPPING ─► STOPPED
          (the first start began       ├─► FINISHED
           before Ray: starts_before_  ├─► EXIT_FAULT
           ray)                        └─► FAILED

An exception (a start that cannot be placed, a second Ctrl-C) leaves the loop from any state; it is raised to the
caller, not a state of the run's.
"""

from __future__ import annotations

import enum

from raydist.launcher.policy import Action, Decision


class RunState(enum.Enum):
    CONNECTING = "connecting"  # joining Ray, or starting the embedded instance (the first start's ranks may run)
    STARTING = "starting"  # placing the agents and starting every rank
    RUNNING = "running"  # watching the ranks until an event the policy decides about
    RESTARTING = "restarting"  # ending the group after a RESTART decision; a new start follows
    STOPPING = "stopping"  # stop_signal to every rank, then their grace
    FINISHED = "finished"  # every rank exited 0
    STOPPED = "stopped"  # the ranks were stopped as asked (time limit, preemption, an interrupt)
    EXIT_FAULT = "exit_fault"  # the training finished, a rank then failed on its way out: never restarted
    FAILED = "failed"  # a failure past max_restarts, or a rank that exited 2

    @property
    def terminal(self) -> bool:
        return self in STATUS

    @property
    def status(self) -> str:
        """The summary's status of a run that ended in this state."""
        return STATUS[self]


STATUS = {
    RunState.FINISHED: "completed",
    RunState.STOPPED: "stopped",
    RunState.EXIT_FAULT: "exit_fault",
    RunState.FAILED: "failed",
}

TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.CONNECTING: frozenset({RunState.STARTING, RunState.RUNNING}),
    RunState.STARTING: frozenset({RunState.RUNNING}),
    RunState.RUNNING: frozenset(
        {RunState.RESTARTING, RunState.STOPPING, RunState.FINISHED, RunState.EXIT_FAULT, RunState.FAILED}
    ),
    RunState.RESTARTING: frozenset({RunState.STARTING}),
    RunState.STOPPING: frozenset({RunState.STOPPED}),
    **{s: frozenset() for s in STATUS},
}

AFTER = {
    Action.DONE: RunState.FINISHED,
    Action.FINISHED_FAULTY: RunState.EXIT_FAULT,
    Action.RESTART: RunState.RESTARTING,
    Action.STOP: RunState.STOPPING,
    Action.FAIL: RunState.FAILED,
}


def after(decision: Decision) -> RunState:
    """The state a running group's decision leads to."""
    return AFTER[decision.action]


class Machine:
    """The run's current state; a move the table does not allow is a bug in the loop, raised at once."""

    def __init__(self, state: RunState = RunState.CONNECTING):
        self.state = state

    def to(self, new: RunState) -> RunState:
        if new not in TRANSITIONS[self.state]:
            raise RuntimeError(f"raydist launch's loop: no transition from {self.state.name} to {new.name}")
        self.state = new
        return new
