"""Which network interface and address a node's Ray uses: the one a cluster config names, else the route to the head."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import shutil
import socket
import subprocess
from collections.abc import Iterable, Mapping

from raydist.errors import RaydistError


class NetworkError(RaydistError):
    """A node cannot use the interface it was given, or cannot reach the head: caught at bring-up, not in training."""


@dataclasses.dataclass(frozen=True)
class Route:
    iface: str
    network: ipaddress.IPv4Network
    metric: int = 0


@dataclasses.dataclass(frozen=True)
class Choice:
    """The interface a node's Ray binds to, its IPv4 address there, and why it was picked."""

    iface: str
    ip: str
    why: str  # "cluster config" or "route to <head>"


# ---- pure parsing and choice ---------------------------------------------------------------------------


def parse_proc_net_route(text: str) -> list[Route]:
    """/proc/net/route (the kernel's IPv4 main table, addresses in little-endian hex) -> routes."""
    routes = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 8 or not int(cols[3], 16) & 0x1:  # RTF_UP
            continue
        dest = socket.inet_ntoa(int(cols[1], 16).to_bytes(4, "little"))
        mask = socket.inet_ntoa(int(cols[7], 16).to_bytes(4, "little"))
        routes.append(Route(cols[0], ipaddress.IPv4Network(f"{dest}/{mask}", strict=False), int(cols[6])))
    return routes


def route_lookup(routes: Iterable[Route], ip: str) -> str | None:
    """The interface the longest matching prefix (then the lowest metric) sends `ip` through."""
    addr = ipaddress.IPv4Address(ip)
    matches = [r for r in routes if addr in r.network]
    if not matches:
        return None
    return min(matches, key=lambda r: (-r.network.prefixlen, r.metric)).iface


def parse_ip_addr_json(data: list[dict]) -> dict[str, list[ipaddress.IPv4Interface]]:
    """`ip -j addr` -> interface name -> its IPv4 addresses (with prefix), in the kernel's order."""
    out: dict[str, list[ipaddress.IPv4Interface]] = {}
    for link in data:
        addrs = out.setdefault(link["ifname"], [])
        for a in link.get("addr_info", []):
            if a.get("family") == "inet":
                addrs.append(ipaddress.IPv4Interface(f"{a['local']}/{a.get('prefixlen', 32)}"))
    return out


def parse_route_get_json(data: list[dict]) -> tuple[str, str | None] | None:
    """`ip -j route get ADDR` -> (device, preferred source address), None when unroutable."""
    if not data or "dev" not in data[0]:
        return None
    return data[0]["dev"], data[0].get("prefsrc")


def _pick_address(addrs: list[ipaddress.IPv4Interface], toward: str | None) -> ipaddress.IPv4Interface:
    if toward:
        target = ipaddress.IPv4Address(toward)
        same_subnet = [a for a in addrs if target in a.network]
        if same_subnet:
            return same_subnet[0]
    return addrs[0]


def _names(addrs: Mapping[str, list]) -> str:
    return ", ".join(sorted(addrs)) or "none"


def choose(
    node: str,
    addrs: Mapping[str, list[ipaddress.IPv4Interface]],
    *,
    configured: str | None = None,
    head_ip: str | None = None,
    route: tuple[str, str | None] | None = None,
) -> Choice:
    """Decide a node's interface and address.

    `configured` is the cluster config's interface for this node (None: automatic). Automatic means the interface
    whose address carries `route` (the kernel's answer for the way to `head_ip`); where that is the loopback
    (this node is the head), the interface that holds `head_ip`.
    """
    if configured:
        if configured not in addrs:
            raise NetworkError(
                f"{node}: interface {configured} from the cluster config does not exist on {node} "
                f"(it has: {_names(addrs)})"
            )
        if not addrs[configured]:
            raise NetworkError(f"{node}: interface {configured} from the cluster config has no IPv4 address")
        return Choice(configured, str(_pick_address(addrs[configured], head_ip).ip), "cluster config")
    if head_ip is None:
        raise NetworkError(f"{node}: no interface configured and no head address to route to")
    if route is None:
        raise NetworkError(f"{node}: no route to the head's address {head_ip} (interfaces: {_names(addrs)})")
    dev, src = route
    if dev == "lo" or ipaddress.IPv4Address(head_ip).is_loopback:
        holders = [name for name, a in addrs.items() if any(str(x.ip) == head_ip for x in a)]
        if not holders or ipaddress.IPv4Address(head_ip).is_loopback:
            raise NetworkError(
                f"{node}: the head address {head_ip} is a loopback address; name the head's "
                f"interface in the cluster config"
            )
        return Choice(holders[0], head_ip, "holds the head address")
    if dev not in addrs or not addrs[dev]:
        raise NetworkError(f"{node}: the route to the head {head_ip} leaves through {dev}, which has no IPv4 address")
    ip = src if src and any(str(a.ip) == src for a in addrs[dev]) else str(_pick_address(addrs[dev], head_ip).ip)
    return Choice(dev, ip, f"route to {head_ip}")


# ---- probing this machine ------------------------------------------------------------------------------


def _ip_json(*args: str) -> list[dict] | None:
    if not shutil.which("ip"):
        return None
    r = subprocess.run(["ip", "-j", *args], capture_output=True, text=True)
    if r.returncode != 0:
        return [] if "unreachable" in r.stderr.lower() else None
    try:
        return json.loads(r.stdout or "[]")
    except json.JSONDecodeError:  # an iproute2 too old for -j
        return None


def local_addresses() -> dict[str, list[ipaddress.IPv4Interface]]:
    data = _ip_json("addr", "show")
    if data is not None:
        return parse_ip_addr_json(data)
    import psutil  # Ray depends on it; only needed where iproute2 is missing

    out: dict[str, list[ipaddress.IPv4Interface]] = {}
    for name, entries in psutil.net_if_addrs().items():
        out[name] = [ipaddress.IPv4Interface(f"{e.address}/{e.netmask}") for e in entries if e.family == socket.AF_INET]
    return out


def route_to(ip: str) -> tuple[str, str | None] | None:
    """The kernel's route toward `ip` (policy rules included) via iproute2, else the main table."""
    data = _ip_json("route", "get", ip)
    if data is not None:
        return parse_route_get_json(data)
    with open("/proc/net/route") as f:
        dev = route_lookup(parse_proc_net_route(f.read()), ip)
    return (dev, None) if dev else None


def resolve(host: str) -> str:
    """A host name's IPv4 address, as this node resolves it (/etc/hosts, DNS)."""
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror as e:
        raise NetworkError(f"cannot resolve node name {host}: {e.strerror}") from None


def choose_here(node: str, *, configured: str | None, head_ip: str | None) -> Choice:
    return choose(
        node,
        local_addresses(),
        configured=configured,
        head_ip=head_ip,
        route=route_to(head_ip) if head_ip and not configured else None,
    )


def head_choice(head: str, workers: Iterable[str], configured: str | None) -> Choice:
    """The head's own interface: as configured, else the one its traffic to the first worker leaves through
    (a hostname that resolves to 127.0.1.1, as Debian installs do, must not make the head bind to loopback)."""
    addrs = local_addresses()
    if configured:
        return choose(head, addrs, configured=configured)
    for worker in workers:
        target = resolve(worker)
        if not ipaddress.IPv4Address(target).is_loopback:
            route = route_to(target)
            if route is None:
                raise NetworkError(f"{head}: no route to worker {worker} ({target}) (interfaces: {_names(addrs)})")
            c = choose(head, addrs, head_ip=target, route=route)
            return Choice(c.iface, c.ip, f"route to {worker}")
    own = resolve(head)
    return choose(head, addrs, head_ip=own, route=route_to(own))


def check_reachable(node: str, choice: Choice, host: str, ip: str, port: int, timeout: float) -> None:
    """One TCP connect from the chosen address to the head's GCS port; a refusal means the head is not up yet."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.bind((choice.ip, 0))
        s.connect((ip, port))
