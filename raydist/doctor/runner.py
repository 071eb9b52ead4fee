"""The driver of `raydist doctor` against a running Ray cluster: one agent per alive node, then the phases
(facts, clocks, reachability matrix, bandwidth), each bounded by a timeout so that a dead or cut-off node is
named, never waited for."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

from raydist.doctor import checks
from raydist.doctor.bandwidth import algo_bandwidth_gbps, bus_bandwidth_gbps
from raydist.doctor.checks import ALL, FAIL, Probe, Row
from raydist.doctor.facts import Where, hostname
from raydist.private_api import HEAD_NODE_RESOURCE

MiB = 2**20


@dataclasses.dataclass(frozen=True)
class Options:
    nbytes: int = 64 * MiB
    iters: int = 5
    backend: str = "auto"  # auto: NCCL when every node has a GPU, else gloo
    link_gbps: float | None = None
    min_ratio: float = checks.MIN_RATIO_DEFAULT
    timeout_s: float = 30.0
    connect_timeout_s: float = 2.0
    bandwidth: bool = True
    storage_path: str | None = None
    expected_nodes: tuple[str, ...] = ()  # the job's node list, when known: a node Ray lacks is named
    head: str | None = None
    head_ip: str | None = None
    interfaces: Mapping[str, str] = dataclasses.field(default_factory=dict)  # the cluster config's node -> iface


@dataclasses.dataclass(frozen=True)
class RayNode:
    node_id: str
    hostname: str
    ip: str
    alive: bool
    is_head: bool
    gpus: float


@dataclasses.dataclass(frozen=True)
class _Cluster:
    """What every phase after the agents' start works on."""

    alive: tuple[RayNode, ...]
    """The alive nodes in rank order: head first, then the job's node order (_order)."""
    agents: Mapping[str, Any]
    """hostname -> that node's NodeDoctor actor."""
    head_name: str
    """The head's hostname (--head, else Ray's head node)."""
    head_ip: str
    """The head's address (--head-ip, else Ray's head node's)."""
    backend: str
    """The torch.distributed backend of the bandwidth phase: "nccl" or "gloo"."""
    opts: Options
    """The command's options."""
    log: Callable[[str], None]
    """Where progress lines go."""

    @property
    def names(self) -> list[str]:
        """The alive nodes' hostnames, in rank order."""
        return [n.hostname for n in self.alive]


@dataclasses.dataclass
class Report:
    rows: list[Row] = dataclasses.field(default_factory=list)
    facts: dict[str, dict] = dataclasses.field(default_factory=dict)
    matrix: dict[str, dict[str, dict]] = dataclasses.field(default_factory=dict)
    bandwidth: dict[str, Any] = dataclasses.field(default_factory=dict)


def ray_nodes() -> list[RayNode]:
    import ray

    out = []
    for n in ray.nodes():
        res = n.get("Resources") or {}
        out.append(
            RayNode(
                node_id=n["NodeID"],
                hostname=hostname(n.get("Labels") or {}, n.get("NodeManagerHostname")),
                ip=n.get("NodeManagerAddress", "?"),
                alive=bool(n.get("Alive")),
                is_head=HEAD_NODE_RESOURCE in res or bool(n.get("IsHeadNode")),
                gpus=float(res.get("GPU", 0.0)),
            )
        )
    return out


def one_line(e: BaseException) -> str:
    """A Ray error (often a whole remote traceback) as its last meaningful line."""
    cause = getattr(e, "cause", None) or e
    lines = [ln.strip() for ln in str(cause).splitlines() if ln.strip()]
    text = lines[-1] if lines else type(cause).__name__
    return text[:300]


def _collect(refs: Mapping[str, Any], timeout: float, what: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Results of one phase by node, and for each node that failed or did not answer in time, why."""
    import ray

    if not refs:
        return {}, {}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
    ready_set = set(ready)
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for node, ref in refs.items():
        if ref not in ready_set:
            errors[node] = f"no answer to {what} within {timeout:g}s"
            continue
        try:
            results[node] = ray.get(ref)
        except Exception as e:  # the agent raised or died: its message names what went wrong
            errors[node] = f"{what} failed: {one_line(e)}"
    return results, errors


def _order(alive: list[RayNode], expected: tuple[str, ...]) -> list[RayNode]:
    """Head first (rank 0 and the store live there), then the job's node order, then Ray's."""
    pos = {h: i for i, h in enumerate(expected)}
    return sorted(alive, key=lambda n: (not n.is_head, pos.get(n.hostname, len(pos)), n.hostname))


def _node_rows(nodes: list[RayNode], opts: Options) -> list[Row]:
    rows = []
    for n in nodes:
        if n.alive:
            rows.append(Row(n.hostname, "ray node", checks.OK, n.ip, "alive" + (", head" if n.is_head else "")))
        else:
            rows.append(Row(n.hostname, "ray node", FAIL, n.ip, "Ray lists it dead"))
    known = {n.hostname for n in nodes}
    rows += [
        Row(h, "ray node", FAIL, "-", "in the job's node list but not in the Ray cluster")
        for h in opts.expected_nodes
        if h not in known
    ]
    return rows


def _backend(requested: str, alive: list[RayNode]) -> str:
    if requested != "auto":
        return requested
    return "nccl" if alive and all(n.gpus >= 1 for n in alive) else "gloo"


def _start_agents(alive: list[RayNode], backend: str) -> dict[str, Any]:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raydist.doctor.agent import NodeDoctor

    remote = ray.remote(NodeDoctor)
    return {
        n.hostname: remote.options(
            num_cpus=0,
            num_gpus=1 if backend == "nccl" else 0,
            max_restarts=0,
            max_task_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False),
        ).remote()
        for n in alive
    }


def _clock(agent, timeout: float) -> tuple[float, float] | None:
    import ray

    samples = []
    try:
        for _ in range(3):
            sent = time.time()
            remote = ray.get(agent.now.remote(), timeout=timeout)
            samples.append((sent, remote, time.time()))
    except Exception:  # no answer: the clock row says so
        return None
    return checks.best_offset(samples)


def run(opts: Options, log: Callable[[str], None] = lambda _: None) -> Report:
    """Everything against the Ray cluster this process is connected to (ray.init already done)."""
    import ray

    report = Report()
    nodes = ray_nodes()
    report.rows += _node_rows(nodes, opts)
    alive = _order([n for n in nodes if n.alive], opts.expected_nodes)
    if not alive:
        return report
    head = next((n for n in alive if n.is_head), alive[0])
    head_name = opts.head or head.hostname
    head_ip = opts.head_ip or head.ip
    backend = _backend(opts.backend, alive)
    agents = _start_agents(alive, backend)
    try:
        _diagnose(report, _Cluster(tuple(alive), agents, head_name, head_ip, backend, opts, log))
    finally:
        for a in agents.values():
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already dead: nothing to stop
                pass
    return report


def _diagnose(report: Report, cluster: _Cluster) -> None:
    facts, errors = _gather_facts(report, cluster)
    offsets = {h: _clock(cluster.agents[h], min(cluster.opts.timeout_s, 5.0)) for h in facts}
    targets, matrix = _probe_pairs(report, cluster, facts, errors)
    unreached = checks.unreachable_from(matrix)
    chosen = {h: f.ip for h, f in facts.items() if f.ip}
    by_ip = {n.hostname: n.ip for n in cluster.alive}
    for h in cluster.names:
        if h in errors and h not in facts:
            detail = (
                f"{errors[h]}: the node does not respond through Ray (link down, node overloaded or Ray's node dying)"
            )
            report.rows.append(Row(h, "agent", FAIL, "-", detail))
            continue
        report.rows += _fact_rows(h, facts[h], by_ip.get(h), chosen, offsets.get(h), cluster.opts)
        report.rows.append(_reachability_row(h, errors, targets, matrix, unreached))
    cut_off = {h for h, row in matrix.items() if any(not p.ok for p in row.values())}
    bad = sorted(set(errors) | (set(cluster.names) - set(targets)) | cut_off)
    _bandwidth(report, cluster, facts, targets, bad)


def _gather_facts(report: Report, cluster: _Cluster) -> tuple[dict[str, checks.NodeFacts], dict[str, str]]:
    names, opts = cluster.names, cluster.opts
    cluster.log(f"doctor: {len(cluster.alive)} node(s); gathering facts")
    refs = {}
    for n in cluster.alive:
        where = Where(
            node=n.hostname,
            head=cluster.head_name,
            head_ip=cluster.head_ip,
            workers=tuple(h for h in names if h != cluster.head_name),
            configured=opts.interfaces.get(n.hostname),
            peers=tuple(h for h in names if h != n.hostname),
            storage_path=opts.storage_path,
        )
        refs[n.hostname] = cluster.agents[n.hostname].facts.remote(where)
    raw, errors = _collect(refs, opts.timeout_s, "the facts request (agent start included)")
    report.facts = raw
    return {h: checks.NodeFacts.from_dict(d) for h, d in raw.items()}, errors


def _probe_pairs(report: Report, cluster: _Cluster, facts: dict, errors: dict[str, str]) -> tuple[dict, dict]:
    """Every node listens, every node connects to every other: (listening address per node, the probe matrix)."""
    agents, opts, t = cluster.agents, cluster.opts, cluster.opts.timeout_s
    cluster.log("doctor: probing every pair of nodes")
    listeners, listen_errors = _collect({h: agents[h].listen.remote() for h in facts}, t, "opening a listener")
    errors.update(listen_errors)
    targets = {h: addr for h, addr in listeners.items() if addr}
    probe_refs = {
        h: agents[h].probe.remote({p: tuple(a) for p, a in targets.items() if p != h}, opts.connect_timeout_s)
        for h in targets
    }
    probed, probe_errors = _collect(probe_refs, opts.connect_timeout_s + t, "the reachability probe")
    errors.update(probe_errors)
    matrix = {src: {dst: Probe(**p) for dst, p in row.items()} for src, row in probed.items()}
    report.matrix = {src: {dst: dataclasses.asdict(p) for dst, p in row.items()} for src, row in matrix.items()}
    return targets, matrix


def _fact_rows(h: str, f: checks.NodeFacts, ray_ip, chosen: dict, offset, opts) -> list[Row]:
    """A node's rows from its own facts: interface, link, socket variables, name, space, clock."""
    rows = [
        checks.check_interface(f, ray_ip),
        checks.check_link_speed(f, opts.link_gbps),
        checks.check_socket_env(f),
        checks.check_hostname(f, chosen),
    ]
    spaces = (
        checks.check_space(h, "/dev/shm", f.shm, checks.SHM_FAIL, checks.SHM_WARN),
        checks.check_space(h, "temp dir", f.temp, checks.DISK_FAIL, checks.DISK_WARN),
        checks.check_space(h, "storage", f.storage, checks.DISK_FAIL, checks.DISK_WARN),
    )
    rows += [r for r in spaces if r is not None]
    rows.append(checks.check_clock(h, offset[0] if offset else None, offset[1] if offset else None))
    return rows


def _reachability_row(h: str, errors: dict, targets: dict, matrix: dict, unreached: dict) -> Row:
    if h in errors:
        return Row(h, "reachability", FAIL, "-", errors[h])
    if h not in targets:
        return Row(h, "reachability", checks.SKIP, "-", "no interface to listen on")
    row = checks.check_reachability(h, matrix.get(h))
    if h in unreached and len(unreached[h]) == len(matrix) - 1 and len(matrix) > 1:
        detail = "; ".join(x for x in (row.detail if row.status == FAIL else "", f"no peer reaches {h}") if x)
        row = dataclasses.replace(row, status=FAIL, detail=detail)
    return row


def _bandwidth(
    report: Report, cluster: _Cluster, facts: dict[str, checks.NodeFacts], targets: dict[str, Any], bad: list[str]
) -> None:
    alive, agents, backend, opts, log = cluster.alive, cluster.agents, cluster.backend, cluster.opts, cluster.log

    def skip(why: str) -> None:
        report.rows.append(Row(ALL, "bandwidth", checks.SKIP, "-", why))

    if not opts.bandwidth:
        return skip("--no-bandwidth")
    if len(alive) < 2:
        return skip("one node: nothing to measure between")
    if bad:
        return skip(f"not with {', '.join(bad)} unreachable or silent")
    ranked = [n.hostname for n in alive]
    world, t = len(ranked), opts.timeout_s
    log(f"doctor: {backend} group of {world}; point-to-point and all-reduce, {opts.nbytes} bytes x {opts.iters}")
    try:
        port = _one(agents[ranked[0]].open_store.remote(world, t), t, "opening the TCP store")
    except _PhaseError as e:
        report.rows.append(Row(ranked[0], "bandwidth group", FAIL, "-", str(e)))
        return
    store_ip = targets[ranked[0]][0]
    joined, errors = _collect(
        {h: agents[h].join.remote(r, world, store_ip, port, backend, t) for r, h in enumerate(ranked)},
        t + 5,
        f"joining the {backend} group",
    )
    if errors:
        report.rows += [Row(h, "bandwidth group", FAIL, "-", e) for h, e in errors.items()]
        return
    speeds = {h: facts[h].speed_mbps for h in ranked}
    p2p, errors = _collect(
        {h: agents[h].p2p.remote(opts.nbytes, opts.iters) for h in ranked}, t, "the point-to-point test"
    )
    report.bandwidth["p2p"] = p2p
    for r, h in enumerate(ranked):
        nxt = ranked[(r + 1) % world]
        bound, source = checks.link_bound([speeds[h], speeds[nxt]], opts.link_gbps)
        got = p2p.get(h)
        report.rows.append(
            checks.check_bandwidth(
                checks.BandwidthFigure(
                    h,
                    f"p2p -> {nxt}",
                    algo_bandwidth_gbps(got["nbytes"], got["seconds"]) if got else None,
                    bound,
                    source,
                    detail=f"{backend}, ring, each node sending and receiving at once",
                    error=errors.get(h),
                ),
                opts.min_ratio,
            )
        )
    if errors:
        return
    done, errors = _collect(
        {h: agents[h].allreduce.remote(opts.nbytes, opts.iters) for h in ranked}, t, "the all-reduce test"
    )
    report.bandwidth["allreduce"] = done
    bound, source = checks.link_bound(speeds.values(), opts.link_gbps)
    first = done.get(ranked[0])
    bus = bus_bandwidth_gbps(first["nbytes"], first["seconds"], world) if first else None
    if first:
        report.bandwidth["allreduce_bus_gbps"] = bus
    detail = (
        f"bus bandwidth, {backend}, {world} ranks, {first['nbytes'] / MiB:.3g} MiB x {first['iters']}, "
        f"{first['seconds'] * 1000:.2f} ms each"
        if first
        else ""
    )
    error = "; ".join(f"{h}: {e}" for h, e in errors.items()) or None
    figure = checks.BandwidthFigure(ALL, "all-reduce", bus, bound, source, detail, error)
    report.rows.append(checks.check_bandwidth(figure, opts.min_ratio))


class _PhaseError(Exception):
    pass


def _one(ref, timeout: float, what: str):
    import ray

    try:
        return ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise _PhaseError(f"no answer to {what} within {timeout:g}s") from None
    except Exception as e:
        raise _PhaseError(f"{what} failed: {one_line(e)}") from None
