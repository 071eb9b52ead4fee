"""Verdicts of `raydist doctor`: facts in, rows out. Pure: no I/O, no Ray, no clocks."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Mapping

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
ALL = "all"  # the node column of rows about the cluster as a whole

GiB = 2**30
MiB = 2**20

# Free space below which a run is likely to die of it (fail) or may (warn). /dev/shm holds Ray's object store
# and NCCL's shared buffers; the temp dir Ray's spill files and logs; the storage path the checkpoints.
SHM_FAIL, SHM_WARN = 256 * MiB, 1 * GiB
DISK_FAIL, DISK_WARN = 1 * GiB, 10 * GiB

# Clock skew: a second confuses log timelines and the newest-by-mtime choices; half a minute breaks munge-style
# credentials and anything that compares timestamps across nodes.
SKEW_WARN_S, SKEW_FAIL_S = 1.0, 30.0

# Measured bandwidth against the link's bound: below a tenth is a wrong path (a 1 GbE management network instead
# of the fast one, a link that negotiated down); below a half is worth a look. Gloo on CPU rarely reaches line rate.
MIN_RATIO_DEFAULT, WARN_RATIO = 0.1, 0.5


@dataclasses.dataclass(frozen=True)
class Row:
    node: str
    check: str
    status: str  # OK, WARN, FAIL or SKIP
    value: str
    detail: str = ""

    @property
    def name(self) -> str:
        """How the exit line names this row."""
        return f"{self.node} {self.check}" if self.node != ALL else self.check


@dataclasses.dataclass(frozen=True)
class Space:
    path: str
    free: int | None = None
    total: int | None = None
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    """What one node reports about itself; plain values, so it travels through Ray and into --json."""

    node: str
    iface: str | None = None
    ip: str | None = None
    why: str | None = None
    choice_error: str | None = None
    operstate: str | None = None  # "UP", "DOWN", "UNKNOWN" (loopback-like links), None: not known
    speed_mbps: int | None = None
    gloo_ifname: str | None = None
    nccl_ifname: str | None = None
    own_address: str | None = None  # what this node's own hostname resolves to, here
    own_address_error: str | None = None
    peer_addresses: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    shm: Space | None = None
    temp: Space | None = None
    storage: Space | None = None

    @classmethod
    def from_dict(cls, d: Mapping) -> NodeFacts:
        spaces = {k: Space(**d[k]) if d.get(k) else None for k in ("shm", "temp", "storage")}
        return cls(**{**d, **spaces})


@dataclasses.dataclass(frozen=True)
class Probe:
    """One TCP connect from a node's chosen address to a peer's."""

    ok: bool
    ms: float | None = None
    error: str | None = None


# ---- formatting -----------------------------------------------------------------------------------------


def human_bytes(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", GiB), ("MiB", MiB), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def gbps(value: float) -> str:
    return f"{value:.3g} Gb/s"


# ---- per node -------------------------------------------------------------------------------------------


def check_interface(f: NodeFacts, ray_ip: str | None) -> Row:
    """The interface raydist's choice gives (netif), that it is up, and that Ray's node runs on its address."""
    if f.choice_error:
        return Row(f.node, "interface", FAIL, "-", f.choice_error)
    value = f"{f.iface} {f.ip}"
    if f.operstate not in (None, "UP", "UNKNOWN"):
        return Row(f.node, "interface", FAIL, value, f"{f.iface} is {f.operstate.lower()}")
    if ray_ip and ray_ip != f.ip:
        return Row(
            f.node,
            "interface",
            FAIL,
            value,
            f"Ray's node runs on {ray_ip}, not on the chosen {f.ip}: "
            f"traffic of this node takes another path than planned",
        )
    return Row(f.node, "interface", OK, value, f.why or "")


def check_link_speed(f: NodeFacts, expected_gbps: float | None) -> Row:
    if f.choice_error:
        return Row(f.node, "link speed", SKIP, "-", "no interface")
    if f.speed_mbps is None:
        return Row(f.node, "link speed", OK, "unknown", f"the kernel does not report {f.iface}'s speed")
    have = f.speed_mbps / 1000
    if expected_gbps and have < expected_gbps:
        return Row(
            f.node,
            "link speed",
            FAIL,
            gbps(have),
            f"{f.iface} negotiated {gbps(have)}, expected {gbps(expected_gbps)} (--link-gbps)",
        )
    return Row(f.node, "link speed", OK, gbps(have), "")


def check_socket_env(f: NodeFacts) -> Row:
    """GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME as this node's training workers inherit them."""
    if f.choice_error:
        return Row(f.node, "socket env", SKIP, "-", "no interface")
    value = f"GLOO_SOCKET_IFNAME={f.gloo_ifname or '(unset)'}"
    if f.gloo_ifname is None:
        trapped = _is_loopback(f.own_address)
        return Row(
            f.node,
            "socket env",
            FAIL if trapped else WARN,
            value,
            "unset: gloo binds to the address of the hostname"
            + (f", which is loopback {f.own_address} here" if trapped else f" ({f.own_address or '?'})"),
        )
    if f.gloo_ifname != f.iface:
        return Row(f.node, "socket env", FAIL, value, f"gloo uses {f.gloo_ifname}, not the chosen {f.iface}")
    if f.nccl_ifname is not None and not _nccl_matches(f.nccl_ifname, f.iface or ""):
        return Row(f.node, "socket env", FAIL, value, f"NCCL_SOCKET_IFNAME={f.nccl_ifname} does not select {f.iface}")
    return Row(f.node, "socket env", OK, value, f"NCCL_SOCKET_IFNAME={f.nccl_ifname}" if f.nccl_ifname else "")


def _nccl_matches(spec: str, iface: str) -> bool:
    """NCCL's syntax: '=name' exact, 'name' a prefix, '^...' exclusions (not checked), comma-separated."""
    if spec.startswith("^"):
        return True
    exact = spec.startswith("=")
    names = spec.lstrip("=").split(",")
    return any(iface == n if exact else iface.startswith(n) for n in names if n)


def _is_loopback(addr: str | None) -> bool:
    try:
        return addr is not None and ipaddress.IPv4Address(addr).is_loopback
    except ValueError:
        return False


def check_hostname(f: NodeFacts, chosen: Mapping[str, str]) -> Row:
    """The 127.0.1.1 trap (Debian maps a machine's own name to 127.0.1.1): anything that binds to 'my hostname'
    (gloo or NCCL without an interface, MASTER_ADDR=$(hostname), Ray without --node-ip-address) binds to loopback
    and its peers wait forever. Also that peers' names resolve to their chosen addresses here."""
    if f.own_address_error:
        return Row(f.node, "hostname", WARN, "-", f"{f.node} does not resolve here: {f.own_address_error}")
    value = f"{f.node} -> {f.own_address}"
    if _is_loopback(f.own_address):
        fix = f"; map it to {f.ip} in /etc/hosts" if f.ip else ""
        return Row(
            f.node,
            "hostname",
            FAIL,
            value,
            f"resolves to loopback on {f.node}: whatever binds to the hostname is unreachable from other nodes{fix}",
        )
    wrong = [
        f"{p} -> {a or 'unresolved'} (chosen {chosen[p]})"
        for p, a in sorted(f.peer_addresses.items())
        if p in chosen and a != chosen[p]
    ]
    if f.ip and f.own_address != f.ip:
        wrong.insert(0, f"{f.node} -> {f.own_address} (chosen {f.ip})")
    if wrong:
        return Row(
            f.node, "hostname", WARN, value, "names resolve elsewhere than the chosen addresses: " + "; ".join(wrong)
        )
    return Row(f.node, "hostname", OK, value, f"{len(f.peer_addresses)} peer name(s) agree")


def check_space(node: str, label: str, space: Space | None, fail_below: int, warn_below: int) -> Row | None:
    if space is None:
        return None
    if space.error:
        return Row(node, label, FAIL, "-", f"{space.path}: {space.error}")
    free, total = space.free or 0, space.total or 0
    value = f"{human_bytes(free)} free"
    detail = f"of {human_bytes(total)} at {space.path}"
    if free < fail_below:
        return Row(node, label, FAIL, value, f"{detail}; below {human_bytes(fail_below)}")
    if free < warn_below:
        return Row(node, label, WARN, value, f"{detail}; below {human_bytes(warn_below)}")
    return Row(node, label, OK, value, detail)


def check_clock(
    node: str,
    offset_s: float | None,
    uncertainty_s: float | None,
    warn_s: float = SKEW_WARN_S,
    fail_s: float = SKEW_FAIL_S,
) -> Row:
    """Offset of the node's wall clock from the driver's; the part of it the round trip cannot explain."""
    if offset_s is None:
        return Row(node, "clock skew", SKIP, "-", "no answer")
    u = uncertainty_s or 0.0
    skew = max(0.0, abs(offset_s) - u)
    value = f"{offset_s * 1000:+.1f} ms"
    detail = f"±{u * 1000:.1f} ms (round trip / 2)"
    if skew >= fail_s:
        return Row(node, "clock skew", FAIL, value, f"{detail}; at least {skew:.1f} s off: sync the clock (NTP)")
    if skew >= warn_s:
        return Row(node, "clock skew", WARN, value, f"{detail}; at least {skew:.1f} s off")
    return Row(node, "clock skew", OK, value, detail)


def best_offset(samples: Iterable[tuple[float, float, float]]) -> tuple[float, float] | None:
    """(sent, remote clock, received) triples -> (offset, uncertainty) of the one with the shortest round trip,
    as NTP does: the remote clock was read somewhere inside [sent, received]."""
    best = min(samples, key=lambda s: s[2] - s[0], default=None)
    if best is None:
        return None
    sent, remote, received = best
    return remote - (sent + received) / 2, (received - sent) / 2


def check_reachability(node: str, results: Mapping[str, Probe] | None) -> Row:
    """This node's row of the reachability matrix: a TCP connect from its chosen address to every peer's."""
    if results is None:
        return Row(node, "reachability", SKIP, "-", "no answer")
    if not results:
        return Row(node, "reachability", OK, "no peers", "")
    bad = {p: r for p, r in sorted(results.items()) if not r.ok}
    reached = len(results) - len(bad)
    value = f"{reached}/{len(results)} peers"
    if bad:
        return Row(node, "reachability", FAIL, value, "; ".join(f"{p}: {r.error}" for p, r in bad.items()))
    slowest = max(results.items(), key=lambda kv: kv[1].ms or 0.0)
    return Row(node, "reachability", OK, value, f"slowest connect {slowest[1].ms:.1f} ms ({slowest[0]})")


def unreachable_from(matrix: Mapping[str, Mapping[str, Probe]]) -> dict[str, list[str]]:
    """peer -> the nodes that could not reach it: a peer nobody reaches is the one whose link is broken."""
    out: dict[str, list[str]] = {}
    for src, row in matrix.items():
        for dst, probe in row.items():
            if not probe.ok:
                out.setdefault(dst, []).append(src)
    return out


# ---- bandwidth ------------------------------------------------------------------------------------------


def link_bound(speeds_mbps: Iterable[int | None], override_gbps: float | None) -> tuple[float | None, str]:
    """The bound a figure is measured against: --link-gbps, else the slowest link the kernel reports."""
    if override_gbps:
        return override_gbps, "--link-gbps"
    speeds = list(speeds_mbps)
    known = [s for s in speeds if s]
    if not known or len(known) < len(speeds):  # one unknown link may be the slow one
        return None, "unknown"
    return min(known) / 1000, "link speed"


@dataclasses.dataclass(frozen=True)
class BandwidthFigure:
    """One bandwidth measurement (or why there is none) and the bound it is judged against."""

    node: str
    """The row's node: the sender of a point-to-point figure, ALL for the all-reduce."""
    check: str
    """The row's check, e.g. "p2p -> n2" or "all-reduce"."""
    measured_gbps: float | None
    """The measured figure in Gbit/s; None when it was not measured (the row is skipped, or fails on `error`)."""
    bound_gbps: float | None
    """The link's bound in Gbit/s (link_bound); None or 0 when unknown: the figure is then only reported."""
    bound_source: str
    """Where the bound comes from ("--link-gbps", "link speed"), shown next to the ratio."""
    detail: str = ""
    """How it was measured (backend, pattern, sizes), first in the row's detail."""
    error: str | None = None
    """Why the measurement failed: the row fails with it."""


def check_bandwidth(figure: BandwidthFigure, min_ratio: float = MIN_RATIO_DEFAULT) -> Row:
    """A figure against its bound. Never a failure for lack of a bound: then it is only reported."""
    node, check, measured_gbps, bound_gbps = figure.node, figure.check, figure.measured_gbps, figure.bound_gbps
    detail = figure.detail
    if figure.error:
        return Row(node, check, FAIL, "-", figure.error)
    if measured_gbps is None:
        return Row(node, check, SKIP, "-", detail)
    value = gbps(measured_gbps)
    if not bound_gbps:
        return Row(node, check, OK, value, "; ".join(x for x in (detail, "no bound known (--link-gbps)") if x))
    ratio = measured_gbps / bound_gbps
    text = "; ".join(x for x in (detail, f"{ratio:.2f} of {gbps(bound_gbps)} ({figure.bound_source})") if x)
    if ratio < min_ratio:
        return Row(node, check, FAIL, value, f"{text}; below {min_ratio:g}")
    if ratio < max(WARN_RATIO, min_ratio):
        return Row(node, check, WARN, value, text)
    return Row(node, check, OK, value, text)


# ---- the verdict ----------------------------------------------------------------------------------------


def failing(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if r.status == FAIL]


def exit_line(rows: Iterable[Row]) -> str | None:
    """The one line naming every failing row, or None when nothing failed."""
    bad = failing(rows)
    if not bad:
        return None
    return f"doctor: {len(bad)} check(s) failed: " + ", ".join(r.name for r in bad)
