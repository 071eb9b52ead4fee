"""Readiness: wait until every node of the job has joined its Ray cluster, then write and print the connection file."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from raydist.cluster import dashboard_client
from raydist.cluster.connection import Connection
from raydist.errors import RaydistError
from raydist.slurm import ports
from raydist.slurm.jobdir import JobDir, Plan


class BringupFailed(RaydistError):
    """Bring-up did not finish: the message names the nodes and what is known of each."""


def describe_missing(missing: list[str], records: dict[str, dict], head: str, dashboard_up: bool) -> str:
    """What is known of each node that has not joined: not started / waiting / started but not registered."""
    parts = []
    for node in missing:
        rec = records.get(node)
        if rec is None:
            what = "not started (no srun task reported from it)"
        elif rec.get("state") == "waiting":
            what = f"waiting for the head from {rec.get('iface')} ({rec.get('ip')})"
        elif rec.get("state") == "started":
            what = f"started (ray start pid {rec.get('pid')} on {rec.get('iface')}), not registered"
            if node == head and not dashboard_up:
                what = f"started (ray start pid {rec.get('pid')}), dashboard not answering"
        else:
            what = str(rec.get("state"))
        parts.append(f"{node}: {what}")
    return "; ".join(parts)


def connection_for(plan: Plan, user: str = "") -> Connection:
    block = ports.PortBlock(plan.block_start, plan.block_size)
    return Connection(
        job_id=plan.job_id,
        head=plan.head,
        nodes=plan.nodes,
        head_ip=plan.head_ip,
        gcs_port=block.port("gcs"),
        dashboard_host=plan.dashboard_host,
        dashboard_port=block.port("dashboard"),
        client_port=block.port("client"),
        token_path=plan.token_path,
        login_host=plan.login_host,
        user=user,
    )


def _step_ended(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def joined_bar(joined: int, total: int, width: int = 20) -> str:
    """'[########------------]': nodes joined out of total, for the job's output file (a line per change, not
    redrawn: sbatch writes it to a file)."""
    filled = round(width * joined / total) if total else width
    return "[" + "#" * filled + "-" * (width - filled) + "]"


@dataclasses.dataclass(frozen=True)
class Wait:
    """How wait_ready waits."""

    timeout: float
    """Seconds after which the nodes that have not joined are named in BringupFailed."""
    step_pid: int | None = None
    """The srun step running the Ray nodes: the wait fails as soon as it ends. None: not watched."""
    user: str = ""
    """The user the connection file names, for the ssh tunnel to the login host."""
    log: Callable[[str], None] = print
    """Where the progress lines go (one per change)."""
    poll: float = 0.5
    """Seconds between two looks at the records and the dashboard."""
    clock: Callable[[], float] = time.monotonic
    """Seconds, for the elapsed time and the timeout."""


def wait_ready(jd: JobDir, wait: Wait) -> Connection:
    """Poll node records (shared job dir) and the dashboard until all nodes are alive; fail fast on a failed node."""
    timeout, step_pid, log, clock = wait.timeout, wait.step_pid, wait.log, wait.clock
    plan = jd.read_plan()
    conn = connection_for(plan, wait.user)
    token = jd.read_token()
    start = clock()
    last = ""
    while True:
        records = jd.records()
        failed = [r for n, r in records.items() if r.get("state") == "failed"]
        if failed:
            raise BringupFailed("; ".join(r.get("error", f"{r['node']}: failed") for r in failed))
        dashboard_up = True
        try:
            nodes = dashboard_client.list_nodes(conn.dashboard_url, token)
            # The jobs API must answer too: `ray job submit` goes through it.
            dashboard_client.get_json(f"{conn.dashboard_url}/api/jobs/", token)
        except dashboard_client.DashboardUnavailable:
            nodes, dashboard_up = [], False
        alive = {n.hostname for n in nodes if n.alive}
        missing = [n for n in plan.nodes if n not in alive]
        elapsed = clock() - start
        msg = (
            f"{joined_bar(len(plan.nodes) - len(missing), len(plan.nodes))} "
            f"{len(plan.nodes) - len(missing)}/{len(plan.nodes)} nodes joined"
        )
        if missing:
            msg += f"; waiting for {', '.join(missing)}"
        if msg != last:
            log(f"[{elapsed:5.1f}s] {msg}")
            last = msg
        if not missing:
            jd.write_record(plan.head, ready_after_s=round(elapsed, 2))
            conn.write(jd.connection)
            return conn
        if _step_ended(step_pid):
            raise BringupFailed(
                f"the Ray node step ended before every node joined: "
                f"{describe_missing(missing, records, plan.head, dashboard_up)}"
            )
        if elapsed >= timeout:
            raise BringupFailed(
                f"not every node joined within {timeout:.0f}s: "
                f"{describe_missing(missing, records, plan.head, dashboard_up)}"
            )
        time.sleep(wait.poll)
