"""What raydist's processes export through `ray.util.metrics`: one table of metrics, and the exporter every training
worker, parameter-server shard and driver uses.

Ray's metrics agent on each node serves them (with Ray's own) on the node's metrics export port, named
`ray_raydist_<name>` (a counter also gets `_total`), so Prometheus, Grafana and `raydist top` read them where Ray
users look. A series lives only while the process that set it is alive: Ray drops a dead worker's series within
seconds, which is how `raydist top` tells a live worker from a gone one.
"""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Callable

from raydist.observability.metric import Metric

PREFIX = "raydist_"
EXPORTED_PREFIX = "ray_" + PREFIX
TAGS = ("run", "strategy", "role", "rank", "node")
"""Every raydist metric carries these: run name, strategy, role (worker, server, driver), rank (a server's shard
index; the driver's is 0), node (hostname)."""


COMMON: tuple[Metric, ...] = (
    Metric("step", "gauge", "optimizer steps taken: a worker's own, a server's applied updates, the driver's run step"),
    Metric("total_steps", "gauge", "steps the run takes in all"),
    Metric("loss", "gauge", "training loss of the latest step (rank 0 of a sync run: the mean over ranks)"),
    Metric("grad_norm", "gauge", "gradient norm of the latest step, before clipping"),
    Metric("lr", "gauge", "learning rate of the latest step"),
    Metric(
        "samples_per_s", "gauge", "training samples per second through this worker (the whole run's for the driver)"
    ),
    Metric("step_time_s", "gauge", "wall time of the latest step"),
    Metric(
        "comm_wait_share",
        "gauge",
        "share of wall time spent waiting on communication since the previous export (past 0.2 the model is too "
        "small for the nodes or the network is slow)",
    ),
    Metric("comm_bytes", "counter", "payload bytes sent plus received (by the algorithm's volume, not wire bytes)"),
    Metric("checkpoint_s", "gauge", "seconds the latest checkpoint took to write"),
    Metric("last_checkpoint_step", "gauge", "step of the latest checkpoint"),
    Metric("peak_memory_bytes", "gauge", "peak resident memory of the process (GPU: peak allocated on its device)"),
    Metric("test_accuracy", "gauge", "test accuracy at the latest evaluation"),
    Metric(
        "restarts", "gauge", "restarts of the run's workers so far (async PS driver; each rank of `raydist launch`)"
    ),
    Metric("rss_bytes", "gauge", "`raydist launch`: resident memory of the rank's script and the processes it started"),
    Metric(
        "cpu_share",
        "gauge",
        "`raydist launch`: CPU time of the rank's script and the processes it started, per "
        "second of wall time since the previous export (1.0 = one core busy)",
    ),
    Metric("updated_unixtime", "gauge", "when this process last exported (Unix time): its age tells a stalled worker"),
)


def _declared() -> tuple[Metric, ...]:
    """The strategies' own metrics (`StrategySpec.metrics`), in registry order."""
    from raydist import registry

    return tuple(m for spec in registry.all_specs() if spec.metrics for m in spec.load("metrics"))


METRICS: tuple[Metric, ...] = COMMON + _declared()
BY_NAME = {m.name: m for m in METRICS}
EXPORT_EVERY_S = 1.0
"""How often a process hands its latest values to Ray (Ray's agent pushes them on its own schedule:
RAY_metrics_report_interval_ms, which raydist sets to 2000 for the instances it starts)."""

_instruments: dict[str, object] = {}


def _instrument(metric: Metric):
    """One ray.util.metrics object per metric and process (Ray keys them by name)."""
    inst = _instruments.get(metric.name)
    if inst is None:
        from ray.util.metrics import Counter, Gauge

        cls = Gauge if metric.kind == "gauge" else Counter
        inst = _instruments[metric.name] = cls(
            PREFIX + metric.name, description=metric.description, tag_keys=TAGS + metric.extra_tags
        )
    return inst


def peak_memory_bytes(device: str = "cpu") -> int:
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def node_name() -> str:
    return socket.gethostname()


class Exporter:
    """The latest values of one process, handed to Ray at most every EXPORT_EVERY_S (a Gauge.set costs a few
    microseconds; a step of a small model is a millisecond). Outside a Ray worker it does nothing, unless under
    `raydist launch` (then it relays)."""

    def __init__(
        self,
        run: str,
        strategy: str,
        role: str,
        rank: int,
        *,
        device: str = "cpu",
        every_s: float = EXPORT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        enabled: bool | None = None,
        own_memory: bool = True,
    ):
        """`own_memory`: export this process's peak memory (not for a launched rank's agent: not its rank's)."""
        self.own_memory = own_memory
        self.relay = False
        """A rank of `raydist launch` (scaling.engine=launch), not connected to Ray: the values go to its agent
        through raydist.hook, and the agent exports them under the same names."""
        if enabled is None:
            import ray

            from raydist import hook

            enabled = ray.is_initialized()
            self.relay = not enabled and hook.active()
            enabled = enabled or self.relay
        self.enabled = enabled
        self.tags = {"run": run, "strategy": strategy, "role": role, "rank": str(rank), "node": node_name()}
        self.device, self.every_s, self.clock = device, every_s, clock
        self.values: dict[str, float] = {}
        self.per_worker: dict[str, dict[int, float]] = {}
        self._bytes_total = 0.0
        self._bytes_sent = 0.0
        self._wait_total = 0.0
        self._wait_mark: tuple[float, float] | None = None  # (clock, wait total) at the previous export
        self._counts: dict[str, float] = {}
        self._count_mark: tuple[float, dict[str, float]] | None = None
        self._last = -float("inf")

    def observe(self, **values: float | None) -> None:
        for k, v in values.items():
            if v is not None:
                self.values[k] = float(v)

    def observe_worker(self, name: str, worker: int, value: float) -> None:
        """A value per worker, set by another process (a metric with a `worker` tag: the async PS's staleness)."""
        self.per_worker.setdefault(name, {})[worker] = float(value)

    def communication(self, total_bytes: float, total_wait_s: float) -> None:
        """Cumulative bytes and waiting time (CommStats); exported as a counter and a share of wall time."""
        self._bytes_total, self._wait_total = total_bytes, total_wait_s

    def count(self, rate_name: str, n: float = 1) -> None:
        """Events (samples trained, updates applied), exported as `rate_name`: per second since the previous export."""
        self._counts[rate_name] = self._counts.get(rate_name, 0.0) + n

    def maybe_export(self, force: bool = False) -> bool:
        now = self.clock()
        if not self.enabled or (not force and now - self._last < self.every_s):
            return False
        self._last = now
        self._derive(now)
        if self.own_memory:
            self.values["peak_memory_bytes"] = peak_memory_bytes(self.device)
        self.values["updated_unixtime"] = time.time()
        if self.relay:
            from raydist import hook

            hook.report(**self.values, **{RELAYED_BYTES: self._bytes_total})
            return True
        try:
            for name, value in self.values.items():
                _instrument(BY_NAME[name]).set(value, tags=self.tags)
            for name, per in self.per_worker.items():
                for worker, value in per.items():
                    _instrument(BY_NAME[name]).set(value, tags={**self.tags, "worker": str(worker)})
            if self._bytes_total > self._bytes_sent:
                _instrument(BY_NAME["comm_bytes"]).inc(self._bytes_total - self._bytes_sent, tags=self.tags)
                self._bytes_sent = self._bytes_total
        except Exception as e:  # metrics must never fail training; one line, then stay quiet
            print(f"[raydist] ray metrics export off: {type(e).__name__}: {e}", flush=True)
            self.enabled = False
        return True

    def _derive(self, now: float) -> None:
        if self._wait_total == 0:  # no communication reported (a driver), or relayed with its share (an agent)
            pass
        elif self._wait_mark is not None and now > self._wait_mark[0]:
            share = (self._wait_total - self._wait_mark[1]) / (now - self._wait_mark[0])
            self.values["comm_wait_share"] = min(max(share, 0.0), 1.0)
        self._wait_mark = (now, self._wait_total)
        if self._count_mark is not None and now > self._count_mark[0]:
            then, before = self._count_mark
            for name, total in self._counts.items():
                self.values[name] = (total - before.get(name, 0.0)) / (now - then)
        self._count_mark = (now, dict(self._counts))


RELAYED_BYTES = "comm_bytes_so_far"
"""The hook's key for a relaying rank's cumulative comm_bytes (the agent exports the counter's increments)."""


def export_relayed(exporter: Exporter, status: dict[str, float]) -> None:
    """A launched rank's relayed values (its hook file), exported by its agent: every known metric, and the
    comm_bytes counter's increment since the last time."""
    exporter.observe(**{k: v for k, v in status.items() if k in BY_NAME and BY_NAME[k].kind == "gauge"})
    if RELAYED_BYTES in status:
        exporter._bytes_total = status[RELAYED_BYTES]


def markdown_table() -> str:
    """The metric table of docs/observability.md (a test keeps the two equal)."""
    rows = ["| exported as | kind | extra tags | what |", "|---|---|---|---|"]
    for m in METRICS:
        name = f"{EXPORTED_PREFIX}{m.name}{'_total' if m.kind == 'counter' else ''}"
        rows.append(f"| `{name}` | {m.kind} | {', '.join(m.extra_tags) or '-'} | {m.description} |")
    return "\n".join(rows) + "\n"
