"""The agent's side of a node's warm interpreter (raydist.warm.server): a rank forked from a process with
torch already imported, handled like the subprocess.Popen of a rank started the cold way."""

from __future__ import annotations

import atexit
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from raydist.warm import ray_python, wire
from raydist.warm.wire import WARM_ENV

CONNECT_TIMEOUT_S = 60.0  # for the answer too: it listens before its imports, and answers once they are done
NO_WARM = "no warm interpreter on this node"
COLD_BY_CHOICE = "warm=false"  # the default: a fresh interpreter, as torchrun and srun start the script
WARM_LOG = "warm-interpreter.log"  # beside its socket, in the job's temp dir
WARM_SERVER = Path(__file__).with_name("server.py")
WARM_EXEC = Path(__file__).with_name("worker_exec.py")
WARM_EXEC_ENV = "RAYDIST_WARM_EXEC"
"""Set beside WARM_ENV by the SLURM bring-up: the node's raydist.warm.worker_exec, for a job's py_executable."""
WARM_DIR_PREFIX = "raydist-warm-"
LISTEN_TIMEOUT_S = 10.0
OWN_INTERPRETER = ("pip", "conda", "uv", "container", "image_uri", "py_executable")
"""runtime_env fields that choose the workers' interpreter themselves: a job with one keeps it."""


def start_server(env: dict[str, str], sock: Path, log: Path, parent: int | None = None) -> subprocess.Popen | None:
    """A warm interpreter listening on `sock`, with `env` as its environment (the one Ray's processes get, so that
    their requests match it), its output appended to `log`. With `parent`, it ends when that process does."""
    argv = [sys.executable, str(WARM_SERVER), str(sock)] + (["--parent", str(parent)] if parent else [])
    try:
        with open(log, "ab") as out:
            return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    except OSError:
        return None  # everything starts the cold way


def py_executable(exec_path: str | os.PathLike = WARM_EXEC) -> str:
    """Ray's `py_executable` (a runtime_env field) that has the node's warm interpreter fork each of the job's Ray
    workers (raydist.warm.worker_exec); a node without one starts them as Ray does."""
    return f"{shlex.quote(sys.executable)} -I -S {shlex.quote(str(exec_path))}"


NO_PRESTART = {"RAY_prestart_worker_first_driver": "0"}
"""For a Ray instance whose raydist jobs have their workers forked by a warm interpreter: without it, a job's
driver makes the raylet start one default worker per CPU ahead of need (ray::IDLE), which those jobs never use
(their runtime_env names the warm interpreter; Ray keeps workers per runtime_env), so each only costs about half
a second of CPU at every job's start. Set before the warm interpreter starts: it records RAY_ settings."""

JOB_WIDE = ("RAY_TRAIN_V2_ENABLED",)
"""Set in the driver, read as Ray Train is imported, and given by Ray Train to its own actors only: given to every
worker of the job too, so that a job's server (raydist.warm.rayjob.RAY_JOB_PRELOAD), which takes the settings of the
job's first worker on its node (Ray Data's autoscaling coordinator, say), has the value Ray Train's actors have."""


def for_cluster_job() -> dict:
    """What the runtime_env of a job joining a cluster gains: the nodes' warm interpreters fork its Ray workers.
    Nothing where this node has none (not booted by raydist, or warm_python off), or where the job's own
    runtime_env (`ray job submit --runtime-env-json`) chooses the interpreter."""
    exec_path = os.environ.get(WARM_EXEC_ENV, "")
    if not os.environ.get(WARM_ENV) or not os.path.isfile(exec_path):
        return {}
    try:
        job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")).get("runtime_env") or {}
    except (ValueError, AttributeError):
        return {}
    if set(job) & set(OWN_INTERPRETER):
        return {}
    # Ray merges these per variable with the job's own, and refuses a variable set in both.
    theirs = job.get("env_vars") or {}
    env_vars = {k: os.environ[k] for k in JOB_WIDE if k in os.environ and k not in theirs}
    return {"py_executable": py_executable(exec_path), **({"env_vars": env_vars} if env_vars else {})}


def start_for_embedded(env_vars: dict[str, str], token: bool) -> tuple[dict, Path | None]:
    """A warm interpreter for the embedded Ray instance this process is about to start, ending with this process;
    returns what the job's runtime_env gains for Ray to fork its workers from it, and the interpreter Ray should
    start its processes with (raydist.warm.ray_python). Its environment is what Ray's workers will have: this
    process's, the job's variables, and token auth, which ray.init turns on itself (raydist.cluster.local_auth)."""
    from raydist.cluster.local_auth import remove_stale_dirs

    remove_stale_dirs(WARM_DIR_PREFIX)
    # 0700, named by this process's pid for the sweep above: its socket forks processes as this user.
    temp = Path(tempfile.mkdtemp(prefix=f"{WARM_DIR_PREFIX}{os.getpid()}-"))
    sock = temp / "warm.sock"
    env = {**os.environ, **env_vars, **({"RAY_AUTH_MODE": "token"} if token else {})}
    proc = start_server(env, sock, temp / WARM_LOG, parent=os.getpid())
    # It listens before its imports: wait for that (a moment), so that no worker Ray starts meanwhile finds none.
    deadline = time.monotonic() + LISTEN_TIMEOUT_S
    while proc is not None and not sock.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if proc is None or not sock.exists():
        if proc is not None:
            proc.kill()
        shutil.rmtree(temp, ignore_errors=True)
        return {}, None
    os.environ[WARM_ENV] = str(sock)  # the embedded instance's processes inherit it

    def stop() -> None:
        proc.terminate()  # it ends once Ray's workers forked from it have ended
        shutil.rmtree(temp, ignore_errors=True)

    atexit.register(stop)
    return {"py_executable": py_executable()}, ray_python.write(temp, py_executable())


class WarmProcess:
    """A rank forked by the warm interpreter: the part of Popen's interface the agent uses (pid, stdout, poll,
    wait, returncode). Its exit code comes over the connection; a connection that closes without one means the
    warm interpreter died, and its children with it (SIGKILL)."""

    def __init__(self, conn: socket.socket, answers, pid: int, stdout):
        self.pid, self.stdout, self.returncode = pid, stdout, None
        self._conn, self._answers = conn, answers
        self._done = threading.Event()
        threading.Thread(target=self._watch, daemon=True, name=f"warm-rank-{pid}").start()

    def _watch(self) -> None:
        self.returncode = wire.exit_code(self._answers)
        self._done.set()
        self._conn.close()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"rank process {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode


def spawn(argv: list[str], env: dict[str, str], cwd: str, niceness: int | None) -> tuple[WarmProcess | None, str]:
    """The rank forked by this node's warm interpreter, or None and why not (no warm interpreter here, or it
    declined: another Python, interpreter options, ...). Its output goes to a pipe the caller reads as stdout."""
    path = os.environ.get(WARM_ENV, "")
    if not path:
        return None, NO_WARM
    if not os.path.exists(path):  # it failed to start or ended: its log is beside the socket
        return None, f"the warm interpreter is not running (its log: {os.path.join(os.path.dirname(path), WARM_LOG)})"
    read_end, write_end = os.pipe()
    conn = answers = None
    try:
        body = wire.request_body(argv, env, cwd, niceness)
        conn, answers, answer = wire.ask(path, body, [write_end], CONNECT_TIMEOUT_S)
    except (OSError, ValueError) as e:
        answer = {"declined": f"the warm interpreter did not answer ({type(e).__name__}: {e})"}
    finally:
        os.close(write_end)
    pid, why = wire.started(answer)
    if pid is None:
        if conn is not None:
            conn.close()
        os.close(read_end)
        return None, why
    return WarmProcess(conn, answers, pid, os.fdopen(read_end, "rb")), ""
