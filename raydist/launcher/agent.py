"""The agent beside each rank: starts the user's script in its own process, relays its output, watches it.

One `RankAgent` per process of the run: a Ray actor placed by the driver (raydist.launcher.driver), or, for the
first start on the embedded instance, an object in the driver's own process (raydist.launcher.group.Here). The
script runs as a process of its own, not inside the agent: its own `__main__`, `sys.argv`, signal handlers and
DataLoader workers, exactly as under torchrun or srun. It is a process group of its own (signals reach its DataLoader
workers too) and dies with its agent, so a lost agent leaves nothing running. On a node the SLURM bring-up started,
that process is forked by the node's warm interpreter, which has torch imported (raydist.warm.server);
elsewhere, or when that interpreter cannot run the command as a fresh one would, it is a fresh interpreter.
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from raydist.driver import yielding
from raydist.hook import STATUS_ENV, read
from raydist.launcher.errorfile import ERROR_FILE_ENV, read_error_file
from raydist.observability.ray_metrics import export_relayed
from raydist.warm.client import COLD_BY_CHOICE, WarmProcess, spawn

RETURNED_ENV = "RAYDIST_RETURNED_FILE"  # these three: as raydist/launcher/rank_site/sitecustomize.py reads them
PID_ENV = "RAYDIST_RANK_PID"
PYTHONPATH_ENV = "RAYDIST_PYTHONPATH"
MAX_BUFFERED_LINES = 20000  # between two polls (0.2 s); past it the oldest are lost to the console and the log
STACK_DUMP_TIMEOUT_S = 20


OWN_PROCESS_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
"""A process group of the script's own (signals reach its DataLoader workers too), in its agent's session. Not a
session of its own where Python can avoid it: with the kernel's autogroup scheduling (on by default), each session
is a group the scheduler shares CPU between, and each rank alone in one took measurably longer millisecond DDP steps
on a 2-core machine (spot checks of `benchmarks/torchrun_sync.py` under `raydist launch`)."""

SHIM = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG: SIGKILL when the agent's thread that started it ends\n"
    "try:\n    os.setpriority(os.PRIO_PROCESS, 0, int(sys.argv[1]))\nexcept OSError:\n    pass\n"
    f"os.environ['{PID_ENV}'] = str(os.getpid())\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
"""What the script is exec'd through: a fresh single-threaded interpreter (-S: no site, a few ms) sets the death
signal and srun's niceness, then becomes the script (same pid: rank_site's sitecustomize knows the rank's own
process by it). Not a preexec_fn: Python code between fork and exec in the agent, a process full of Ray's threads,
can deadlock (dlopen's lock held by another thread at the fork), and the rank then never starts. Lowering the
niceness needs root or RLIMIT_NICE; otherwise the script keeps Ray's."""
RANK_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_site")
"""Its sitecustomize notes when the script has returned, then restores PYTHONPATH and sys.path as they were."""


def with_exit_note(env: dict[str, str], returned_file: str) -> dict[str, str]:
    """A cold rank's environment, with rank_site first on PYTHONPATH to note when its script returns (a Python
    started with -S, -E or -I skips it: that rank's exit is then not told from its training)."""
    saved = "=" + env["PYTHONPATH"] if "PYTHONPATH" in env else ""
    path = RANK_SITE + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return {**env, "PYTHONPATH": path, PYTHONPATH_ENV: saved, RETURNED_ENV: returned_file}


def _shimmed(argv: list[str], niceness: int) -> list[str]:
    return [sys.executable, "-S", "-c", SHIM, str(niceness), *argv]


def _proc_stat(pid: int) -> tuple[str, float, int] | None:
    """(state letter, CPU seconds, resident bytes) of one process from /proc, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return fields[0], (int(fields[11]) + int(fields[12])) / ticks, int(fields[21]) * os.sysconf("SC_PAGE_SIZE")


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            kids = []
        out += kids
        todo += kids
    return out


class RankMetrics:
    """One start's metrics of a rank, exported through Ray's (`raydist top`, Prometheus): the hook's step and loss,
    the CPU share and memory of the script's process tree, the restarts."""

    def __init__(self, run: str, label: str, rank: int):
        from raydist.observability.ray_metrics import Exporter

        self.exporter = Exporter(run, label, "worker", rank, own_memory=False)
        self.cpu_mark: tuple[float, float] | None = None

    def export(self, polled: dict[str, Any], restarts: int) -> None:
        s = polled["status"]
        now = time.monotonic()
        if self.cpu_mark is not None and now - self.cpu_mark[0] >= 1.0:
            share = (polled["cpu_s"] - self.cpu_mark[1]) / (now - self.cpu_mark[0])
            self.exporter.observe(cpu_share=max(share, 0.0))
        if self.cpu_mark is None or now - self.cpu_mark[0] >= 1.0:
            self.cpu_mark = (now, polled["cpu_s"])
        export_relayed(self.exporter, s)  # a rank of scaling.engine=launch hands over all of the loop's metrics
        self.exporter.observe(
            step=s.get("step"), loss=s.get("loss"), restarts=restarts, rss_bytes=polled["rss_bytes"] or None
        )
        self.exporter.maybe_export()


class RankAgent:
    """Runs one rank's process and answers the driver's polls."""

    def __init__(self, run: str, index: int, label: str = "launch"):
        self.run, self.index, self.label = run, index, label  # label: the metrics' strategy tag
        self.proc: subprocess.Popen | WarmProcess | None = None
        self.cold_why = ""
        self.lines: collections.deque[str] = collections.deque(maxlen=MAX_BUFFERED_LINES)
        self.last_active = time.monotonic()
        self.status_file = self.status_dir = ""
        self.status_seen: dict[str, float] = {}
        self.rank = -1
        self.metrics: RankMetrics | None = None
        self.restarts = 0
        self.ended: float | None = None
        self.exit_seen: float | None = None
        self.returned_at: float | None = None  # when its script was seen to have returned (rank_site)
        self.error_file = self.returned_file = ""

    # ---- placement ----------------------------------------------------------------------------------

    def where(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        gpus = [int(g) for g in ray.get_gpu_ids() if str(g).isdigit()]
        return {
            "node_id": ctx.get_node_id(),
            "hostname": socket.gethostname(),
            "ip": ray.util.get_node_ip_address(),
            "gpu_ids": gpus,
            "pid": os.getpid(),
            "iface": os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("NCCL_SOCKET_IFNAME", ""),
        }

    def free_port(self) -> int:
        """A port free on this node, for MASTER_PORT (rank 0's agent)."""
        from raydist.cluster.listen_port import free_port

        return free_port("")

    # ---- the script -----------------------------------------------------------------------------------

    def start(
        self,
        argv: list[str],
        launcher_env: dict[str, str],
        cwd: str,
        rank: int,
        restarts: int,
        *,
        warm: bool = False,
        caller_env: dict[str, str] | None = None,
        named: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """The script's process: a fresh interpreter, or (`warm`) forked by the node's warm interpreter where there
        is one that can run it (raydist.warm.server: torch already imported). Its environment: this node's,
        the caller's (`caller_env`, `named`) and the launcher's (raydist.launcher.environment.merged). Its pid and
        which way it started."""
        from raydist.launcher.environment import merged

        self.rank, self.restarts = rank, restarts
        self._files(rank, restarts)
        env = {
            **merged(dict(os.environ), launcher_env, caller_env, named),
            STATUS_ENV: self.status_file,
            ERROR_FILE_ENV: self.error_file,
            "PYTHONUNBUFFERED": "1",
            "PYTHONFAULTHANDLER": "1",
        }
        if not os.path.isdir(cwd):
            cwd = os.getcwd()  # the driver's directory is not on this node: Ray's copy of the working dir is
        # The raylet's, which srun would have given the script: Ray starts its workers, and so the agents, at
        # niceness 15 by default, and a script inheriting that ran its start-up 1.5x slower than under srun.
        niceness = yielding.raylet_niceness()
        warm, self.cold_why = (
            spawn(argv, {**env, RETURNED_ENV: self.returned_file}, cwd, niceness) if warm else (None, COLD_BY_CHOICE)
        )
        self.proc = warm or subprocess.Popen(
            _shimmed(argv, niceness),
            env=with_exit_note(env, self.returned_file),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            **OWN_PROCESS_GROUP,
        )
        self.last_active = time.monotonic()
        self.ended = self.exit_seen = self.returned_at = None
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
        self.metrics = None  # this start's: made at the first poll that finds Ray up (Group.here starts before)
        return {"pid": self.proc.pid, "warm": warm is not None, "cold_why": self.cold_why}

    def _files(self, rank: int, restarts: int) -> None:
        """This start's files beside the rank: the hook's status, torch's error file (TORCHELASTIC_ERROR_FILE, as
        torchrun sets it per rank and start), and the note that the script has returned."""
        self.status_dir = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"raydist-launch-{os.getpid()}-{self.index}")
        os.makedirs(self.status_dir, exist_ok=True)
        self.status_file = os.path.join(self.status_dir, f"rank{rank}.json")
        self.error_file = os.path.join(self.status_dir, f"error-start{restarts}-rank{rank}.json")
        self.returned_file = os.path.join(self.status_dir, f"returned-start{restarts}-rank{rank}")
        for stale in (self.status_file, self.status_file + ".tmp", self.error_file, self.returned_file):
            if os.path.exists(stale):
                os.unlink(stale)

    def _pump(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
            self.last_active = time.monotonic()
        proc.wait()
        self.ended = time.monotonic()  # which rank failed first, when several have: the others followed it

    def poll(self) -> dict[str, Any]:
        """New output lines, exit code (None while running), seconds silent, the hook's values, CPU and memory."""
        # Whether the pump had read to the end, taken before the lines are: then none of its lines is left behind.
        pumped_all = self.ended is not None
        lines = []
        while self.lines:
            lines.append(self.lines.popleft())
        status = read(self.status_file) if self.status_file else {}
        if status.get("updated_unix") != self.status_seen.get("updated_unix"):
            self.status_seen = status
            self.last_active = time.monotonic()
        code = self.proc.poll() if self.proc else None
        usage = self._usage()
        now = time.monotonic()
        if code is not None and not pumped_all:
            # Exited, but its last lines are still being read: report both together (unless a process it left
            # behind keeps the pipe open).
            self.exit_seen = self.exit_seen or now
            if now - self.exit_seen < 2.0:
                code = None
            else:
                self.ended = self.exit_seen
        if self.returned_at is None and self.returned_file and os.path.exists(self.returned_file):
            self.returned_at = now
        out = {
            "lines": lines,
            "exit_code": code,
            "silent_s": now - self.last_active,
            "ended_s_ago": now - self.ended if self.ended is not None else None,
            "returned_s_ago": now - self.returned_at if self.returned_at is not None else None,
            "error": read_error_file(self.error_file) if code not in (None, 0) else None,
            "status": status,
            "pid": self.proc.pid if self.proc else None,
            **usage,
        }
        self._export(out)
        return out

    def _usage(self) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            return {"state": "X", "cpu_s": 0.0, "rss_bytes": 0}
        main = _proc_stat(self.proc.pid)
        if main is None:
            return {"state": "X", "cpu_s": 0.0, "rss_bytes": 0}
        cpu, rss = main[1], main[2]
        for kid in _descendants(self.proc.pid):  # DataLoader workers and anything else the script started
            s = _proc_stat(kid)
            if s:
                cpu, rss = cpu + s[1], rss + s[2]
        return {"state": main[0], "cpu_s": cpu, "rss_bytes": rss}

    def _export(self, polled: dict[str, Any]) -> None:
        if self.metrics is None:
            import ray

            if self.rank < 0 or not ray.is_initialized():
                return
            self.metrics = RankMetrics(self.run, self.label, self.rank)
        self.metrics.export(polled, self.restarts)

    def send(self, signame: str) -> None:
        """A signal to the script's whole process group (a stopped one is continued, so that it can act on it)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig in (getattr(signal, signame), signal.SIGCONT):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return

    def kill(self) -> int | None:
        """SIGKILL the script's process group, remove the hook's file; the script's exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.status_dir, ignore_errors=True)
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return None

    # ---- stacks -----------------------------------------------------------------------------------------

    def dump_stack(self) -> dict[str, Any]:
        """The script's Python stack, every thread: py-spy when it can read the process (non-blocking: it
        works on a stopped process and does not pause a running one), else faulthandler (SIGABRT, which ends it)."""
        if self.proc is None or self.proc.poll() is not None:
            return {"how": "none", "text": "(the process had exited)"}
        pyspy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
        t = time.monotonic()
        if os.path.exists(pyspy):
            try:
                r = subprocess.run(
                    [pyspy, "dump", "--nonblocking", "--pid", str(self.proc.pid)],
                    capture_output=True,
                    text=True,
                    timeout=STACK_DUMP_TIMEOUT_S,
                )
                if r.returncode == 0 and r.stdout.strip():
                    return {"how": "py-spy", "text": r.stdout, "seconds": time.monotonic() - t}
            except (OSError, subprocess.TimeoutExpired):
                pass
        return self._faulthandler_dump(t)

    def _faulthandler_dump(self, t: float) -> dict[str, Any]:
        """PYTHONFAULTHANDLER is on in every rank: SIGABRT makes it write every thread's stack to stderr."""
        assert self.proc is not None
        before = len(self.lines)
        self.send("SIGABRT")
        try:
            self.proc.wait(timeout=STACK_DUMP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.2)  # the pump thread reads the last lines
        text = "\n".join(list(self.lines)[before:])
        return {
            "how": "faulthandler",
            "text": text or "(no stack: the process did not answer SIGABRT)",
            "seconds": time.monotonic() - t,
        }
