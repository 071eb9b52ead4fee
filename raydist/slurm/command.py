"""CLI: `raydist slurm plan|node|wait|down|iface` (called by cluster/ray_up.slurm), `raydist status`, `raydist env`."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from raydist.errors import RaydistError, UsageError


def _say(msg: str) -> None:
    print(f"raydist: {msg}", flush=True)


def _load(args):
    from raydist.slurm import settings

    return settings.load(args.config)


def _alloc():
    from raydist.slurm.nodes import Allocation

    return Allocation.from_env()


def _plan(args) -> int:
    from raydist.slurm.bringup import make_plan

    cfg, alloc = _load(args), _alloc()
    plan = make_plan(cfg, alloc, log=_say)
    _say(
        f"job {plan.job_id}: {len(plan.nodes)} node(s) {','.join(plan.nodes)}; head {plan.head} on "
        f"{plan.head_iface} {plan.head_ip} ({plan.head_why}); ports {plan.block_start}-"
        f"{plan.block_start + plan.block_size - 1}; config {plan.config_source}"
    )
    return 0


def _node(args) -> int:
    from raydist.slurm.bringup import run_node

    return run_node(_load(args), _alloc(), log=_say)


def _wait(args) -> int:
    from raydist.slurm.jobdir import JobDir
    from raydist.slurm.readiness import Wait, wait_ready

    cfg, alloc = _load(args), _alloc()
    jd = JobDir(cfg.job_path(alloc.job_id))
    timeout = args.timeout if args.timeout is not None else cfg.timeouts.ready
    conn = wait_ready(jd, Wait(timeout, step_pid=args.step_pid, user=os.environ.get("USER", alloc.user), log=_say))
    _say(f"Ray cluster ready; connection file {jd.connection}:")
    print(jd.connection.read_text(), end="", flush=True)
    _say(
        f'from the login node: eval "$(raydist env --job {conn.job_id})" && '
        f"ray job submit --working-dir . -- python jobs/sync.py"
    )
    return 0


def _down(args) -> int:
    from raydist.slurm import teardown
    from raydist.slurm.jobdir import JobDir

    cfg, alloc = _load(args), _alloc()
    if args.step_pid and teardown._alive(args.step_pid):
        steps = teardown.signal_steps(alloc.job_id)
        if not teardown.wait_exited(args.step_pid, cfg.timeouts.teardown + 5):
            _say(
                f"job {alloc.job_id}: Ray step {','.join(steps) or '?'} still running after "
                f"{cfg.timeouts.teardown + 5:.0f}s; SLURM will kill it"
            )
    JobDir(cfg.job_path(alloc.job_id)).remove()
    _say(f"job {alloc.job_id}: Ray stopped; removed {cfg.job_path(alloc.job_id)} (token, connection file)")
    return 0


def _stop(args) -> int:
    """Interactive mode's answer to the time-limit warning: every run checkpoints and stops."""
    from raydist.cluster import connection
    from raydist.slurm import batch, interrupt
    from raydist.slurm.jobdir import JobDir

    cfg, alloc = _load(args), _alloc()
    jd = JobDir(cfg.job_path(alloc.job_id))
    if not jd.connection.exists():
        return 0  # the cluster never came up: nothing runs on it
    reason = "SLURM time limit"
    waited = interrupt.stop_cluster_runs(
        connection.read(jd.connection), reason, batch.time_left(alloc.job_id), cfg.timeouts.stop, log=_say
    )
    _say(
        f"job {alloc.job_id}: runs stopped after {waited:.1f} s; resume each with the command named above "
        f"once a cluster is up again"
    )
    return 0


def _run(args) -> int:
    """Batch mode: the command is the job's driver; the warning stops it at a checkpoint; maybe requeue."""
    from raydist.cluster import connection
    from raydist.slurm import batch, interrupt
    from raydist.slurm.jobdir import JobDir

    command = args.command[1:] if args.command[:1] == ["--"] else args.command  # later "--" are the command's
    if not command:
        raise UsageError("raydist slurm run: give the command to run, e.g. -- python jobs/sync.py")
    cfg, alloc = _load(args), _alloc()
    jd = JobDir(cfg.job_path(alloc.job_id))
    conn = connection.read(jd.connection)
    restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    _say(f"job {alloc.job_id}: batch mode, run {restarts + 1}: {interrupt.quoted(command)}")

    def on_warning(kind: str, sup: batch.Supervisor) -> None:
        reason = "SLURM time limit"
        try:
            interrupt.stop_cluster_runs(
                conn, reason, batch.time_left(alloc.job_id), cfg.timeouts.stop, still_running=sup.running, log=_say
            )
        except Exception as e:  # the command is still ended (then by signal); say why it got no stop request
            _say(f"{reason}: could not ask the runs to stop: {str(e).splitlines()[0] if str(e) else type(e).__name__}")

    # Unbuffered: the job's output file shows progress as it happens (`tail -f raydist-<id>.out`).
    env = {**os.environ, **interrupt.ray_env(conn), "PYTHONUNBUFFERED": "1"}
    sup = batch.Supervisor(command, env, jd.path / "result.json", on_warning, stop_wait_s=5.0, log=_say)
    outcome = sup.run()
    decision = batch.decide(outcome, restarts, cfg.requeue)
    _say(
        f"job {alloc.job_id}: command exited {outcome.exit_code}"
        f"{f' (run {outcome.status})' if outcome.status else ''}; {decision.why}"
    )
    if decision.requeue:
        _down(args)  # Ray down first: the requeued job brings up a fresh cluster
        batch.requeue(alloc.job_id)
    return outcome.exit_code


def _iface(args) -> int:
    from raydist.slurm import netif

    cfg = _load(args)
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    head_ip = netif.resolve(args.head) if args.head else None
    if args.head and node == args.head:
        choice = netif.head_choice(node, [], cfg.interface_for(node))
    else:
        choice = netif.choose_here(node, configured=cfg.interface_for(node), head_ip=head_ip)
    print(f"{node} {choice.iface} {choice.ip} ({choice.why})", flush=True)
    return 0


def find_connection(args):
    """(path, Connection) of the connection file the command's arguments name (connection.find: --connection,
    $RAYDIST_CONNECTION, --job, else the newest job under the cluster config's job_dir); `raydist top` reads it too."""
    from raydist.cluster import connection

    cfg = _load(args)
    path = connection.find(Path(os.path.expanduser(cfg.job_dir)), args.job, args.connection)
    return path, connection.read(path)


def _env(args) -> int:
    path, conn = find_connection(args)
    print(conn.export_lines(path), end="")
    return 0


def _status(args) -> int:
    from raydist.cluster import dashboard_client

    path, conn = find_connection(args)
    try:
        token = Path(conn.token_path).read_text().strip()
    except OSError as e:
        raise RaydistError(f"cannot read the token {conn.token_path}: {e.strerror}") from None
    try:
        nodes = dashboard_client.list_nodes(conn.dashboard_url, token)
    except dashboard_client.DashboardUnavailable as e:
        raise RaydistError(f"job {conn.job_id}: {e} (has the job ended?)") from None
    by_host = {n.hostname: n for n in nodes}
    rows = []
    for host in list(conn.nodes) + sorted(set(by_host) - set(conn.nodes)):
        n = by_host.get(host)
        rows.append(
            {
                "hostname": host,
                "address": n.ip if n else "-",
                "interface": n.iface if n else "-",
                "cpus": n.cpus if n else 0,
                "gpus": n.gpus if n else 0,
                "state": ("alive" if n.alive else "dead") if n else "missing",
                "head": bool(n and n.is_head),
            }
        )
    ranks = _launched_ranks(conn, token)
    if args.json:
        print(
            json.dumps(
                {"job_id": conn.job_id, "dashboard": conn.dashboard_url, "nodes": rows, "launched": ranks}, indent=1
            )
        )
        return 0 if all(r["state"] == "alive" for r in rows) else 1
    alive = sum(r["state"] == "alive" for r in rows)
    print(f"SLURM job {conn.job_id}: {alive}/{len(rows)} nodes alive; dashboard {conn.dashboard_url}")
    header = ("HOSTNAME", "ADDRESS", "INTERFACE", "CPUS", "GPUS", "STATE")
    table = [header] + [
        (
            r["hostname"] + (" (head)" if r["head"] else ""),
            r["address"],
            r["interface"],
            f"{r['cpus']:g}",
            f"{r['gpus']:g}",
            r["state"],
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    if ranks:
        from raydist.observability import top

        print(f"\nscripts run by raydist launch: {len(ranks)} rank(s)")
        print(top.launched_table(ranks))
    return 0 if alive == len(rows) else 1


def _launched_ranks(conn, token: str) -> list[dict]:
    """Every rank of a `raydist launch` running on the cluster, from the metrics its agent exports; [] when the
    metrics cannot be read (the node table is what `status` must show)."""
    from raydist.observability import top

    source = top.Source(describe=f"SLURM job {conn.job_id}", dashboard_url=conn.dashboard_url, token=token)
    try:
        return top.launched(top.snapshot(source)["runs"])
    except RaydistError:
        return []


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE",
        help="cluster config (default: $RAYDIST_CLUSTER_CONFIG, else ./cluster/cluster.yaml, else built-in defaults)",
    )


def _which_job(p: argparse.ArgumentParser) -> None:
    _config_arg(p)
    p.add_argument("--job", type=int, help="SLURM job id (default: $RAYDIST_CONNECTION, else the newest job)")
    p.add_argument("--connection", metavar="FILE", help="a connection file to read instead")


def register(sub: argparse._SubParsersAction) -> None:
    slurm = sub.add_parser("slurm", help="bring a Ray cluster up inside a SLURM job (used by cluster/ray_up.slurm)")
    ssub = slurm.add_subparsers(dest="slurm_command", required=True, parser_class=type(slurm))
    p = ssub.add_parser("plan", help="batch step: job dir, token, head address and ports for this job")
    _config_arg(p)
    p.set_defaults(func=_plan)
    p = ssub.add_parser(
        "node", help="one srun task per node: check the interface, run `ray start --block`, clean up when it ends"
    )
    _config_arg(p)
    p.set_defaults(func=_node)
    p = ssub.add_parser("wait", help="batch step: wait until every node joined, then write the connection file")
    _config_arg(p)
    p.add_argument("--step-pid", type=int, help="PID of the srun running the nodes: fail at once if it ends")
    p.add_argument("--timeout", type=float, help="seconds (default: timeouts.ready of the config)")
    p.set_defaults(func=_wait)
    p = ssub.add_parser("down", help="batch step, at exit: stop the node step gracefully, remove the job dir")
    _config_arg(p)
    p.add_argument("--step-pid", type=int, help="PID of the srun running the nodes: SIGTERM its step, wait for it")
    p.set_defaults(func=_down)
    p = ssub.add_parser(
        "stop",
        help="batch step, at the time-limit warning: every training run on the cluster "
        "checkpoints and stops; names each interrupted submission",
    )
    _config_arg(p)
    p.set_defaults(func=_stop)
    p = ssub.add_parser(
        "run",
        help="batch step, batch mode: run COMMAND as the job's driver; stop it at a "
        "checkpoint on the warning; requeue per the config",
    )
    _config_arg(p)
    p.add_argument("--step-pid", type=int, help="PID of the srun running the nodes (stopped before a requeue)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the driver command, after --")
    p.set_defaults(func=_run)
    p = ssub.add_parser("iface", help="print the interface and address Ray would use on this node")
    _config_arg(p)
    p.add_argument("--head", help="head node name to route to (default: none, config only)")
    p.set_defaults(func=_iface)

    p = sub.add_parser(
        "status", help="nodes of a running SLURM Ray cluster: hostname, address, interface, CPUs/GPUs, alive or dead"
    )
    _which_job(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_status)
    p = sub.add_parser("env", help="export lines that point a shell at a running SLURM Ray cluster")
    _which_job(p)
    p.set_defaults(func=_env)
