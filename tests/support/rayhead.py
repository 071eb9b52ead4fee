"""A real `ray start --head` on loopback for tests: own temp dir, own free ports, token auth; stopped by PID."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from raydist.cluster.listen_port import free_port
from raydist.warm import ray_python
from raydist.warm.client import NO_PRESTART, WARM_ENV, WARM_EXEC, WARM_EXEC_ENV, WARM_LOG, WARM_SERVER, py_executable
from tests.support.jobutil import REPO, clean_env

VENV_BIN = Path(os.sys.executable).parent  # the venv that runs the tests runs the cluster too


def free_ports(n: int) -> list[int]:
    """n distinct free ports, outside the ephemeral range (raydist.cluster.listen_port says why)."""
    socks = []
    while len(socks) < n:
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", free_port("127.0.0.1")))
        except OSError:  # taken since free_port looked
            s.close()
            continue
        socks.append(s)  # held until all are picked, so that none is picked twice
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@dataclass
class Head:
    gcs_address: str
    dashboard_url: str
    token_path: str
    temp_dir: str
    pid: int = 0
    """`ray start --block`'s: the head's Ray processes (raylet, workers) are its descendants."""
    warm: dict[str, str] | None = None
    """Where its warm interpreter listens (RAYDIST_WARM_SOCKET, RAYDIST_WARM_EXEC), as a SLURM bring-up exports it."""

    def state(self) -> str:
        """The tails of this head's start log and dashboard log: what a test that could not reach it prints."""
        out = []
        for log in ("ray_start.log", "session_latest/logs/dashboard.log"):
            path = Path(self.temp_dir, log)
            text = path.read_text(errors="replace")[-1500:] if path.exists() else "(none)"
            out.append(f"--- {log}:\n{text}")
        return "\n".join(out)

    def job_env(self) -> dict[str, str]:
        """What a job's environment adds to join this head (its address and token, as `raydist env` prints them)."""
        return {
            "RAY_ADDRESS": self.gcs_address,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": self.token_path,
            **(self.warm or {}),
        }

    def forked_jobs(self) -> int:
        """How many Ray jobs' workers its warm interpreter has forked (a server per job: raydist/warm/server.py's log)."""
        log = Path(self.temp_dir, WARM_LOG)
        return log.read_text(errors="replace").count("imported Ray for Ray job") if self.warm and log.exists() else 0

    def node_env(self) -> dict[str, str]:
        """A shell on the head's node, for a driver given the head by `run.address`: the token, and the warm
        interpreter's settings, which the SLURM bring-up gives every process on its nodes (the driver's Ray workers
        are forked from it; without them each would import torch itself)."""
        return {**self.client_env(), **(self.warm or {})}

    def client_env(self, with_token: bool = True) -> dict[str, str]:
        """The environment of a `ray job submit` client: with the token, or without any auth settings."""
        # Without the settings a test marked `shared_ray` gives its jobs: the client's own choice only.
        env = {k: v for k, v in clean_env(PATH=f"{VENV_BIN}:{os.environ['PATH']}").items() if not k.startswith("RAY_")}
        if with_token:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=self.token_path)
        return env


def _pids_using(path: str) -> list[int]:
    """Processes whose command line names our temp dir: this head's raylet, GCS, workers and agents only."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if path.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


WORKER_PORTS = (61000, 65535)
"""Where test heads' worker ports come from: above the kernel's ephemeral range (32768-60999 here) and away from the
ports raydist picks for its own servers (raydist.cluster.listen_port), the SLURM port blocks and an embedded instance's
worker ports (Ray's 10002-19999)."""
WORKER_BLOCK = 51


@contextlib.contextmanager
def _worker_block() -> Iterator[int]:
    """The first of WORKER_BLOCK worker ports that no other test head on this machine holds, held (a lock on a file
    per block) while the head lives. Ray's workers bind their ports as they start, long after a head did: a block
    chosen as free when its head started, as the named ports are, was once another head's dashboard port by then,
    which then found a Ray worker answering there (http.client.BadStatusLine)."""
    import fcntl
    import random

    from raydist.cluster.listen_port import claims_dir

    claims_dir().mkdir(parents=True, exist_ok=True, mode=0o700)
    starts = list(range(WORKER_PORTS[0], WORKER_PORTS[1] - WORKER_BLOCK + 2, WORKER_BLOCK))
    random.shuffle(starts)
    for start in starts:
        fd = os.open(claims_dir() / f"test-head-workers-{start}", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        try:
            yield start
        finally:
            os.close(fd)  # releases the lock
        return
    raise RuntimeError(f"every block of {WORKER_BLOCK} worker ports in {WORKER_PORTS} is held by a test head")


@contextlib.contextmanager
def ray_head(
    num_cpus: int = 2,
    num_gpus: int | None = None,
    stop_wait_s: float = 5,
    env: dict[str, str] | None = None,
    warm: bool = True,
) -> Iterator[Head]:
    """num_gpus: None lets Ray count this machine's; stop_wait_s: how long `ray start --block` gets to stop the
    daemons after SIGTERM before what is left of them is killed (it first drains its node, for up to 30 s, which
    a test head has no use for); env: more environment for the head's processes; warm: a warm interpreter beside
    it, as the SLURM bring-up starts on each node, that forks the Ray workers of raydist's jobs."""
    extra_env = env or {}
    temp_dir = tempfile.mkdtemp(prefix="rdh-", dir="/tmp")  # short: Ray's unix socket paths must fit 107 bytes
    token_path = os.path.join(temp_dir, "auth_token")
    fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, secrets.token_hex(32).encode())
    os.close(fd)
    gcs, dash, client, nm, om, agent_l, agent_g, metrics, rtenv = free_ports(9)
    block = contextlib.ExitStack()
    wmin = block.enter_context(_worker_block())
    # RAY_API_SERVER_ADDRESS: Ray's own actors find this head's state API, not another test's Ray (launch.py).
    # RAY_USAGE_STATS_ENABLED=0: the dashboard would otherwise try to report to Ray's project over the internet,
    # which a test never reaches out to (the cluster's bring-up and the embedded instance switch it off too).
    env = clean_env(
        PATH=f"{VENV_BIN}:{os.environ['PATH']}",
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=token_path,
        RAY_API_SERVER_ADDRESS=f"http://127.0.0.1:{dash}",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_worker_niceness="0",  # as the SLURM bring-up starts Ray: the training's workers at the caller's priority
        **extra_env,
    )
    args = [
        str(VENV_BIN / "ray"),
        "start",
        "--head",
        "--block",
        f"--temp-dir={temp_dir}",
        "--node-ip-address=127.0.0.1",
        f"--port={gcs}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dash}",
        f"--ray-client-server-port={client}",
        f"--node-manager-port={nm}",
        f"--object-manager-port={om}",
        f"--dashboard-agent-listen-port={agent_l}",
        f"--dashboard-agent-grpc-port={agent_g}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={rtenv}",
        f"--min-worker-port={wmin}",
        f"--max-worker-port={wmin + WORKER_BLOCK - 1}",
        f"--num-cpus={num_cpus}",
        "--object-store-memory=200000000",
        "--include-dashboard=true",
        "--disable-usage-stats",
        *([f"--num-gpus={num_gpus}"] if num_gpus is not None else []),
    ]
    warm_env = None
    if warm:
        warm_env = {WARM_ENV: os.path.join(temp_dir, "warm.sock"), WARM_EXEC_ENV: str(WARM_EXEC)}
        env.update(warm_env, **NO_PRESTART)
        # Started by the shell that becomes `ray start`: a descendant of the head's pid like Ray's processes, so that
        # the tests find the workers it forks (jobutil.processes_titled), and ending with it (--parent).
        args = [
            "bash",
            "-c",
            f'"$0" {WARM_SERVER} "$1" --parent $$ >> "$2" 2>&1 & shift 2; exec "$@"',
            sys.executable,
            warm_env[WARM_ENV],
            os.path.join(temp_dir, WARM_LOG),
            *ray_python.command(ray_python.write(temp_dir, py_executable()), args),
        ]
    log = open(os.path.join(temp_dir, "ray_start.log"), "w")
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    head = Head(f"127.0.0.1:{gcs}", f"http://127.0.0.1:{dash}", token_path, temp_dir, proc.pid, warm_env)
    try:
        _wait_for_dashboard(head, proc, deadline=time.time() + 90)
        yield head
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # `ray start --block` stops the daemons it started
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=stop_wait_s)
        for pid in _pids_using(temp_dir):  # anything that outlived it, found by our temp dir only
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)  # reaped, killed or not
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)
        block.close()  # the worker ports, for the next head


def _wait_for_dashboard(head: Head, proc: subprocess.Popen, deadline: float) -> None:
    token = Path(head.token_path).read_text().strip()
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"ray start exited {proc.returncode}: {Path(head.temp_dir, 'ray_start.log').read_text()[-2000:]}"
            )
        try:
            req = urllib.request.Request(
                f"{head.dashboard_url}/api/version", headers={"Authorization": f"Bearer {token}"}
            )
            with urllib.request.urlopen(req, timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise RuntimeError("Ray head did not answer within 90 s")
