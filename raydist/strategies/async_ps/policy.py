"""What the async PS driver does when an attempt ends: a pure decision, acted on by `AsyncPSRun.run`.

As Ray Train V2's FailurePolicy decides and its controller acts: `decide(event, restarts, max_failures)` says
RESTART (replace every actor, go on from the latest checkpoint), RAISE (the run fails with the reason as its one
line) or CONTINUE (nothing to recover from: the session goes on to its summary).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Outcome(str, enum.Enum):
    """How one start of the actors ended."""

    FINISHED = "finished"  # the session's budget is done (or it stopped): the driver has its summary
    DIED = "died"  # an actor died: its process or its node
    HUNG = "hung"  # an actor stopped answering for faults.hang_timeout_s (SIGSTOP, a wedged node)
    INIT_FAILED = "init_failed"  # an actor's constructor raised
    ERROR = "error"  # any other error of the run's tasks (a worker's own exception)


class Kind(str, enum.Enum):
    RESTART = "restart"
    RAISE = "raise"
    CONTINUE = "continue"


@dataclass(frozen=True)
class Event:
    outcome: Outcome
    step: int
    """Steps done when the attempt ended."""
    detail: str = ""
    """DIED and HUNG: the actor's death in one line ('worker 0 died (...) on node vm'); INIT_FAILED and ERROR:
    the error's line."""

    def describe(self) -> str:
        if self.outcome in (Outcome.DIED, Outcome.HUNG):
            return f"{self.detail} at step {self.step}"
        return self.detail or f"{self.outcome.value} at step {self.step}"


@dataclass(frozen=True)
class Decision:
    kind: Kind
    restarts: int
    """Failures restarted from so far, this one included."""
    reason: str
    """One line: RAISE's is the run's error; RESTART's the count against the limit ('failure 1 of 3')."""


def decide(event: Event, restarts: int, max_failures: int) -> Decision:
    """RESTART, RAISE or CONTINUE after `event`, given the `restarts` so far and scaling.max_failures (-1:
    unlimited). A dead or hung actor is restarted from while the limit allows; a constructor that raised would
    raise again, and any other error is the run's own: neither is restarted."""
    if event.outcome is Outcome.FINISHED:
        return Decision(Kind.CONTINUE, restarts, f"the session ended at step {event.step}")
    if event.outcome in (Outcome.INIT_FAILED, Outcome.ERROR):
        return Decision(Kind.RAISE, restarts, f"training failed: {event.describe()}")
    failure = restarts + 1
    if 0 <= max_failures < failure:
        return Decision(
            Kind.RAISE,
            restarts,
            f"training failed: {event.describe()}: failure {failure}, more than "
            f"scaling.max_failures={max_failures} allows",
        )
    return Decision(Kind.RESTART, failure, f"failure {failure} of {max_failures if max_failures >= 0 else 'unlimited'}")
