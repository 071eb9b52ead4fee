"""FSDP's config section (`fsdp.*`)."""

from __future__ import annotations

from dataclasses import dataclass

from raydist.typedconfig import opt


@dataclass
class FSDPConfig:
    """jobs/fsdp.py: fully sharded data parallel (FSDP2); each worker holds 1/W of the parameters and optimizer state."""

    reshard_after_forward: bool = opt(
        True,
        "free each layer's gathered parameters after its forward and gather them again in backward (least "
        "memory, 1.5x sync's communication); false keeps them until backward (sync's communication, more memory)",
    )
