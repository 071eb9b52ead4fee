"""The SLURM cluster's config (cluster/cluster.yaml): a typed dataclass loaded from YAML and validated on load."""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
import re
from pathlib import Path
from typing import Any

from raydist.config import read_yaml
from raydist.errors import ConfigError
from raydist.slurm.nodes import expand_hostlist

CONFIG_ENV = "RAYDIST_CLUSTER_CONFIG"
DEFAULT_PATH = Path("cluster") / "cluster.yaml"
# Ray refuses object stores under 75 MiB.
MIN_OBJECT_STORE = 75 * 1024 * 1024
_IFNAME = re.compile(r"^[^\s/:]{1,15}$")  # Linux: at most 15 bytes, no '/', ':' or whitespace
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


@dataclasses.dataclass
class Ports:
    base: int = 20000       # first port of the range the job blocks come from
    end: int = 31999        # last port; kept below Linux's ephemeral range (32768+) so outgoing sockets never hold ours
    block: int = 400        # ports per job: 9 services + the rest for Ray workers


@dataclasses.dataclass
class Timeouts:
    ready: float = 300.0          # seconds from sbatch's bring-up until every node has joined
    head_reachable: float = 120.0  # seconds a worker waits for the head's GCS port to answer
    teardown: float = 15.0        # seconds Ray gets to stop on a node before its leftovers are killed


@dataclasses.dataclass
class ClusterConfig:
    interfaces: dict[str, str] = dataclasses.field(default_factory=dict)  # node -> interface (hostlists allowed)
    object_store_memory: int | None = None  # bytes; None: Ray's default (30% of the node's memory)
    dashboard_host: str = "cluster"  # "cluster": the head's cluster address; or an address such as 0.0.0.0
    job_dir: str = "~/.raydist/slurm"  # shared by all nodes and the login node: <job_dir>/<job id>/
    temp_dir: str = "/tmp"  # node-local: Ray's per-job temp dir is <temp_dir>/raydist-<job id>
    login_host: str = ""  # login node for the printed `ssh -L` line; "": the host sbatch ran on
    ports: Ports = dataclasses.field(default_factory=Ports)
    timeouts: Timeouts = dataclasses.field(default_factory=Timeouts)
    source: str = "built-in defaults"  # where it was loaded from, for messages

    def interface_for(self, node: str) -> str | None:
        return self.interfaces.get(node)

    def job_path(self, job_id: int) -> Path:
        return Path(os.path.expanduser(self.job_dir)) / str(job_id)

    def temp_path(self, job_id: int) -> Path:
        return Path(self.temp_dir) / f"raydist-{job_id}"


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


def _unknown(key: str, known: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], known, n=1)
    return ConfigError(f"unknown key '{key}'" + (f" (did you mean '{close[0]}'?)" if close else "")
                       + f"; known: {', '.join(known)}")


def _number(value: Any, key: str, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and isinstance(value, float)):
        raise ConfigError(f"{key}: must be {'an integer' if kind is int else 'a number'} (got {value!r})")
    return kind(value)


def _section(obj: Any, data: Any, key: str) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{key}: must be a mapping (got {data!r})")
    known = [f.name for f in dataclasses.fields(obj)]
    for name, value in data.items():
        if name not in known:
            raise _unknown(f"{key}.{name}", known)
        setattr(obj, name, _number(value, f"{key}.{name}", type(getattr(obj, name))))


def _interfaces(data: Any) -> dict[str, str]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"interfaces: must map node names to interface names (got {data!r})")
    out: dict[str, str] = {}
    for nodes, iface in data.items():
        if not isinstance(iface, str) or not _IFNAME.match(iface):
            raise ConfigError(f"interfaces.{nodes}: {iface!r} is not an interface name")
        for node in expand_hostlist(str(nodes)):
            out[node] = iface
    return out


def from_dict(data: dict[str, Any], source: str = "<dict>") -> ClusterConfig:
    cfg = ClusterConfig(source=source)
    known = [f.name for f in dataclasses.fields(cfg) if f.name != "source"]
    for name, value in data.items():
        if name not in known:
            raise _unknown(name, known)
        if name == "interfaces":
            cfg.interfaces = _interfaces(value)
        elif name == "object_store_memory":
            cfg.object_store_memory = None if value is None else parse_size(value, name)
        elif name in ("ports", "timeouts"):
            _section(getattr(cfg, name), value, name)
        else:
            if not isinstance(value, str):
                raise ConfigError(f"{name}: must be a string (got {value!r})")
            setattr(cfg, name, value)
    return validate(cfg)


def validate(cfg: ClusterConfig) -> ClusterConfig:
    if cfg.object_store_memory is not None and cfg.object_store_memory < MIN_OBJECT_STORE:
        raise ConfigError(f"object_store_memory: Ray needs at least 75MiB (got {cfg.object_store_memory} bytes)")
    if cfg.dashboard_host != "cluster":
        try:
            ipaddress.IPv4Address(cfg.dashboard_host)
        except ValueError:
            raise ConfigError(f"dashboard_host: must be 'cluster' or an IPv4 address such as 0.0.0.0 "
                              f"(got {cfg.dashboard_host!r})") from None
    if not Path(cfg.temp_dir).is_absolute():
        raise ConfigError(f"temp_dir: must be an absolute path (got {cfg.temp_dir!r})")
    if not cfg.job_dir:
        raise ConfigError("job_dir: must not be empty")
    p = cfg.ports
    if not 1024 <= p.base < p.end <= 65535:
        raise ConfigError(f"ports: need 1024 <= base < end <= 65535 (got base={p.base}, end={p.end})")
    if p.block < 18 or p.block > p.end - p.base + 1:
        raise ConfigError(f"ports.block: must be between 18 and the size of the range (got {p.block})")
    for f in dataclasses.fields(cfg.timeouts):
        if getattr(cfg.timeouts, f.name) <= 0:
            raise ConfigError(f"timeouts.{f.name}: must be > 0 (got {getattr(cfg.timeouts, f.name)})")
    return cfg


def config_path(explicit: str | None = None) -> Path | None:
    """--config, else $RAYDIST_CLUSTER_CONFIG, else ./cluster/cluster.yaml if present, else None (defaults)."""
    if explicit:
        return Path(explicit)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    return DEFAULT_PATH if DEFAULT_PATH.is_file() else None


def load(explicit: str | None = None) -> ClusterConfig:
    path = config_path(explicit)
    if path is None:
        return ClusterConfig()
    data = read_yaml(path, what="settings (interfaces, ports, ...)", kind="cluster config")
    try:
        return from_dict(data, source=str(path))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
