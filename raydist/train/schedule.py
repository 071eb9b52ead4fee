"""What is due at a step: a progress report, an evaluation, a checkpoint, a desync check, a stop poll.

One schedule for both controllers, the shared training loop (`raydist.train.loop.Trainer`) and the async parameter
server's driver. It only says what is due; the caller decides where it can act (the loop acts only at its
strategy's sync points, where every rank is at the same step) and tells the schedule what it did, so that the
next due counts from there. Pure: no clock of its own (the caller passes the time), no Ray, no torch.

    schedule = Schedule.starting(Cadence(report_every_s=5.0, checkpoint=Every(100)), step=0, now=clock(), epochs=0)
    due = schedule.due(step, clock(), epochs=epochs_done, final=step == last_step)
    if due.checkpoint:
        save(...)
        schedule.checkpointed(step)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

STOP_POLL_S = 1.0
"""How often a run asks whether it must stop (the cluster's stop request, a draining node: reads of Ray's GCS)."""


@dataclass(frozen=True)
class Every:
    """A cadence in steps; `steps=0` is never."""

    steps: int
    since_last: bool = False
    """False: due at the first step at or past each multiple of `steps`, so a run whose steps pass a multiple
    without landing on it (local SGD's sync points, the PS driver's polls) acts at the next step it sees and the
    multiples stay where they are. True: due once `steps` have passed since the last time, wherever that was."""

    def due(self, step: int, last: int) -> bool:
        """Whether it is due at `step`, when it was last done at step `last`."""
        if not self.steps:
            return False
        if self.since_last:
            return step - last >= self.steps
        return step // self.steps > last // self.steps


@dataclass(frozen=True)
class Cadence:
    """How often each thing is due, from the run's config."""

    report_every_s: float
    """train.report_every_s: seconds between progress reports."""
    checkpoint: Every = Every(0)
    """checkpoint.every_steps; `Every(0)`: a checkpoint at every evaluation (each epoch's end)."""
    desync: Every = Every(0)
    """faults.desync_every_steps; `Every(0)`: no desync checks."""
    stop_poll_s: float = STOP_POLL_S


@dataclass(frozen=True)
class Due:
    """What the schedule says is due at one step."""

    report: bool
    """report_every_s has passed since the last report."""
    evaluate: bool
    """An epoch has ended since the last evaluation, or this is the session's last step."""
    checkpoint: bool
    """The checkpoint cadence is due (with `Every(0)`: an evaluation is), or this is the session's last step."""
    desync_check: bool
    stop_poll: bool
    """STOP_POLL_S has passed since the last poll; never at the session's last step, which ends it anyway."""
    final: bool
    """This is the session's last step."""

    @property
    def reports(self) -> bool:
        """Whether anything is reported at this step: progress, an evaluation's scores, a checkpoint."""
        return self.report or self.evaluate or self.checkpoint

    def ending(self) -> Due:
        """The same step made the session's last (a stop was decided there): evaluate and checkpoint before the end."""
        return replace(self, evaluate=True, checkpoint=True, stop_poll=False, final=True)


@dataclass
class Schedule:
    """When each thing was last done, and so what is due next. Steps are the caller's (the loop's optimizer
    steps, the PS's steps done); times are any monotonic clock's seconds, the same for every call."""

    cadence: Cadence
    last_report: float
    last_poll: float
    last_checkpoint: int
    """The step of the last checkpoint (where the session started: it resumed from there)."""
    last_desync_check: int
    evaluated_epochs: int
    """Epochs completed at the last evaluation."""

    @classmethod
    def starting(cls, cadence: Cadence, step: int, now: float, epochs: int = 0) -> Schedule:
        """A session that starts at `step` (0, or the checkpoint it resumed from) at time `now`, with `epochs`
        completed: everything counts from there, so a resumed run does not checkpoint again where it resumed."""
        return cls(
            cadence,
            last_report=now,
            last_poll=now,
            last_checkpoint=step,
            last_desync_check=step,
            evaluated_epochs=epochs,
        )

    def desync_due(self, step: int) -> bool:
        """Whether a desync check is due at `step` (the loop asks one step ahead too, to measure for it)."""
        return self.cadence.desync.due(step, self.last_desync_check)

    def due(self, step: int, now: float, *, epochs: int, final: bool = False) -> Due:
        """What is due at `step` and time `now`. `epochs`: epochs of the data completed, as the caller counts them
        (evaluations follow them); `final`: the session ends at this step."""
        c = self.cadence
        epoch_ended = epochs > self.evaluated_epochs
        checkpoint = c.checkpoint.due(step, self.last_checkpoint) if c.checkpoint.steps else epoch_ended
        return Due(
            report=now - self.last_report >= c.report_every_s,
            evaluate=epoch_ended or final,
            checkpoint=checkpoint or final,
            desync_check=self.desync_due(step),
            stop_poll=not final and now - self.last_poll >= c.stop_poll_s,
            final=final,
        )

    def steps_done(self) -> dict[str, int]:
        """The step- and epoch-counted part (times are this process's own clock): what a replacement worker takes
        from a live peer to see the same things due as it does."""
        return {
            "last_checkpoint": self.last_checkpoint,
            "last_desync_check": self.last_desync_check,
            "evaluated_epochs": self.evaluated_epochs,
        }

    def take_steps_done(self, done: dict[str, int]) -> None:
        self.last_checkpoint, self.last_desync_check = done["last_checkpoint"], done["last_desync_check"]
        self.evaluated_epochs = done["evaluated_epochs"]

    # What the caller did: the next due counts from here.

    def reported(self, now: float) -> None:
        self.last_report = now

    def polled(self, now: float) -> None:
        self.last_poll = now

    def evaluated(self, epochs: int) -> None:
        self.evaluated_epochs = epochs

    def checkpointed(self, step: int) -> None:
        self.last_checkpoint = step

    def checked_desync(self, step: int) -> None:
        self.last_desync_check = step
