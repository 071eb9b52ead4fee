"""Stop requests and how the ranks are stopped: SIGTERM/SIGINT to the launcher, the cluster's stop request (the
SLURM time limit) and drained nodes (preemption) become STOP events; a stop sends stop_signal to every rank and
gives them their grace."""

from __future__ import annotations

import signal
import time

from raydist.launcher import policy
from raydist.launcher.output import POLL_S, Console, say
from raydist.launcher.settings import LaunchConfig

STOP_POLL_S = 1.0  # how often the cluster's stop request and node drains are read (GCS reads)


class Interrupts:
    """SIGTERM/SIGINT to the launcher become a STOP event: the ranks get stop_signal and their grace."""

    def __init__(self):
        self.why: str | None = None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._note)

    def _note(self, signum, _frame) -> None:
        if self.why is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop waiting for the grace period
        self.why = f"raydist launch received {signal.Signals(signum).name}"

    def event(self) -> policy.Event | None:
        return policy.Event(policy.Kind.STOP, detail=self.why) if self.why else None


class ClusterStops:
    """The cluster's stop request and its drained nodes, read at most every STOP_POLL_S (first at once)."""

    def __init__(self):
        self.next_check = 0.0

    def event(self, group) -> policy.Event | None:
        if time.monotonic() < self.next_check:
            return None
        self.next_check = time.monotonic() + STOP_POLL_S
        return requested(group)


def requested(group) -> policy.Event | None:
    """A STOP event when the cluster asks its runs to stop, or drains a node one of `group`'s ranks is on."""
    from raydist.cluster.preemption import draining_nodes, stop_requested

    try:
        request = stop_requested()
        draining = draining_nodes()
    except Exception:  # a GCS that does not answer now is the poll's business, not the stop check's
        return None
    if request is not None:
        return policy.Event(policy.Kind.STOP, detail=request.describe())
    ours = {r.slot.place.node_id: r.node for r in group.ranks}
    drained = [ours[n] for n in draining if n in ours]
    if drained:
        return policy.Event(
            policy.Kind.STOP, detail=f"node(s) {', '.join(sorted(set(drained)))} being drained (preemption)"
        )
    return None


def stop_ranks(group, cfg: LaunchConfig, reason: str, console: Console) -> None:
    """stop_signal to every rank, then up to grace_s (less when the cluster ends sooner) for them to exit; what
    still runs after it is killed when the group ends."""
    from raydist.cluster.preemption import stop_requested

    grace = cfg.grace_s
    try:
        request = stop_requested()
    except Exception:
        request = None
    if request is not None and request.deadline_unix is not None:
        grace = max(0.0, min(grace, request.deadline_unix - time.time() - 5))
    say(f"{reason}: sending {cfg.stop_signal} to every rank; they have {grace:.0f} s to exit")
    group.send(cfg.stop_signal)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        polled = group.poll()
        for rank, lines in polled:
            console.lines(rank, lines)
        if all(r.exit_code is not None or r.lost for r in group.ranks):
            return
        time.sleep(POLL_S)
    say(f"ranks still running after {grace:.0f} s: killing them")
