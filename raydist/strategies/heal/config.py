"""The heal strategy's config section (`heal.*`)."""

from __future__ import annotations

from dataclasses import dataclass

from raydist.typedconfig import opt


@dataclass
class HealConfig:
    """jobs/heal.py: DDP across replica groups through torchft; a failed worker is replaced while the others go on."""

    heartbeat_timeout_s: float = opt(
        0.5,
        "how long after a replica's last heartbeat (torchft's, every 0.1 s) the lighthouse counts it gone: what "
        "a kill stalls the survivors; shorter risks leaving a slow live replica out of a step",
        gt=0,
    )
    quorum_timeout_s: float = opt(
        60.0,
        "how long a step's quorum (torchft's lighthouse) may take before the step fails; a replacement's first "
        "quorum, which also brings it the state from a peer, must fit in it",
        gt=0,
    )
    end_wait_s: float = opt(
        120.0,
        "at the last step, how long the survivors wait for a replacement to join before they finish without "
        "it (a run's last step is taken by every worker)",
        ge=0,
    )
