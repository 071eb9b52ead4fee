"""`raydist plan`: which strategy for a cluster that is not there yet, from the cost model (raydist/planning/costmodel.py)
fitted on measured runs (benchmarks/shaped_strategies.py's JSON; the repo ships one in docs/data/)."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raydist.errors import UsageError

DEFAULT_MEASURED = Path(__file__).resolve().parents[2] / "docs" / "data" / "shaped_runs.json"
NODES = (8, 16, 32, 64, 128, 256, 512)


def _numbers(text: str, what: str, cast=float) -> list:
    try:
        values = [cast(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{what} {text}: expected comma-separated numbers") from None
    if not values or any(not math.isfinite(v) or v <= 0 for v in values):
        raise UsageError(f"{what} {text}: expected comma-separated numbers > 0")
    return values


def parse_count(text: str) -> int:
    """25M, 1.5B, 250k, 250000."""
    t = text.strip().upper()
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9}.get(t[-1:], 1)
    return int(float(t[:-1] if scale != 1 else t) * scale)


def parse_count_arg(text: str) -> int:
    try:
        n = parse_count(text)
    except (ValueError, OverflowError):  # 'lots', 'inf'
        n = 0
    if n <= 0:
        raise UsageError(f"--params {text}: expected a count > 0 such as 25M or 250000")
    return n


def load_points(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise UsageError(f"--measured {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"--measured {path}: not JSON ({e.msg} at line {e.lineno})") from None
    points = data.get("points") if isinstance(data, dict) else None
    if not isinstance(points, list) or not points:
        raise UsageError(f"--measured {path}: no 'points' list (write one with benchmarks/shaped_strategies.py)")
    hosts = data.get("hosts", 0)
    for p in points:
        p.setdefault("nodes", hosts)
    return points


def samples_to_target(points: list[dict[str, Any]]) -> dict[str, float]:
    """Per strategy, samples trained until the target accuracy (median over its even runs of the built-in task
    that reached it; local SGD's with all-reduce averaging, the one the plan models)."""
    got: dict[str, list[float]] = {}
    for p in points:
        if (
            p.get("part") == "compare"
            and not p.get("straggler")
            and p.get("time_to_target_s")
            and p.get("averaging", "allreduce") == "allreduce"
            and not p.get("model")
        ):
            got.setdefault(p["strategy"], []).append(p["time_to_target_s"] * p["samples_per_s"])
    return {k: statistics.median(v) for k, v in got.items()}


@dataclass(frozen=True)
class Question:
    """What `raydist plan` is asked: a model on clusters of these sizes and links."""

    params: int
    links: list[float]
    """Each node's link, Mbit/s."""
    nodes: list[int]
    batch_size: int
    """Samples per worker per step."""
    to_target: dict[str, float] = field(default_factory=dict)
    """Per strategy, samples trained until the target accuracy (measured); {} = rank by samples/s."""
    backend: str = "nccl"
    validated: Any = None
    """costmodel.Validated: the measured worker counts and the error there; None = no band."""


def _choose(row: dict[str, Any], key: str | None, factor: float) -> tuple[str, list[str]]:
    """The fastest strategy, and those whose range (their prediction, `factor` either way) overlaps the fastest's:
    the model cannot tell them apart from it."""
    entries = row["strategies"]
    cost = {k: (e[key] if key else 1 / e["samples_per_s"]) for k, e in entries.items()}
    ranked = sorted(cost, key=cost.get)
    return ranked[0], [k for k in ranked[1:] if cost[k] / factor <= cost[ranked[0]] * factor]


def plan(fit, q: Question) -> list[dict[str, Any]]:
    from raydist.planning.costmodel import Setting, samples_per_s, step_s, terms

    params, batch_size, to_target, backend = q.params, q.batch_size, q.to_target, q.backend
    rows = []
    for link in q.links:
        for n in q.nodes:
            factor = q.validated.factor(n) if q.validated else 1.0
            row: dict[str, Any] = {
                "link_mbit": link,
                "nodes": n,
                "strategies": {},
                "within_factor": factor,
                "beyond_measured": q.validated.beyond(n) if q.validated else 1.0,
            }
            for strategy in fit.base_s:
                s, extra = terms(strategy).plan(fit, Setting(strategy, n, params, link, backend=backend))
                rate = samples_per_s(fit, s, batch_size)
                entry = {"step_ms": 1e3 * step_s(fit, s), "samples_per_s": rate}
                if strategy in to_target:
                    entry["time_to_target_s"] = to_target[strategy] / rate
                row["strategies"][strategy] = {**entry, **extra}
            key = "time_to_target_s" if all("time_to_target_s" in e for e in row["strategies"].values()) else None
            row["choose"], row["or_within_factor"] = _choose(row, key, factor)
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    strategies = list(rows[0]["strategies"]) if rows else []
    ttt = all("time_to_target_s" in e for r in rows for e in r["strategies"].values())
    sharded = [s for s in strategies if "shards" in rows[0]["strategies"][s]] if rows else []
    cols = [f"{s} step ms / ksamples/s" + (" / time to target s" if ttt else "") for s in strategies]
    head = (
        "| link | nodes | beyond measured | within | "
        + " | ".join(cols)
        + " | choose |"
        + "".join(f" {s} shards |" for s in sharded)
    )
    out = [head, "|" + "---|" * (len(strategies) + 5 + len(sharded))]
    for r in rows:
        cells = []
        for s in strategies:
            e = r["strategies"][s]
            cell = f"{e['step_ms']:.1f} / {e['samples_per_s'] / 1e3:.1f}"
            if ttt:
                cell += f" / {e['time_to_target_s']:.1f}"
            cells.append(cell)
        link = f"{r['link_mbit'] / 1e3:g} Gbit/s" if r["link_mbit"] >= 1000 else f"{r['link_mbit']:g} Mbit/s"
        shards = "".join(f" {r['strategies'][s]['shards']} |" for s in sharded)
        beyond = "-" if r["beyond_measured"] <= 1 else f"{r['beyond_measured']:.0f}x"
        choose = r["choose"] + (f" (or {', '.join(r['or_within_factor'])})" if r["or_within_factor"] else "")
        out.append(
            f"| {link} | {r['nodes']} | {beyond} | {r['within_factor']:.1f}x | "
            + " | ".join(cells)
            + f" | {choose} |{shards}"
        )
    return "\n".join(out)


def _plan(args) -> int:
    from raydist.planning import costmodel

    points = load_points(Path(args.measured))
    if not math.isfinite(args.latency_us) or args.latency_us < 0:
        raise UsageError(f"--latency-us {args.latency_us:g}: must be a finite number >= 0")
    try:
        fit, checks = costmodel.validate(points, args.latency_us * 1e-6)
    except ValueError as e:
        raise UsageError(f"--measured {args.measured}: {e}") from None
    params = parse_count_arg(args.params)
    if args.batch_size <= 0:
        raise UsageError(f"--batch-size {args.batch_size}: must be > 0")
    if args.compute_ms is not None:
        if not math.isfinite(args.compute_ms) or args.compute_ms <= 0:
            raise UsageError(f"--compute-ms {args.compute_ms:g}: must be a finite number > 0")
        fit = costmodel.with_compute(fit, params, args.compute_ms / 1e3)
    links = _numbers(args.link_mbit, "--link-mbit")
    nodes = _numbers(args.nodes, "--nodes", int)
    reach = costmodel.validated(points, checks)
    rows = plan(fit, Question(params, links, nodes, args.batch_size, samples_to_target(points), args.backend, reach))
    if args.json:
        print(
            json.dumps(
                {"fit": fit.to_dict(), "validation": [{**asdict(c), "error": c.error} for c in checks], "plan": rows},
                indent=1,
            )
        )
        return 0
    print(
        f"cost model fitted on {len(fit.fitted_on)} runs of {args.measured} (link efficiency "
        f"{fit.efficiency:.2f}, latency {args.latency_us:g} us per hop, assumed)"
    )
    if args.validate:
        print(costmodel.validation_table(checks))
        return 0
    print(
        f"{params:,} parameters, batch {args.batch_size} per worker. Measured on {reach.min_workers}-"
        f"{reach.max_workers} workers, where held-out runs came within {reach.max_error:.0%}: 'within' is 1 + "
        f"that error, which grows by as much again for each doubling of the workers beyond them (a rule of thumb)"
    )
    print(markdown(rows))
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "plan", help="predict step time and time to target per strategy for 8-512 nodes", description=__doc__
    )
    p.add_argument("--measured", default=str(DEFAULT_MEASURED), help="measured runs to fit on (default: %(default)s)")
    p.add_argument("--params", default="25M", help="model parameters, e.g. 25M (default: %(default)s)")
    p.add_argument("--link-mbit", default="1000,10000", help="each node's link, Mbit/s, comma-separated")
    p.add_argument("--nodes", default=",".join(map(str, NODES)), help="node counts, comma-separated")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument(
        "--backend",
        choices=("nccl", "gloo"),
        default="nccl",
        help="the cluster's collectives: nccl (GPUs) or gloo, whose reduce-scatter moves twice the bytes "
        "(FSDP); the fit is on gloo runs either way (default: %(default)s)",
    )
    p.add_argument(
        "--compute-ms",
        type=float,
        help="your model's compute per step on one worker (ms); default: the fitted base scaled by parameter count",
    )
    p.add_argument("--latency-us", type=float, default=50.0, help="per message hop (assumed; default %(default)s)")
    p.add_argument("--validate", action="store_true", help="print the fit's validation table (held-out runs) only")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_plan)
