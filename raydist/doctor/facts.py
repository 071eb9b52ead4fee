"""What one node knows about itself: its interface choice (raydist.slurm.netif), link state, name resolution,
free space, socket environment. Every contact with the machine goes through `Probes`, so tests can fake it."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from raydist.doctor.checks import NodeFacts, Space
from raydist.errors import RaydistError
from raydist.slurm import netif


@dataclasses.dataclass(frozen=True)
class Where:
    """Who this node is in the cluster: enough for netif to make the same choice bring-up made."""

    node: str
    head: str
    head_ip: str | None
    workers: tuple[str, ...]
    configured: str | None  # the cluster config's interface for this node, None: automatic
    peers: tuple[str, ...] = ()  # every other node's hostname
    storage_path: str | None = None


def _choose(where: Where) -> netif.Choice:
    if where.node == where.head and where.workers:
        return netif.head_choice(where.node, list(where.workers), where.configured)
    return netif.choose_here(where.node, configured=where.configured, head_ip=where.head_ip)


def _operstate(iface: str) -> str | None:
    # iproute2 first: in a network namespace that did not remount /sys, /sys/class/net is another namespace's.
    if shutil.which("ip"):
        r = subprocess.run(["ip", "-j", "link", "show", "dev", iface], capture_output=True, text=True, timeout=5)
        try:
            data = json.loads(r.stdout or "[]")
            if data:
                return str(data[0].get("operstate", "")) or None
        except json.JSONDecodeError:
            pass
    try:
        return Path(f"/sys/class/net/{iface}/operstate").read_text().strip().upper() or None
    except OSError:
        return None


def _speed_mbps(iface: str) -> int | None:
    """The negotiated speed the kernel reports; None where it does not (virtual links, unknown drivers)."""
    try:
        value = int(Path(f"/sys/class/net/{iface}/speed").read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value > 0 else None


def _space(path: str) -> Space:
    try:
        usage = shutil.disk_usage(path)
    except OSError as e:
        return Space(path, error=e.strerror or str(e))
    return Space(path, free=usage.free, total=usage.total)


@dataclasses.dataclass(frozen=True)
class Probes:
    choose: Callable[[Where], netif.Choice] = _choose
    operstate: Callable[[str], str | None] = _operstate
    speed_mbps: Callable[[str], int | None] = _speed_mbps
    resolve: Callable[[str], str] = netif.resolve
    space: Callable[[str], Space] = _space
    environ: Mapping[str, str] = dataclasses.field(default_factory=lambda: os.environ)
    temp_dir: Callable[[], str] = tempfile.gettempdir


def _resolved(resolve: Callable[[str], str], host: str) -> tuple[str | None, str | None]:
    try:
        return resolve(host), None
    except (RaydistError, OSError) as e:
        return None, str(e)


def gather(where: Where, probes: Probes = Probes()) -> NodeFacts:
    """This node's facts; a probe that fails becomes a fact ('cannot resolve ...'), never an exception."""
    try:
        choice: netif.Choice | None = probes.choose(where)
        error = None
    except (RaydistError, OSError) as e:
        choice, error = None, str(e)
    own, own_error = _resolved(probes.resolve, where.node)
    peers: dict[str, str | None] = {p: _resolved(probes.resolve, p)[0] for p in where.peers}
    return NodeFacts(
        node=where.node,
        iface=choice.iface if choice else None,
        ip=choice.ip if choice else None,
        why=choice.why if choice else None,
        choice_error=error,
        operstate=probes.operstate(choice.iface) if choice else None,
        speed_mbps=probes.speed_mbps(choice.iface) if choice else None,
        gloo_ifname=probes.environ.get("GLOO_SOCKET_IFNAME"),
        nccl_ifname=probes.environ.get("NCCL_SOCKET_IFNAME"),
        own_address=own,
        own_address_error=own_error,
        peer_addresses=peers,
        shm=probes.space("/dev/shm"),
        temp=probes.space(probes.temp_dir()),
        storage=probes.space(where.storage_path) if where.storage_path else None,
    )


def as_dict(facts: NodeFacts) -> dict:
    return dataclasses.asdict(facts)


def hostname(labels: Mapping[str, str], fallback: str | None = None) -> str:
    """A Ray node's hostname: raydist's node label where bring-up set one, else what Ray knows, else uname."""
    from raydist.cluster.dashboard_client import HOST_LABEL

    return labels.get(HOST_LABEL) or fallback or socket.gethostname()
