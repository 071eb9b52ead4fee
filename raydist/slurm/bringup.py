"""Bring-up: the batch step's plan (token, head address, ports), then one `ray start --block` per node under srun."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from raydist.cluster.dashboard_client import HOST_LABEL, IFACE_LABEL
from raydist.driver import yielding
from raydist.errors import RaydistError
from raydist.slurm import netif, ports, sweep, teardown
from raydist.slurm.jobdir import JobDir, Plan
from raydist.slurm.nodes import Allocation
from raydist.slurm.settings import ClusterConfig
from raydist.warm import ray_python
from raydist.warm.client import NO_PRESTART, WARM_EXEC_ENV, py_executable

# Variables of the submitting shell that would point `ray start` at some other cluster or token.
_STALE_RAY_ENV = ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_API_SERVER_ADDRESS")


def make_plan(cfg: ClusterConfig, alloc: Allocation, log=print) -> Plan:
    """Runs in the batch step, on the job's first node, which becomes the head."""
    if alloc.this_node != alloc.head:
        raise RaydistError(f"the plan must be made on the job's first node {alloc.head}, not {alloc.this_node}")
    jd = JobDir(cfg.job_path(alloc.job_id))
    # Job dirs (tokens included) of jobs whose teardown SLURM killed; the nodes sweep their own temp dirs.
    swept = sweep.sweep([(jd.path.parent, sweep.JOB)], alloc.job_id, alloc.this_node)
    if swept:
        log(swept)
    if int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0 and jd.path.exists():
        jd.remove()  # a requeued job: the dir is this same job's, left by a run that was killed before teardown
    choice = netif.head_choice(alloc.head, alloc.workers, cfg.interface_for(alloc.head))
    block = ports.pick_block(alloc.job_id, cfg.ports.base, cfg.ports.end, cfg.ports.block, head=True)
    jd.create()
    token = jd.write_token()
    plan = Plan(
        job_id=alloc.job_id,
        nodes=alloc.nodes,
        head=alloc.head,
        head_ip=choice.ip,
        head_iface=choice.iface,
        head_why=choice.why,
        block_start=block.start,
        block_size=block.size,
        dashboard_host=choice.ip if cfg.dashboard_host == "cluster" else cfg.dashboard_host,
        temp_dir=str(cfg.temp_path(alloc.job_id)),
        token_path=str(token),
        object_store_memory=cfg.object_store_memory,
        login_host=cfg.login_host or alloc.submit_host,
        config_source=cfg.source,
    )
    jd.write_plan(plan)
    return plan


def private_dir(path: Path) -> None:
    """`path` as a directory only this user can enter (mode 0700 whatever the umask); refuses one that is a link
    or belongs to someone else (another user could have made it first in a shared /tmp)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass  # a requeued job's own dir from before
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            raise RaydistError(
                f"{path} exists but is not a directory of this user's: remove it or set temp_dir in the cluster config"
            )
        os.chmod(path, 0o700)  # mkdir's mode is masked by the umask
    except OSError as e:
        raise RaydistError(f"cannot create the job's temp dir {path}: {e.strerror or e}") from None


def wait_for_head(node: str, choice: netif.Choice, plan: Plan, timeout: float) -> None:
    """Until the head's GCS port accepts a connection from this node's chosen address.

    A refusal means the head is still starting; anything else past the deadline means the head cannot be reached
    from this interface (wrong network, firewall), which would otherwise surface as a hang inside training.
    """
    port = ports.PortBlock(plan.block_start, plan.block_size).port("gcs")
    deadline = time.monotonic() + timeout
    reason = "no answer"
    while True:
        try:
            netif.check_reachable(node, choice, plan.head, plan.head_ip, port, timeout=min(5.0, timeout))
            return
        except TimeoutError:
            reason = "no answer"
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                raise netif.NetworkError(f"{node}: address {choice.ip} of {choice.iface} cannot be used") from None
            reason = (
                "connection refused (head not started?)" if e.errno == errno.ECONNREFUSED else (e.strerror or str(e))
            )
        if time.monotonic() >= deadline:
            raise netif.NetworkError(
                f"{node}: head {plan.head} ({plan.head_ip}:{port}) not reachable from {choice.iface} "
                f"({choice.ip}) within {timeout:.0f}s: {reason}"
            )
        time.sleep(0.5)


def ray_temp_dir(plan: Plan) -> Path:
    """Ray's --temp-dir: inside the job's 0700 temp dir, because Ray makes its own temp dir world-writable (0777)."""
    return Path(plan.temp_dir) / "ray"


def ray_start_command(
    plan: Plan, node: str, choice: netif.Choice, block: ports.PortBlock, alloc: Allocation
) -> list[str]:
    head = node == plan.head
    ray = Path(sys.executable).with_name("ray")
    cmd = [
        str(ray) if ray.exists() else (shutil.which("ray") or "ray"),
        "start",
        "--block",
        f"--node-ip-address={choice.ip}",
        f"--num-cpus={alloc.cpus}",
        f"--num-gpus={alloc.gpus}",
        f"--temp-dir={ray_temp_dir(plan)}",
        f"--labels={HOST_LABEL}={node},{IFACE_LABEL}={choice.iface}",
        "--disable-usage-stats",
    ]
    if plan.object_store_memory:
        cmd.append(f"--object-store-memory={plan.object_store_memory}")
    if head:
        cmd += ["--head", f"--dashboard-host={plan.dashboard_host}", "--include-dashboard=true"]
    else:
        gcs = ports.PortBlock(plan.block_start, plan.block_size).port("gcs")
        cmd.append(f"--address={plan.head_ip}:{gcs}")
    return cmd + block.ray_start_args(head)


def ray_environment(plan: Plan, node: str, iface: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a node's `ray start`; Ray's daemons, workers and drivers on the node inherit it."""
    env = dict(os.environ if base is None else base)
    for key in _STALE_RAY_ENV:
        env.pop(key, None)
    env.update(
        {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": plan.token_path,
            # Per node: a job's runtime_env is the same on every node and could not say this (cluster-facts #8).
            "GLOO_SOCKET_IFNAME": iface,
            "NCCL_SOCKET_IFNAME": f"={iface}",  # '=': exactly this name; a bare name is a prefix to NCCL
            teardown.TAG_ENV: teardown.job_tag(plan.job_id, node),
            # Python's and Ray's scratch files (multiprocessing's pymp-*, ...) land in the job's temp dir and go with it.
            "TMPDIR": plan.temp_dir,
            "RAY_USAGE_STATS_ENABLED": "0",
        }
    )
    # raydist's training metrics (raydist/observability/ray_metrics.py) are watched live (`raydist top`, Prometheus): every 2 s
    # to the node's agent instead of Ray's 10 s; a user's own setting wins.
    env.setdefault("RAY_metrics_report_interval_ms", "2000")
    # Ray's workers, and so the training's, at the job's own priority as under srun, not at Ray's niceness 15
    # (raydist.driver.session.prepare_ray_environment says why); a user's own setting wins.
    env.setdefault("RAY_worker_niceness", "0")
    # Ray's own actors (Ray Train's state actor, its placement-group cleaner) look the state API up here; without
    # it they look for "the" Ray instance on their node and find two when two jobs share a node.
    block = ports.PortBlock(plan.block_start, plan.block_size)
    env["RAY_API_SERVER_ADDRESS"] = f"http://{plan.head_ip}:{block.port('dashboard')}"
    return env


def run_node(cfg: ClusterConfig, alloc: Allocation, log=print) -> int:
    """One srun task per node: pick and check the interface, start Ray, keep it up, clean up when it ends."""
    jd = JobDir(cfg.job_path(alloc.job_id))
    plan = jd.read_plan(wait=30)
    node = alloc.this_node
    is_head = node == plan.head
    choice, block = _interface_and_ports(cfg, jd, plan, node)
    temp = _job_temp_dir(jd, plan, node, log)
    log_path = temp / "ray-start.log"
    cmd = ray_start_command(plan, node, choice, block, alloc)
    log(
        f"{node}: {'head' if is_head else 'worker'} on {choice.iface} {choice.ip} ({choice.why}), "
        f"{alloc.cpus} CPU, {alloc.gpus} GPU, ports {block.start}-{block.max_worker}"
    )
    stop = _StopRequest()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop.on_signal)
    if cfg.yield_daemons:  # opt-in; Ray's daemons are this process's descendants, under `ray start --block`
        yielding.start()
    env = ray_environment(plan, node, choice.iface)
    if cfg.warm_python:
        env = {**NO_PRESTART, **env}  # a user's own setting wins
    warm = start_warm_interpreter(env, temp) if cfg.warm_python else None
    if warm is not None:  # Ray's worker set-up goes through it too (raydist.warm.ray_python)
        cmd = ray_python.command(ray_python.write(temp, py_executable(env[WARM_EXEC_ENV])), cmd)
    # Both halves of the teardown budget must fit in SLURM's KillWait, after which everything gets SIGKILL.
    half = cfg.timeouts.teardown / 2
    try:
        for attempt in range(START_ATTEMPTS):
            with open(log_path, "ab") as out:
                proc = stop.proc = subprocess.Popen(
                    cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
            jd.write_record(
                node,
                state="started",
                pid=proc.pid,
                ip=choice.ip,
                iface=choice.iface,
                cpus=alloc.cpus,
                gpus=alloc.gpus,
                ports=[block.start, block.max_worker],
                head=is_head,
            )
            rc = _supervise(proc, stop, half)
            if not start_again(rc, _tail(log_path, 40), attempt, stop.requested):
                break
            found, _ = teardown.stop_leftovers(plan.job_id, node, half)  # the first try's half-started processes
            if warm is not None:  # it carries the tag, so it was stopped too: a new one for the new start
                warm.kill()
                warm.wait()
                warm = start_warm_interpreter(env, temp)
            log(
                f"{node}: ray start gave up waiting for its raylet to register (Ray's fixed 30 s; an overloaded "
                f"node): starting it once more, after stopping {len(found)} leftover process(es)"
            )
    finally:
        if warm is not None:
            warm.terminate()  # its ranks die with it; the clean-up below kills it if it does not end in time
    if not stop.requested:
        _report_exit(jd, node, rc, log_path)
    summary = teardown.cleanup_node(plan.job_id, node, temp, half)
    log(summary)
    if stop.requested:
        jd.write_record(node, state="stopped")
        return 0
    return 1


def start_warm_interpreter(env: dict[str, str], temp: Path) -> subprocess.Popen | None:
    """The node's warm interpreter (raydist.warm.server): a process with torch imported, which forks the
    ranks of `raydist launch` and scaling.engine=launch instead of each importing torch anew, and with
    scaling.warm_python Ray's workers of raydist's jobs. It is tagged like the node's Ray (the clean-up finds it by
    that), and its socket is in the job's private temp dir. `env` gains the variables that tell the agents and the
    jobs (Ray's workers and drivers inherit them) where it listens and what Ray should run to reach it."""
    from raydist.warm.client import WARM_ENV, WARM_EXEC, WARM_EXEC_ENV, WARM_LOG, start_server

    sock = temp / "warm.sock"
    proc = start_server(env, sock, temp / WARM_LOG)
    if proc is not None:  # else everything starts the cold way
        env[WARM_ENV], env[WARM_EXEC_ENV] = str(sock), str(WARM_EXEC)
    return proc


def _interface_and_ports(cfg: ClusterConfig, jd: JobDir, plan: Plan, node: str) -> tuple[netif.Choice, ports.PortBlock]:
    """This node's interface and port block; a failure is recorded first, so that the wait names this node."""
    try:
        if node == plan.head:
            # The plan already chose the head's interface and block: the batch step checked them.
            return (
                netif.Choice(plan.head_iface, plan.head_ip, plan.head_why),
                ports.PortBlock(plan.block_start, plan.block_size),
            )
        choice = netif.choose_here(node, configured=cfg.interface_for(node), head_ip=plan.head_ip)
        jd.write_record(node, state="waiting", ip=choice.ip, iface=choice.iface)
        wait_for_head(node, choice, plan, cfg.timeouts.head_reachable)
        return choice, ports.pick_block(plan.job_id, cfg.ports.base, cfg.ports.end, cfg.ports.block, head=False)
    except RaydistError as e:
        jd.write_record(node, state="failed", error=str(e))
        raise


def _job_temp_dir(jd: JobDir, plan: Plan, node: str, log) -> Path:
    """The job's private temp dir on this node, made after sweeping what ended jobs left next to it."""
    temp = Path(plan.temp_dir)
    # Temp dirs of this user's jobs that SLURM no longer runs (their clean-up was killed); never a live job's.
    swept = sweep.sweep([(temp.parent, sweep.TEMP)], plan.job_id, node)
    if swept:
        log(swept)
    try:
        private_dir(temp)
    except RaydistError as e:
        jd.write_record(node, state="failed", error=f"{node}: {e}")
        raise RaydistError(f"{node}: {e}") from None
    return temp


class _StopRequest:
    """SLURM's stop signal, as run_node's supervising loop sees it."""

    def __init__(self) -> None:
        self.requested = False
        self.since: float | None = None  # when the loop first saw the request: the grace period starts there
        self.proc: subprocess.Popen | None = None

    def on_signal(self, signum, _frame) -> None:
        # SLURM signals every process of the step at once; Ray's own handlers stop its daemons, this one waits
        # for that and then cleans up what is left.
        self.requested = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)


START_ATTEMPTS = 2
RAYLET_TIMED_OUT = "The current node timed out during startup"
"""What `ray start` logs when its raylet did not register within Ray 2.60's fixed 30 s (ray/_private/node.py)."""


def start_again(rc: int, log_tail: str, attempt: int, requested: bool) -> bool:
    """Whether `ray start` runs once more on this node: it ended on its own, on Ray's raylet registration timeout
    (a node too loaded to start in 30 s; a second try usually finds it less so), and tries are left."""
    return not requested and rc != 0 and attempt + 1 < START_ATTEMPTS and RAYLET_TIMED_OUT in log_tail


def _supervise(proc: subprocess.Popen, stop: _StopRequest, grace: float) -> int:
    """`ray start`'s exit status. Once a stop is requested it gets `grace` seconds before SIGKILL: the rest of the
    teardown budget is the clean-up's."""
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            if stop.requested:
                if stop.since is None:
                    stop.since = time.monotonic()
                if time.monotonic() - stop.since > grace:
                    proc.kill()


def _report_exit(jd: JobDir, node: str, rc: int, log_path: Path) -> None:
    """`ray start` ended with nobody asking: the record carries one line for the wait's error, stderr the log's
    tail for the job's output file."""
    tail = _tail(log_path)
    jd.write_record(node, state="failed", error=f"{node}: ray start exited with status {rc}: {tail}")
    print(
        f"raydist: error: {node}: ray start exited with status {rc}; last lines of {log_path}:\n"
        + "\n".join(_tail(log_path, 15, joined=False)),
        file=sys.stderr,
        flush=True,
    )


def _tail(path: Path, n: int = 1, joined: bool = True):
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()][-n:]
    except OSError:
        lines = []
    return " | ".join(lines) if joined else lines
