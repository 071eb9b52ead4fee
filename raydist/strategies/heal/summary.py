"""The heal strategy's own summary fields (null in other strategies' summaries)."""

from __future__ import annotations

from dataclasses import dataclass

from raydist.summary_fields import described


@dataclass
class HealBooks:
    heals: int | None = described("heal: times a failed worker was replaced while the others went on", None)
    steps_during_heals: list[int] | None = described(
        "heal: for each heal, the steps the survivors committed while a worker was missing", None
    )
    heal_s: list[float] | None = described(
        "heal: for each heal, seconds from the first failed or short quorum to every worker training again", None
    )
    heal_stall_s: list[float] | None = described(
        "heal: for each heal, seconds the survivors took no step after the failure (the time a kill costs them)", None
    )
    joined_from_peer: int | None = described(
        "heal: workers at the end that started as replacements and took the state from a live peer, reading no "
        "checkpoint",
        None,
    )
