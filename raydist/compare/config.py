"""compare's config section (`compare.*`): which strategies it runs and where its table and plot go."""

from __future__ import annotations

from dataclasses import dataclass

from raydist import registry
from raydist.typedconfig import check, opt


def strategy_names(value: str, key: str) -> str:
    names = [s.strip() for s in value.split(",") if s.strip()]
    known = registry.names()
    check(bool(names), key, "must name at least one strategy")
    for name in names:
        check(name in known, key, f"unknown strategy {name!r} (choose from {', '.join(known)})")
    check(len(set(names)) == len(names), key, f"names a strategy twice ({value!r})")
    return value


@dataclass
class CompareConfig:
    """jobs/compare.py: run several strategies on one setting and report them side by side."""

    strategies: str = opt(
        ",".join(registry.compared()),
        f"comma-separated strategies to run, in this order; any of: {', '.join(registry.names())}",
        parse=strategy_names,
    )
    target_accuracy: float = opt(
        0.95, "test accuracy whose first reaching is timed (the table's time-to-target)", gt=0, le=1
    )
    tune: bool = opt(
        False,
        "first sweep each strategy with the tune section's space, trials and scheduler (the same for every "
        "strategy; an empty tune.space sweeps optim.lr), then compare each at its best settings",
    )
    output_dir: str = opt("", "where results.json, results.md and plot.png go; '' = <run.storage_path>/<run.name>")
    plot_width: int = opt(1200, "width of plot.png in pixels", ge=200)
    plot_height: int = opt(500, "height of plot.png in pixels", ge=150)

    @property
    def strategy_list(self) -> list[str]:
        return [s.strip() for s in self.strategies.split(",") if s.strip()]
