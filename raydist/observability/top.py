"""`raydist top`: what every training process of a running cluster is doing, read from Ray's metrics endpoints.

Every node's Ray agent serves the metrics raydist's processes export (raydist/observability/ray_metrics.py); the head's dashboard
lists those endpoints (/api/prometheus/sd, the list Prometheus scrapes), or, for a Ray instance on this machine,
its session writes the same list to a file. A process's series exist only while it is alive, so a row is a live
process; its age (seconds since it last exported) tells a stalled one.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raydist.errors import RaydistError
from raydist.observability.ray_metrics import EXPORTED_PREFIX, METRICS

SD_FILE = "prom_metrics_service_discovery.json"
STALLED_AFTER_S = 15.0
"""A process that exported nothing for this long is shown as stalled (it exports every second while it steps,
and Ray's agent passes it on every 2 s)."""
_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


COUNTS = ("step", "total_steps", "last_checkpoint_step", "restarts")
MEASURES = tuple(m.name for m in METRICS if m.name not in COUNTS and m.name != "updated_unixtime")
PER_WORKER = {m.name for m in METRICS if "worker" in m.extra_tags}
OWN_COLUMNS = tuple((m.top, m.name) for m in METRICS if m.top)
"""A strategy's own columns (`Metric.top`), shown after the common WAIT."""


# ---- parsing (pure) -------------------------------------------------------------------------------------------


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """raydist's samples of a Prometheus text page: (metric name without the prefix, labels, value)."""
    out = []
    for line in text.splitlines():
        if not line.startswith(EXPORTED_PREFIX):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(m["labels"] or "")}
        name = m["name"][len(EXPORTED_PREFIX) :]
        if name.endswith("_total"):
            name = name[: -len("_total")]
        out.append((name, labels, value))
    return out


@dataclass
class Proc:
    """One training process (worker, server shard or driver) of one run, as its metrics describe it."""

    run: str
    strategy: str
    role: str
    rank: int
    node: str
    values: dict[str, float] = field(default_factory=dict)
    per_worker: dict[str, dict[int, float]] = field(default_factory=dict)  # a server's latest value per worker

    def row(self, now: float) -> dict[str, Any]:
        v = self.values
        updated = v.get("updated_unixtime")
        age = None if updated is None else max(0.0, now - updated)
        out: dict[str, Any] = {
            "run": self.run,
            "strategy": self.strategy,
            "role": self.role,
            "rank": self.rank,
            "node": self.node,
            "state": "alive" if age is None or age < STALLED_AFTER_S else "stalled",
            "age_s": None if age is None else round(age, 1),
        }
        for key in COUNTS:
            if key in v:
                out[key] = int(v[key])
        for key in MEASURES:
            if key in v:
                out[key] = v[key]
        return out


def group(samples: list[tuple[str, dict[str, str], float]]) -> list[Proc]:
    """Samples -> one Proc per (run, role, rank); of two series of the same process (a restarted worker whose
    predecessor's series has not expired yet) the one that exported last wins."""
    by_series: dict[tuple, Proc] = {}
    for name, labels, value in samples:
        try:
            key = (labels["run"], labels["role"], int(labels["rank"]), labels.get("WorkerId", ""))
        except (KeyError, ValueError):
            continue
        p = by_series.get(key)
        if p is None:
            p = by_series[key] = Proc(
                labels["run"],
                labels.get("strategy", "?"),
                labels["role"],
                key[2],
                labels.get("node", labels.get("NodeAddress", "?")),
            )
        if name in PER_WORKER and "worker" in labels:
            p.per_worker.setdefault(name, {})[int(labels["worker"])] = value
        else:
            p.values[name] = value
    newest: dict[tuple, Proc] = {}
    for (run, role, rank, _), p in by_series.items():
        k = (run, role, rank)
        if k not in newest or p.values.get("updated_unixtime", 0) > newest[k].values.get("updated_unixtime", 0):
            newest[k] = p
    procs = sorted(newest.values(), key=lambda p: (p.run, {"driver": 0, "server": 1}.get(p.role, 2), p.rank))
    # A per-worker value is measured where the worker's work lands (the async PS's staleness, at server shard 0):
    # show it on the worker.
    for p in procs:
        for name, by_worker in p.per_worker.items():
            for w in procs:
                if w.run == p.run and w.role == "worker" and w.rank in by_worker:
                    w.values[name] = by_worker[w.rank]
    return procs


def runs_view(procs: list[Proc], now: float) -> list[dict[str, Any]]:
    """The JSON `--json` prints: one entry per run, its processes in order."""
    runs: dict[str, dict[str, Any]] = {}
    for p in procs:
        r = runs.setdefault(p.run, {"run": p.run, "strategy": p.strategy, "processes": []})
        r["processes"].append(p.row(now))
    for r in runs.values():
        rows = r["processes"]
        ckpt = [x["last_checkpoint_step"] for x in rows if "last_checkpoint_step" in x]
        if ckpt:
            r["last_checkpoint_step"] = max(ckpt)
        workers = [x for x in rows if x["role"] == "worker"]
        r["workers"] = len(workers)
        r["samples_per_s"] = sum(x.get("samples_per_s", 0.0) for x in workers)
    return list(runs.values())


def with_gone(previous: list[dict[str, Any]], current: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`current` runs, plus each process an earlier look saw in a run that is still going and this look does not:
    its series went with its process (a dead or killed worker), so it is shown as `gone` with what it last did."""
    before = {r["run"]: r for r in previous}
    out = []
    for run in current:
        seen = {(p["role"], p["rank"]) for p in run["processes"]}
        lost = [
            {**p, "state": "gone"}
            for p in before.get(run["run"], {}).get("processes", [])
            if (p["role"], p["rank"]) not in seen
        ]
        out.append(
            {
                **run,
                "processes": sorted(
                    run["processes"] + lost, key=lambda p: ({"driver": 0, "server": 1}.get(p["role"], 2), p["rank"])
                ),
            }
        )
    return out


def _fmt(value: Any, kind: str = "") -> str:
    if value is None:
        return "-"
    if kind == "pct":
        return f"{100 * value:.0f}%"
    if kind == "rate":
        return f"{value:,.0f}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


COLUMNS = (
    "RUN",
    "ROLE",
    "RANK",
    "NODE",
    "STEP",
    "SAMPLES/S",
    "WAIT",
    *(h for h, _ in OWN_COLUMNS),
    "LOSS",
    "CKPT",
    "CPU",
    "MEM",
    "RESTARTS",
    "STATE",
)


def _mem(row: dict[str, Any]) -> str:
    """A launched rank's resident memory, else a training process's peak."""
    value = row.get("rss_bytes", row.get("peak_memory_bytes"))
    return "-" if value is None else f"{value / 2**30:.1f}G" if value >= 2**30 else f"{value / 2**20:.0f}M"


def table(runs: list[dict[str, Any]], dead_nodes: list[str], source: str, now: float) -> str:
    """The terminal view: one line per process, runs one after the other."""
    lines = [f"raydist top  {time.strftime('%H:%M:%S', time.localtime(now))}  {source}"]
    if not runs:
        lines.append("no raydist training process is running")
    rows = [COLUMNS]
    for r in runs:
        for x in r["processes"]:
            step = _fmt(x.get("step")) + (f"/{x['total_steps']}" if "total_steps" in x else "")
            state = x["state"] + (f" {x['age_s']:.0f}s" if x["state"] == "stalled" and x["age_s"] is not None else "")
            rows.append(
                (
                    r["run"] if x is r["processes"][0] else "",
                    x["role"],
                    str(x["rank"]),
                    x["node"],
                    step,
                    _fmt(x.get("samples_per_s"), "rate"),
                    _fmt(x.get("comm_wait_share"), "pct"),
                    *(_fmt(x.get(name)) for _, name in OWN_COLUMNS),
                    _fmt(x.get("loss")),
                    _fmt(x.get("last_checkpoint_step")),
                    _fmt(x.get("cpu_share"), "pct"),
                    _mem(x),
                    _fmt(x.get("restarts")),
                    state,
                )
            )
    if len(rows) > 1:
        widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    if dead_nodes:
        lines.append(f"dead nodes: {', '.join(dead_nodes)}")
    return "\n".join(lines)


# ---- where the metrics are ------------------------------------------------------------------------------------


def targets_from_sd(payload: Any) -> list[str]:
    """Prometheus service-discovery JSON -> 'host:port' targets."""
    if not isinstance(payload, list):
        return []
    return sorted({t for entry in payload if isinstance(entry, dict) for t in entry.get("targets", [])})


@dataclass
class Source:
    """How to reach one cluster's metrics: a dashboard (with its token) or a local session's discovery file."""

    describe: str
    dashboard_url: str | None = None
    token: str | None = None
    sd_file: Path | None = None
    token_path: str | None = None
    session: str | None = None
    """Ray's session name of the cluster (every series carries it as SessionName): with several Ray instances on
    one machine, a dashboard's discovery list can name another instance's endpoints too (Ray's dashboard keeps
    one global connection per process), so only this session's series count."""

    def session_name(self) -> str | None:
        if self.session is None and self.dashboard_url is not None:
            from raydist.cluster import dashboard_client

            try:
                version = dashboard_client.get_json(f"{self.dashboard_url}/api/version", self.token)
                self.session = version.get("session_name")
            except dashboard_client.DashboardUnavailable as e:
                raise RaydistError(f"{self.describe}: {e} (has the cluster ended?)") from None
        return self.session

    def targets(self) -> list[str]:
        if self.sd_file is not None:
            try:
                return targets_from_sd(json.loads(self.sd_file.read_text()))
            except (OSError, ValueError) as e:
                raise RaydistError(
                    f"cannot read {self.sd_file}: {getattr(e, 'strerror', None) or e} "
                    f"(is a Ray instance running on this machine?)"
                ) from None
        from raydist.cluster import dashboard_client

        try:
            return targets_from_sd(dashboard_client.get_json(f"{self.dashboard_url}/api/prometheus/sd", self.token))
        except dashboard_client.DashboardUnavailable as e:
            raise RaydistError(f"{self.describe}: {e} (has the cluster ended?)") from None

    def dead_nodes(self) -> list[str]:
        if self.dashboard_url is None:
            return []
        from raydist.cluster import dashboard_client

        try:
            nodes = dashboard_client.list_nodes(self.dashboard_url, self.token)
            return sorted(f"{n.hostname} ({n.ip})" for n in nodes if not n.alive)
        except dashboard_client.DashboardUnavailable:
            return []


def local_source(temp_dir: str = "/tmp/ray") -> Source:
    """The Ray instance on this machine that started last (a job's embedded instance, or `ray start`)."""
    sd = Path(temp_dir) / "session_latest" / SD_FILE
    if not sd.exists():
        raise RaydistError(f"no running Ray instance found under {temp_dir} (give --address, --job or --temp-dir)")
    session = os.path.realpath(sd.parent)
    return Source(describe=f"local Ray ({session})", sd_file=sd, session=os.path.basename(session))


def scrape(target: str, timeout: float = 3.0) -> str:
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=timeout) as resp:
        return resp.read().decode(errors="replace")


def snapshot(
    source: Source, fetch: Callable[[str], str] = scrape, clock: Callable[[], float] = time.time
) -> dict[str, Any]:
    """One look at the cluster: every process's row, the dead nodes, and any endpoint that did not answer."""
    session = source.session_name()
    targets = source.targets()
    samples: list[tuple[str, dict[str, str], float]] = []
    errors = []

    def one(t: str):
        try:
            return t, fetch(t), None
        except (OSError, urllib.error.URLError) as e:
            return t, "", str(getattr(e, "reason", e))

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(targets)))) as pool:
        for target, text, err in pool.map(one, targets):
            if err is not None:
                errors.append(f"{target}: {err}")
            samples += [x for x in parse_samples(text) if session is None or x[1].get("SessionName") == session]
    now = clock()
    return {
        "source": source.describe,
        "session": session,
        "time": now,
        "targets": targets,
        "unreachable": errors,
        "dead_nodes": source.dead_nodes(),
        "runs": runs_view(group(samples), now),
    }


LAUNCHED_COLUMNS = ("RUN", "RANK", "NODE", "STATE", "RESTARTS", "CPU", "MEM", "STEP", "LOSS")


def launched(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ranks of scripts run by `raydist launch`, one row each (`raydist status`)."""
    return [{"run": r["run"], **p} for r in runs if r["strategy"] == "launch" for p in r["processes"]]


def launched_table(rows: list[dict[str, Any]]) -> str:
    table = [LAUNCHED_COLUMNS] + [
        (
            x["run"],
            str(x["rank"]),
            x["node"],
            x["state"],
            _fmt(x.get("restarts")),
            _fmt(x.get("cpu_share"), "pct"),
            _mem(x),
            _fmt(x.get("step")),
            _fmt(x.get("loss")),
        )
        for x in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(LAUNCHED_COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)
