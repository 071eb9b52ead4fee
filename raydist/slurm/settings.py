"""The SLURM cluster's config (cluster/cluster.yaml): declared, loaded and checked like the run config.

Every key's help, bounds and parser live in its `opt(...)` below; docs/configuration.md's table is generated from
them (`raydist config reference --cluster`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from raydist.errors import ConfigError
from raydist.slurm.nodes import expand_hostlist
from raydist.typedconfig import apply, check, internal, merge, opt, validate

CONFIG_ENV = "RAYDIST_CLUSTER_CONFIG"
DEFAULT_PATH = Path("cluster") / "cluster.yaml"
# Ray refuses object stores under 75 MiB.
MIN_OBJECT_STORE = 75 * 1024 * 1024
_IFNAME = re.compile(r"^[^\s/:]{1,15}$")  # Linux: at most 15 bytes, no '/', ':' or whitespace
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_WHAT = "settings (interfaces, ports, ...)"


def parse_size(value: Any, key: str) -> int:
    """Bytes from an int or a string like '200MB' / '2GiB'."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: must be a size like 2GB or a number of bytes (got {value!r})")
    if isinstance(value, (int, float)):
        return int(value)
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"{key}: must be a size like 2GB, 512MiB or a number of bytes (got {value!r})")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


# ---- per-field parsers ------------------------------------------------------------------------------------


def _interfaces(data: Any, key: str) -> dict[str, str]:
    """{hostlist: interface} -> {node: interface}: one line of YAML names a whole rack."""
    if data is None:
        return {}
    check(isinstance(data, dict), key, f"must map node names to interface names (got {data!r})")
    out: dict[str, str] = {}
    for nodes, iface in data.items():
        check(
            isinstance(iface, str) and bool(_IFNAME.match(iface)),
            f"{key}.{nodes}",
            f"{iface!r} is not an interface name",
        )
        for node in expand_hostlist(str(nodes)):
            out[node] = iface
    return out


def _object_store(value: Any, key: str) -> int | None:
    if value is None:
        return None
    size = parse_size(value, key)
    check(size >= MIN_OBJECT_STORE, key, f"Ray needs at least 75MiB (got {size} bytes)")
    return size


def _dashboard_host(value: str, key: str) -> str:
    if value != "cluster":
        try:
            ipaddress.IPv4Address(value)
        except ValueError:
            raise ConfigError(f"{key}: must be 'cluster' or an IPv4 address such as 0.0.0.0 (got {value!r})") from None
    return value


def _absolute(value: str, key: str) -> str:
    check(Path(value).is_absolute(), key, f"must be an absolute path (got {value!r})")
    return value


def _not_empty(value: str, key: str) -> str:
    check(bool(value), key, "must not be empty")
    return value


# ---- the cluster config -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Ports:
    """The port range every job's block of Ray ports comes from."""

    base: int = opt(20000, "first port of the range port blocks come from", ge=1024)
    end: int = opt(
        31999,
        "last port of the range; below Linux's ephemeral ports (32768+), so outgoing sockets never hold ours",
        le=65535,
    )
    block: int = opt(
        400,
        "ports per job: GCS, dashboard, client, node manager, object manager, 4 agent/metrics "
        "ports, the rest Ray workers",
        ge=18,
    )

    def check(self, prefix: str) -> None:
        check(self.base < self.end, prefix.rstrip("."), f"need base < end (got base={self.base}, end={self.end})")
        check(
            self.block <= self.end - self.base + 1,
            f"{prefix}block",
            f"must be at most the size of the range, end - base + 1 = {self.end - self.base + 1} (got {self.block})",
        )


@dataclasses.dataclass
class Timeouts:
    """How long bring-up and teardown wait, in seconds."""

    ready: float = opt(300.0, "seconds from sbatch's bring-up until every node must have joined", gt=0)
    head_reachable: float = opt(120.0, "seconds a worker waits for the head's GCS port to answer", gt=0)
    teardown: float = opt(
        15.0, "seconds per node for Ray to stop and leftovers to be killed; keep below SLURM's KillWait", gt=0
    )
    stop: float = opt(
        60.0,
        "seconds running training jobs get to checkpoint and stop after the time-limit warning or "
        "a preemption, before Ray is torn down; keep below the `--signal` lead time",
        gt=0,
    )


@dataclasses.dataclass
class Requeue:
    """Batch mode (`sbatch cluster/ray_up.slurm COMMAND`): when the allocation requeues itself."""

    max_requeues: int = opt(3, "requeues of one job (SLURM_RESTART_COUNT) after which it ends instead", ge=0)
    on_failure: bool = opt(
        False,
        "also requeue when the command fails (e.g. a node died); a command that keeps failing stops at max_requeues",
    )


@dataclasses.dataclass
class ClusterConfig:
    """What `sbatch cluster/ray_up.slurm` needs to know about the cluster beyond what SLURM tells it."""

    interfaces: dict[str, str] = opt(
        {},
        "node -> network interface Ray, NCCL and gloo use on it; keys may be SLURM hostlists (`gpu[01-04]: ib0`); "
        "nodes not listed use the interface that carries their route to the head",
        parse=_interfaces,
        shown="map",
    )
    object_store_memory: int | None = opt(
        None,
        "Ray's object store per node: bytes or `200MB`, `2GiB`, ... (null: Ray's default, 30% of RAM; min 75MiB)",
        parse=_object_store,
        shown="size or null",
    )
    dashboard_host: str = opt(
        "cluster",
        "where the dashboard and jobs API listen: `cluster` = the head's cluster address; `0.0.0.0` only if you ask",
        parse=_dashboard_host,
        shown="`cluster` or IPv4",
    )
    job_dir: str = opt(
        "~/.raydist/slurm",
        "shared dir; each job gets `<job_dir>/<job id>/` with `token`, `plan.json`, `nodes/`, `connection.env`",
        parse=_not_empty,
    )
    temp_dir: str = opt(
        "/tmp",
        "node-local disk; Ray's per-job temp dir is `<temp_dir>/raydist-<job id>` (also the job's `TMPDIR`)",
        parse=_absolute,
        shown="absolute path",
    )
    login_host: str = opt("", "login node for the printed `ssh -L` line ('': the host sbatch ran on)")
    warm_python: bool = opt(
        True,
        "a warm interpreter per node, torch imported at bring-up, forks the processes of `raydist launch` "
        "and scaling.engine=launch: they skip torch's import (the warm interpreter holds torch's memory on each "
        "node while idle)",
    )
    yield_daemons: bool = opt(
        False,
        "Ray's processes that serve only the dashboard, logs and metrics run at idle priority on each node (the GCS "
        "and Ray Train's controller and helper actors at nice 19; the raylet and the workers untouched), so that "
        "they take only the CPU the training leaves: for nodes whose cores the ranks fill (on the emulated cluster "
        "it did not move the loop, "
        "docs/data/footprint_cluster.json); the dashboard, which `ray job submit` and `raydist top` talk to, then "
        "answers only when a core is free",
    )
    ports: Ports = dataclasses.field(default_factory=Ports)
    timeouts: Timeouts = dataclasses.field(default_factory=Timeouts)
    requeue: Requeue = dataclasses.field(default_factory=Requeue)
    source: str = internal("built-in defaults")  # where it was loaded from, for messages

    def interface_for(self, node: str) -> str | None:
        return self.interfaces.get(node)

    def job_path(self, job_id: int) -> Path:
        return Path(os.path.expanduser(self.job_dir)) / str(job_id)

    def temp_path(self, job_id: int) -> Path:
        return Path(self.temp_dir) / f"raydist-{job_id}"


def from_dict(data: dict[str, Any], source: str = "<dict>") -> ClusterConfig:
    """A cluster config from a parsed mapping, checked."""
    cfg = ClusterConfig(source=source)
    apply(cfg, data)
    return validate(cfg)


def config_path(explicit: str | None = None) -> Path | None:
    """--config, else $RAYDIST_CLUSTER_CONFIG, else ./cluster/cluster.yaml if present, else None (defaults)."""
    if explicit:
        return Path(explicit)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    return DEFAULT_PATH if DEFAULT_PATH.is_file() else None


def load(explicit: str | None = None, overrides: Iterable[str] = ()) -> ClusterConfig:
    """The cluster config: defaults, then the file `config_path` finds, then each --set key=value; checked."""
    path = config_path(explicit)
    cfg = ClusterConfig(source=str(path) if path else "built-in defaults")
    merge(cfg, [path] if path else [], overrides, what=_WHAT, kind="cluster config")
    try:
        return validate(cfg)
    except ConfigError as e:  # a rule across keys, e.g. ports.base < ports.end: still the file's fault
        raise ConfigError(f"{path}: {e}" if path else str(e)) from None
