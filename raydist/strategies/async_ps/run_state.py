"""The states of one async PS session and the one table of moves between them.

As Ray Train V2's controller keeps a TrainControllerState: the driver (`AsyncPSRun`) changes state only through
`Lifecycle.to`, so a move the table does not hold is a bug caught at once rather than a flag left half set, and
the policy's decision after each start of the actors maps to exactly one next state (`AFTER`).

    INITIALIZING -> SCHEDULING -> RUNNING -> FINISHING -> FINISHED
                       ^             |           |
                       |             v           v
                       +------- RESTARTING <-----+        (and from any state but the last two: ERRORED)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from raydist.strategies.async_ps.policy import Kind


class RunState(str, enum.Enum):
    INITIALIZING = "initializing"  # data, checks, the checkpoint to resume from, the placement group, the outputs
    SCHEDULING = "scheduling"  # the workers' bundles placed, every actor started (and restored) and located
    RUNNING = "running"  # the workers train; the loop collects, evaluates, checkpoints, polls for a stop
    FINISHING = "finishing"  # the workers ended: last records, final evaluation and checkpoint, the shards' books
    RESTARTING = "restarting"  # an actor died or hung within scaling.max_failures: back to the latest checkpoint
    FINISHED = "finished"  # the session's summary is returned
    ERRORED = "errored"  # the run fails with one line, or was interrupted


_S = RunState
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    _S.INITIALIZING: frozenset({_S.SCHEDULING, _S.ERRORED}),
    # A start, the training and the final checkpoint each end in a policy decision: a restart or the failure.
    _S.SCHEDULING: frozenset({_S.RUNNING, _S.RESTARTING, _S.ERRORED}),
    _S.RUNNING: frozenset({_S.FINISHING, _S.RESTARTING, _S.ERRORED}),
    _S.FINISHING: frozenset({_S.FINISHED, _S.RESTARTING, _S.ERRORED}),
    _S.RESTARTING: frozenset({_S.SCHEDULING, _S.ERRORED}),
    _S.FINISHED: frozenset(),
    _S.ERRORED: frozenset(),
}

AFTER: dict[Kind, RunState] = {Kind.CONTINUE: _S.FINISHED, Kind.RESTART: _S.RESTARTING, Kind.RAISE: _S.ERRORED}
"""The state `policy.decide`'s decision moves the session to."""


@dataclass
class Lifecycle:
    state: RunState = RunState.INITIALIZING

    def to(self, new: RunState) -> RunState:
        if new not in TRANSITIONS[self.state]:
            raise RuntimeError(f"async PS driver: no move from {self.state.value} to {new.value}")
        self.state = new
        return new

    def fail(self) -> None:
        """ERRORED, from wherever an error came. An end state stays: a RAISE decision has moved there already, and
        an interrupt after FINISHED does not unfinish the session (its progress bar closes as completed)."""
        if TRANSITIONS[self.state]:
            self.to(RunState.ERRORED)
