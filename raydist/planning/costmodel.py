"""A cost model of one training step for each strategy, fitted on measured runs: what `raydist plan` predicts with.

Time per step = a base time (compute, optimizer, the strategy's fixed per-step costs) + the bytes the strategy moves
over the busiest link / (efficiency x the link's rate) + a latency per message hop (assumed: the emulated links have
none to fit it on). docs/costmodel.md says what is fitted on which runs, and how well it predicts the others.

Each strategy's terms (its bytes, hops and base, the setting options and fitted parameters of its own, and what is
fitted on which of its runs) are a `CostTerms` in its folder (raydist/strategies/<folder>/cost.py), named by its
registry entry; its docstring says what its step moves. This module holds what they share: the setting, the fit,
the generic step time and the fitting and validation loop. Everything here is pure: measured points in, fitted
parameters and predictions out (tests/test_costmodel.py).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from raydist import registry

BYTES_PER_PARAM = 4  # fp32 gradients and parameters on the wire


@dataclass(frozen=True)
class NoOptions:
    """The options of a strategy whose cost depends on nothing beyond the shared setting."""


@dataclass(frozen=True)
class NoFitted:
    """The fitted parameters of a strategy that has none beyond its base."""


@dataclass(frozen=True)
class Setting:
    """What a step's cost depends on, besides the fitted parameters."""

    strategy: str
    workers: int
    params: int
    link_mbit: float
    nodes: int = 0
    """Nodes of the cluster, one worker each on the first `workers`; 0 = as many as workers. async: the rest can
    hold server shards alone."""
    backend: str = "gloo"
    """The collective library: what a collective moves can depend on it (the strategy's cost.py says where)."""
    options: Any = None
    """The strategy's own options: an instance of its `CostTerms.options`, a frozen dataclass in its cost.py (so
    that a Setting stays hashable: `usable` groups runs by it); None = its defaults."""

    def __post_init__(self) -> None:
        if self.options is None:
            object.__setattr__(self, "options", terms_or_plain(self.strategy).options())

    @property
    def grad_bytes(self) -> float:
        return self.params * BYTES_PER_PARAM

    def with_options(self, **changes: Any) -> Setting:
        """The same setting with some of the strategy's own options changed."""
        return replace(self, options=replace(self.options, **changes))


@dataclass
class Fit:
    """The fitted parameters: one link efficiency, one base time per strategy (seconds per step per worker), the
    base's model size (a prediction for another model size scales it linearly: compute grows with parameters), and
    what each strategy fits of its own."""

    efficiency: float
    base_s: dict[str, float]
    base_params: int
    latency_s: float = 50e-6
    """Per message hop (alpha). Assumed, not fitted: a switch hop plus the TCP stack on small clusters."""
    own_fits: dict[str, Any] = field(default_factory=dict)
    """Per strategy, its own fitted parameters: an instance of its `CostTerms.fitted` (a frozen dataclass in its
    cost.py); a strategy without an entry has that dataclass's defaults."""
    fitted_on: list[str] = field(default_factory=list)

    def fitted(self, strategy: str) -> Any:
        """The strategy's own fitted parameters (its `CostTerms.fitted`), its defaults where none were fitted."""
        own = self.own_fits.get(strategy)
        return terms(strategy).fitted() if own is None else own

    def set_fitted(self, strategy: str, **values: float) -> None:
        self.own_fits[strategy] = replace(self.fitted(strategy), **values)

    def to_dict(self) -> dict[str, Any]:
        """Every modelled strategy's own parameters flat beside the shared ones (`raydist plan --json`'s "fit"):
        one level to read, so their names differ across strategies (tests/test_costmodel.py checks)."""
        shared = {k: v for k, v in asdict(self).items() if k not in ("own_fits", "fitted_on")}
        own = {k: v for name in modelled() for k, v in asdict(self.fitted(name)).items()}
        return {**shared, **own, "fitted_on": list(self.fitted_on)}


def ring_allreduce_bytes(nbytes: float, n: int) -> float:
    """Bytes each worker sends (and receives) in a ring all-reduce of `nbytes`: reduce-scatter then all-gather."""
    return 2 * (n - 1) / n * nbytes if n > 1 else 0.0


def rate_bytes_per_s(link_mbit: float, efficiency: float) -> float:
    return link_mbit * 1e6 / 8 * efficiency


class CostTerms:
    """What the cost model asks a strategy; the defaults describe a synchronous step: base + the bytes it moves over
    its worker's link / (efficiency x rate) + a latency per hop + its share of a checkpoint's extra cost."""

    efficiency_reference = False
    """True for the one strategy whose runs at two link rates give the link efficiency the others use."""
    fit_phase = 0
    """0: its base is fitted on its own runs; 1: after every phase-0 strategy's (it builds on theirs)."""
    options: type = NoOptions
    """The frozen dataclass of what its cost depends on besides the shared setting (`Setting.options`)."""
    fitted: type = NoFitted
    """The frozen dataclass of what it fits besides its base (`Fit.own_fits`)."""

    def options_of(self, point: dict[str, Any]) -> Any:
        """Its options for a measured run: each from the run's key of the same name, the default where the run has
        none (absent or None: another strategy's key, or a run written before the option existed)."""
        given = {f.name: point[f.name] for f in fields(self.options) if point.get(f.name) is not None}
        return self.options(**given)

    def network_bytes(self, s: Setting) -> float:
        """Bytes per step per worker on the worker's own link, each way."""
        raise NotImplementedError

    def hops(self, s: Setting) -> float:
        """Message hops per step that each pay the latency."""
        raise NotImplementedError

    def base(self, fit: Fit, s: Setting) -> float:
        return fit.base_s[s.strategy] * s.params / fit.base_params

    def extra_s(self, fit: Fit, s: Setting) -> float:
        """Seconds per step of its own beyond base, bytes and hops (say, checkpoints the fitted base does not hold)."""
        return 0.0

    def step_s(self, fit: Fit, s: Setting) -> float:
        """Seconds per step per worker: the time between one worker's steps."""
        return (
            base_for(fit, s)
            + self.network_bytes(s) / rate_bytes_per_s(s.link_mbit, fit.efficiency)
            + self.hops(s) * fit.latency_s
            + self.extra_s(fit, s)
        )

    def steps_per_s(self, fit: Fit, s: Setting) -> float:
        """Steps per second as its summaries count them (a synchronous step: all workers together)."""
        return 1.0 / self.step_s(fit, s)

    def samples_per_step(self, s: Setting, batch_size: int) -> int:
        return batch_size * s.workers

    def fitting_runs(self, runs: list[dict[str, Any]], low: float, top: float) -> list[dict[str, Any]]:
        """Which of its measured runs (all of one model size) the fit reads: by default its first at the top rate."""
        return [p for p in runs if p["link_mbit"] == top][:1]

    def fit_into(self, result: Fit, mine: list[dict[str, Any]], top: float) -> None:
        """Fill in its base (and any parameter of its own) from its chosen runs, the network term taken out."""
        for p in mine:
            st = setting_of(p)
            if p["link_mbit"] == top:
                probe = Fit(result.efficiency, {st.strategy: 0.0}, st.params, result.latency_s)
                result.base_s[st.strategy] = max(1 / p["steps_per_s"] - step_s(probe, st), 1e-6)

    def label(self, p: dict[str, Any]) -> str:
        """What a measured run's row adds to its name (its shards, its averaging)."""
        return ""

    def plan(self, fit: Fit, s: Setting) -> tuple[Setting, dict[str, Any]]:
        """The setting `raydist plan` predicts for (it may pick, say, a shard count) and what its row adds."""
        return s, {}


@functools.cache
def terms(strategy: str) -> CostTerms:
    """The strategy's cost terms, from its registry entry."""
    spec = registry.STRATEGIES.get(strategy)
    if spec is None or not spec.cost:
        raise ValueError(f"the cost model has no terms for {strategy!r}")
    return spec.load("cost")()


def terms_or_plain(strategy: str) -> CostTerms:
    """Its terms, or plain `CostTerms` (no options, nothing fitted) for a strategy the model has none for: a measured
    run of one still makes a Setting (`usable` reads every run)."""
    spec = registry.STRATEGIES.get(strategy)
    return terms(strategy) if spec is not None and spec.cost else CostTerms()


def modelled() -> list[str]:
    return [spec.name for spec in registry.modelled()]


def reference() -> str:
    """The strategy whose runs give the link efficiency."""
    return next(name for name in modelled() if terms(name).efficiency_reference)


def network_bytes(s: Setting) -> float:
    return terms(s.strategy).network_bytes(s)


def hops(s: Setting) -> float:
    return terms(s.strategy).hops(s)


def base_for(fit: Fit, s: Setting) -> float:
    if s.strategy not in fit.base_s:
        raise KeyError(f"no fitted base time for {s.strategy}")
    return terms(s.strategy).base(fit, s)


def step_s(fit: Fit, s: Setting) -> float:
    """Predicted seconds per step per worker: the time between one worker's steps."""
    return terms(s.strategy).step_s(fit, s)


def steps_per_s(fit: Fit, s: Setting) -> float:
    """Predicted steps per second as the summaries count them."""
    return terms(s.strategy).steps_per_s(fit, s)


def samples_per_s(fit: Fit, s: Setting, batch_size: int) -> float:
    return steps_per_s(fit, s) * terms(s.strategy).samples_per_step(s, batch_size)


# ---- fitting and validation on measured points ----------------------------------------------------------------


def setting_of(point: dict[str, Any]) -> Setting:
    """A measured run (benchmarks/shaped_strategies.py's JSON) as a Setting, its strategy's options read by its
    terms (`CostTerms.options_of`): a run's key that its strategy does not declare plays no part."""
    return Setting(
        strategy=point["strategy"],
        workers=point["workers"],
        params=point["params"],
        link_mbit=point["link_mbit"],
        nodes=point.get("nodes", 0),
        options=terms_or_plain(point["strategy"]).options_of(point),
    )


def usable(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs without a straggler (the model has no straggler term) and with a measured rate, the repeats of one
    setting merged: their mean steps/s, with `runs` and `spread` (the lowest and highest) of what was merged."""
    groups: dict[tuple[Setting, str], list[dict[str, Any]]] = {}
    for p in points:
        if not p.get("straggler") and p.get("steps_per_s"):
            groups.setdefault((setting_of(p), p.get("model", "")), []).append(p)
    merged = []
    for same in groups.values():
        rates = [p["steps_per_s"] for p in same]
        merged.append(
            {**same[0], "steps_per_s": statistics.fmean(rates), "runs": len(rates), "spread": (min(rates), max(rates))}
        )
    return merged


def link_efficiency(chosen: list[dict[str, Any]]) -> tuple[float, dict[str, Any]]:
    """Efficiency from the reference strategy's runs at the lowest and highest link rate (two equations:
    base + bytes / (eff x rate) + hops x alpha at both rates: the difference gives eff); and its top-rate run."""
    runs = sorted((p for p in chosen if p["strategy"] == reference()), key=lambda p: p["link_mbit"])
    if len(runs) < 2 or runs[0]["link_mbit"] == runs[-1]["link_mbit"]:
        raise ValueError(f"fitting needs {reference()} runs at two link rates")
    lo, hi = runs[0], runs[-1]
    v = network_bytes(setting_of(lo))
    delta = 1 / lo["steps_per_s"] - 1 / hi["steps_per_s"]
    denom = v / (lo["link_mbit"] * 1e6 / 8) - v / (hi["link_mbit"] * 1e6 / 8)
    return (min(1.0, denom / delta) if delta > 0 else 1.0), hi


def fit(points: list[dict[str, Any]], latency_s: float = 50e-6) -> Fit:
    """The link efficiency (`link_efficiency`), then each strategy's base and own parameters from its runs
    (`CostTerms.fit_into`, phase by phase). Reads only the runs `fitting_side` picks; the rest are for `validate`."""
    chosen = fitting_side(points)
    efficiency, hi = link_efficiency(chosen)
    result = Fit(efficiency, {}, hi["params"], latency_s, fitted_on=[label(p) for p in chosen])
    for phase in (0, 1):
        for name in modelled():
            if terms(name).fit_phase == phase:
                terms(name).fit_into(result, [p for p in chosen if p["strategy"] == name], hi["link_mbit"])
    return result


def label(p: dict[str, Any]) -> str:
    model = f"{p['model']} " if p.get("model") else ""
    return (
        f"{p['strategy']}, {p['workers']} workers, {model}{p['params'] / 1e6:.2g}M params "
        f"@ {p['link_mbit']:g} Mbit/s"
        f"{terms(p['strategy']).label(p)}"
    )


def fitting_side(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs the fit reads, all of the built-in MLP's most common size and worker count: each strategy picks its own
    (`CostTerms.fitting_runs`: the reference at every rate, the others at the highest rate mostly). The rest is
    for validation, runs of another kind of model (`model` set) included."""
    runs = [p for p in usable(points) if p["strategy"] in modelled() and not p.get("model")]
    if not runs:
        return []
    # The most common model size and worker count; runs of the others are held out, so the validation checks how
    # the model carries to another size and another worker count.
    for key in ("params", "workers"):
        values = [p[key] for p in runs]
        common = max(sorted(set(values)), key=values.count)
        runs = [p for p in runs if p[key] == common]
    low, top = min(p["link_mbit"] for p in runs), max(p["link_mbit"] for p in runs)
    return [
        p for name in modelled() for p in terms(name).fitting_runs([q for q in runs if q["strategy"] == name], low, top)
    ]


def same_setting(p: dict[str, Any], q: dict[str, Any]) -> bool:
    return setting_of(p) == setting_of(q)


@dataclass
class Check:
    point: str
    measured: float
    """The mean of the setting's runs."""
    predicted: float
    runs: int = 1
    spread: tuple[float, float] = (0.0, 0.0)

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured


def with_compute(f: Fit, params: int, compute_s: float) -> Fit:
    """The fit for a model whose compute per step on one worker (the reference strategy's base) is known: every
    strategy's base scaled by one factor, keeping its measured ratio to the reference's (`raydist plan
    --compute-ms`)."""
    factor = compute_s / (f.base_s[reference()] * params / f.base_params)
    return replace(f, base_s={k: v * factor for k, v in f.base_s.items()}, own_fits=dict(f.own_fits))


def anchor(f: Fit, runs: list[dict[str, Any]]) -> tuple[Fit, dict[str, Any]] | None:
    """For the runs of a model the fit has not seen: its reference run at the highest link rate, and the fit
    rescaled to that run's compute per step (its step time less the network and latency terms), as a user passes
    it to `raydist plan --compute-ms`. None without such a run."""
    ref = sorted((p for p in runs if p["strategy"] == reference()), key=lambda p: -p["link_mbit"])
    if not ref:
        return None
    st = setting_of(ref[0])
    probe = Fit(f.efficiency, {st.strategy: 0.0}, st.params, f.latency_s)
    return with_compute(f, st.params, max(1 / ref[0]["steps_per_s"] - step_s(probe, st), 1e-6)), ref[0]


def validate(points: list[dict[str, Any]], latency_s: float = 50e-6) -> tuple[Fit, list[Check]]:
    """Fit on `fitting_side`, predict steps/s of the other runs: the MLP's with the fit as it is, another
    model's with the fit `anchor`ed on its own reference run."""
    f = fit(points, latency_s)
    fitted = fitting_side(points)
    runs = usable(points)
    # Held out: every run whose setting differs from all fitted ones (a repeat of a fitted setting checks
    # reproducibility, not the model).
    mlp = [p for p in runs if not p.get("model") and not any(same_setting(p, q) for q in fitted)]
    checks = [_check(f, p) for p in mlp if p["strategy"] in f.base_s]
    for model in dict.fromkeys(p["model"] for p in runs if p.get("model")):
        mine = [p for p in runs if p.get("model") == model]
        anchored = anchor(f, mine)
        if anchored:
            checks += [_check(anchored[0], p) for p in mine if p is not anchored[1] and p["strategy"] in f.base_s]
    return f, checks


def _check(f: Fit, p: dict[str, Any]) -> Check:
    return Check(label(p), p["steps_per_s"], steps_per_s(f, setting_of(p)), p["runs"], p["spread"])


def validation_table(checks: list[Check]) -> str:
    rows = ["| run (held out) | runs | measured steps/s: mean (min-max) | predicted | error |", "|---|---|---|---|---|"]
    rows += [
        f"| {c.point} | {c.runs} | {c.measured:.1f} ({c.spread[0]:.1f}-{c.spread[1]:.1f}) | {c.predicted:.1f} | "
        f"{100 * c.error:+.0f}% |"
        for c in checks
    ]
    return "\n".join(rows)


# ---- how far an answer lies beyond what was measured ------------------------------------------------------------


@dataclass(frozen=True)
class Validated:
    """What the validation covers: the worker counts of the measured runs, and the largest error of a held-out
    run of the built-in model (the model's error where it was checked)."""

    min_workers: int
    max_workers: int
    max_error: float

    def beyond(self, workers: int) -> float:
        """How many times outside the measured worker counts `workers` lies: 1 inside them."""
        return max(workers / self.max_workers, self.min_workers / workers, 1.0)

    def factor(self, workers: int) -> float:
        """How far off (a factor either way) a prediction at `workers` may be: 1 + the largest measured error
        inside the checked range, that error added once more for every doubling beyond it. A rule of thumb, not a
        fit: no run shows how the error grows out there, only that it is not smaller than where it was measured."""
        return 1 + self.max_error * (1 + math.log2(self.beyond(workers)))


def validated(points: list[dict[str, Any]], checks: list[Check]) -> Validated:
    """The worker counts of the built-in model's measured runs and its largest held-out error (`validate`'s
    checks); examples/tinygpt's rows, predicted from its own anchor, do not count."""
    mlp = [p for p in usable(points) if not p.get("model") and p["strategy"] in modelled()]
    held_out = {label(p) for p in mlp}
    errors = [abs(c.error) for c in checks if c.point in held_out]
    workers = [p["workers"] for p in mlp]
    return Validated(min(workers), max(workers), max(errors) if errors else 1.0)
