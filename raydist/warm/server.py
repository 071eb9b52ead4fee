"""A node's warm interpreter: a Python process with torch imported that forks a rank's process on request.

Started per node by the SLURM bring-up beside `ray start` (raydist.slurm.bringup), listening on a Unix socket in
the job's private temp dir. A rank's agent (raydist.launcher.agent) asks it to run `python script.py ...` or
`python -m module ...`; the forked child becomes that script with its own environment, working directory, argv,
sys.path and output pipe, without paying torch's import again (about as long as the rest of a small script's
start-up together). Anything it cannot run exactly as a fresh interpreter would (another Python, interpreter
options, PYTHON* variables that act at start-up, a preloaded library of its own) it declines, and the agent starts
a fresh interpreter as before.

Run by path, not as a module: it imports nothing of raydist's, so that the script imports raydist (or its own
copy, from a job's working dir) afresh. It must stay single-threaded while it forks; torch's import starts no
thread that matters here (OpenBLAS's pool re-forms in the child).

Protocol, per connection: the agent sends a 4-byte length with the write end of the rank's output pipe attached
(SCM_RIGHTS), then that many bytes of JSON {"argv", "env", "cwd", "niceness"}. The server answers one JSON line,
{"pid": N} or {"declined": "why"}, and later {"exit": code} (Popen's returncode convention: -N for signal N). If
the agent's connection closes first (the agent died), the child's process group is killed: the rank dies with
its agent, as PR_SET_PDEATHSIG gives a rank started the cold way. A child dies with the server too
(PR_SET_PDEATHSIG); SIGTERM ends the server only once no child of its is left.

Ray's own workers (raydist.warm.worker_exec sends their `python default_worker.py ...`, with stdout and stderr as
two fds) are forked by a server of their Ray job instead: a child of this one that imported Ray with that job's
settings (Ray's C++ side reads the job's id and the raylet's pid only at its import). This server hands each such
request on to it over a socket pair: the agent's connection and the output fds, then the request's bytes.

    python raydist/warm/server.py SOCKET_PATH [--parent PID]
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time
import types


def _load_private_api() -> types.ModuleType:
    """raydist/private_api.py (every private Ray or torch name raydist uses), loaded by path under a name of its own
    and left out of sys.modules: this server imports nothing of raydist's as a package, so that a forked script
    imports raydist afresh (its own copy, from a job's working dir), and the server starts where raydist is not
    installed. That module imports only the standard library at its import."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "private_api.py")
    spec = importlib.util.spec_from_file_location("raydist_warm_server_private_api", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


private_api = _load_private_api()

PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch.utils.data", private_api.DYNAMO_MODULE)
"""torch._dynamo too: DistributedDataParallel imports it as it is built, and torch's optimizers at their first step
(torch 2.13): about a second of a fresh process's imports (sympy, inductor's config) before its first step."""
KEPT_PYTHON_VARS = frozenset(
    {"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE", "PYTHONBREAKPOINT"}
)
"""PYTHON* variables the child applies itself, or that Python reads later (PYTHONBREAKPOINT, which Ray sets for its
workers, at each breakpoint()); any other that differs from the server's acts at a fresh start and is declined."""
SAME_AS_SERVER = ("LD_PRELOAD", "LD_LIBRARY_PATH")
RAY_JOB_PRELOAD = ("ray", "pyarrow", "pandas", "ray.data", "ray.train", "ray.train.torch")
"""What a Ray job's server imports (Server._become_ray_job_server), and with them what they import (gRPC, ...):
Ray, and what Ray Train's controller, its helper actors and its workers import next. Not in the node's server:
Ray's C++ side reads settings the raylet gives each worker (RAY_JOB_ID, RAY_RAYLET_PID) once, as it is imported
(ray/common/ray_internal_flag_def.h). Ray Data and Ray Train are imported without drawing a Ray ID
(_actor_class_ids_from_urandom). Ray Train's import reads RAY_TRAIN_V2_ENABLED, which Ray Train gives its own
actors: raydist gives it to every worker of its jobs (raydist.warm.client.JOB_WIDE), so that the job's first
worker on a node, the one this server takes its settings from, has it as Ray Train's actors do."""
RAY_DEPS_PRELOAD = (
    "pandas",
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.dataset",
    "pydantic",
    "grpc",
    "google.protobuf",
    "requests",
    "jsonschema",
    "yaml",
    "aiohttp",
    "msgpack",
    "click",
    "filelock",
)
"""What RAY_JOB_PRELOAD imports besides Ray itself: none of it reads the settings Ray gives its workers, so the node's
server imports it, once it is idle after torch (IDLE_BEFORE_RAY_DEPS_S: a rank asked for meanwhile is forked
first), and each Ray job's server, its fork, then imports only Ray: about half of what that server imported before
its job's first worker on the node could start, on the path to a Ray Train run's first step."""
IDLE_BEFORE_RAY_DEPS_S = 0.5
RAY_READ_ONCE = ("RAY_JOB_ID", "RAY_RAYLET_PID", "RAY_OVERRIDE_NODE_ID_FOR_TESTING")
RAY_JOB_IDLE_S = 60.0
MAX_REQUEST = 16 << 20
READ_TIMEOUT_S = 10.0  # for a whole request: an agent sends it at once, and the server serves one at a time
HANDLED = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD}
PR_SET_PDEATHSIG = 1


class Request:
    """One rank to start: what the agent sent, checked."""

    def __init__(self, data: dict, out_fds: list[int]):
        self.argv: list[str] = [str(a) for a in data["argv"]]
        self.env: dict[str, str] = {str(k): str(v) for k, v in data["env"].items()}
        self.cwd: str = str(data["cwd"])
        self.niceness: int | None = data.get("niceness")
        self.out_fds = out_fds  # stdout and stderr (one fd: both)
        self.raw = b""  # the JSON as it came, handed on to a Ray job's server
        self.module: str | None = None
        self.script: str | None = None
        self.args: list[str] = []

    def decline_reason(self) -> str | None:
        """Why this request cannot run as a fresh interpreter would; None when it can."""
        exe = _which(self.argv[0], self.env.get("PATH", ""), self.cwd) if self.argv else None
        if exe is None or not _same_python(exe, sys.executable):
            return f"not this node's Python ({sys.executable})"
        rest = self.argv[1:]
        while rest and rest[0] == "-u":  # unbuffered: the child's streams are anyway
            rest = rest[1:]
        if len(rest) >= 2 and rest[0] == "-m":
            self.module, self.args = rest[1], rest[2:]
        elif rest and not rest[0].startswith("-") and os.path.isfile(os.path.join(self.cwd, rest[0])):
            self.script, self.args = rest[0], rest[1:]
        else:
            return "interpreter options other than -u, or no script file (a directory, a zip, stdin)"
        if not os.path.isdir(self.cwd):
            return f"no directory {self.cwd}"
        # A variable the imports set may also come set to that value (from a process that made the same imports).
        differ = sorted(
            k
            for k in set(self.env) | set(ENV_BEFORE_IMPORT)
            if _acts_at_start(k) and self.env.get(k) not in (ENV_BEFORE_IMPORT.get(k), SET_AT_IMPORT.get(k, "\0"))
        )
        if differ:
            return f"{', '.join(differ)} differ{'s' if len(differ) == 1 else ''} from the warm interpreter's"
        return None


ENV_BEFORE_IMPORT: dict[str, str] = {}
"""This server's environment before its preloaded modules were imported: a request's must equal it where
_acts_at_start says, as a fresh interpreter's would before the same imports."""
SET_AT_IMPORT: dict[str, str] = {}
"""What those imports put in os.environ (torch._dynamo's: TORCHINDUCTOR_CACHE_DIR, from the temp dir and the
user): a fresh interpreter's imports would put it there too, so a fork gets it where its request has none."""
READ_AT_IMPORT: set[str] = set()
"""The variables the preloaded modules read through os.environ while they were imported: in a fork they keep
the server's values."""
RECORDED_PREFIXES = (
    "RAY_",
    "TORCH",
    "PYTORCH_",
    "PANDAS_",
    "ARROW_",
    "GRPC_",
    "PROTOCOL_BUFFERS_",
    "MSGPACK_",
    "SYMPY_",
    "MPMATH_",
    "INDUCTOR_",
    "AOTINDUCTOR_",
    "AOT_INDUCTOR_",
    "AOT_PARTITIONER_",
    "PARTITIONER_",
    "PT2_",
    "CUTLASS_",
    "CUTEDSL_",
    "ENABLE_",
    "LOG_AUTOTUNE_",
    "LOG_TLPARSE",
    "DUMP_AOTI_",
    "FAKE_ALLOW_",
    "UNSAFE_SKIP_FSDP_",
    "CXX",
    "CI",
)
"""The preloaded modules' own settings among them (not HOME, PATH and the like, which some read only to pass
on): these must equal the server's for a fork to be the same process. From SYMPY_ on: what torch._dynamo's import
reads (sympy, mpmath, inductor's and its partitioner's config, the C++ compiler inductor would use, CI)."""
RECORDED_NAMES = ("TMPDIR", "TEMP", "TMP")
"""Recorded too: torch._dynamo's import fixes the temp dir (tempfile's, and inductor's cache dir in it)."""


def ray_job_of(request: Request) -> tuple[str, str] | None:
    """Ray's worker process, of which job under which raylet: the settings Ray's C++ side reads only once, as it
    is imported (ray/common/ray_internal_flag_def.h), so that only a server that imported Ray with them can fork
    that worker with Ray imported."""
    if request.script and os.path.basename(request.script) == "default_worker.py":
        job, raylet = request.env.get("RAY_JOB_ID"), request.env.get("RAY_RAYLET_PID")
        if job and raylet:
            return job, raylet
    return None


def _acts_at_start(key: str) -> bool:
    """Whether a variable acts at a fresh start (Python's own, the dynamic loader's) or was one of the preloaded
    modules' settings read at their import: it must then equal the server's."""
    if key.startswith("PYTHON"):
        return key not in KEPT_PYTHON_VARS
    return key in SAME_AS_SERVER or (
        key in READ_AT_IMPORT and (key.startswith(RECORDED_PREFIXES) or key in RECORDED_NAMES)
    )


def _which(name: str, path: str, cwd: str) -> str | None:
    """The program `name` names, as the rank's shell would find it (a relative path from the rank's directory)."""
    import shutil

    if os.sep in name:
        name = os.path.join(cwd, name)
        return name if os.access(name, os.X_OK) else None
    return shutil.which(name, path=path)


def _same_python(a: str, b: str) -> bool:
    """The same interpreter of the same environment: a venv's python and python3 are one, the base python that
    its link points to is not (other site-packages)."""
    return os.path.dirname(os.path.abspath(a)) == os.path.dirname(os.path.abspath(b)) and os.path.realpath(
        a
    ) == os.path.realpath(b)


# ---- the server ------------------------------------------------------------------------------------------------


class Server:
    """The node's server, which forks each request from itself; for a Ray worker, from the server of that Ray
    job (a child of this one, which imported Ray for it: `zygote`), to which it hands the request over."""

    def __init__(self, path: str):
        self.path, self.pid = path, os.getpid()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        os.chmod(path, 0o600)
        self.inode = os.stat(path).st_ino  # unlinked only while it is still this server's
        self.listener.listen(64)
        self.children: dict[int, socket.socket | None] = {}  # pid -> its agent's connection (None: gone)
        self.zygotes: dict[tuple[str, str], tuple[int, socket.socket]] = {}  # Ray job -> its server, channel
        self.ray_job: tuple[str, str] | None = None  # set in a Ray job's server
        self.declines: str | None = None  # why every request is declined (a Ray job's server that cannot fork)
        self.idle_since = time.monotonic()
        self._loop_fds()
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the loop: reaping happens there
        self.stopping = False
        self.ray_deps = False  # RAY_DEPS_PRELOAD imported (the node's server: when idle)

    def _loop_fds(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")

    def stop(self, *_) -> None:
        """SLURM's SIGTERM reaches every process of the step at once: the ranks decide for themselves what it
        means, so it only ends the server once no rank of its is left (none is, once Ray has stopped: a rank dies
        with its agent). New requests go the cold way meanwhile."""
        self.stopping = True

    def serve(self) -> Request:
        """Answers requests until one is this process's own: in a forked child, that request is returned."""
        while True:
            waiting_for_ray_deps = not self.ray_deps and self.ray_job is None and not self.stopping
            events = self.sel.select(timeout=IDLE_BEFORE_RAY_DEPS_S if waiting_for_ray_deps else 5.0)
            if not events and waiting_for_ray_deps:
                self._import_ray_deps()
            for key, _ in events:
                request = None
                if key.data == "accept":
                    request = self._next()
                elif key.data == "wake":
                    os.read(self.wake_r, 4096)
                else:
                    self._agent_gone(key.fileobj)
                if request is not None:
                    return request
            self._reap()
            if self.stopping or self._job_over():
                self._wind_down()

    def _next(self) -> Request | None:
        if self.ray_job is None:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return None  # the agent gave up before it was accepted
            return self._answered(conn)
        try:  # a Ray job's server: the request and its agent's connection come from the node's server
            request = self._read(self.listener, max_fds=3)
        except EOFError:
            self.stopping = True  # the node's server is ending
            return None
        except (OSError, ValueError):
            return None
        return self._answered(socket.socket(fileno=request.out_fds.pop(0)), request)

    def _import_ray_deps(self) -> None:
        self.ray_deps, start = True, time.monotonic()
        _import_recorded(RAY_DEPS_PRELOAD)
        print(
            f"warm interpreter: pid {self.pid} imported Ray's dependencies in {time.monotonic() - start:.1f} s",
            flush=True,
        )

    def _job_over(self) -> bool:
        """A Ray job's server ends once it has had no worker for a while (its job is likely over; a later
        worker of the job gets a new one) or its raylet is gone."""
        if self.ray_job is None or self.children:
            self.idle_since = time.monotonic()
            return False
        return time.monotonic() - self.idle_since > RAY_JOB_IDLE_S or not _alive(int(self.ray_job[1]))

    def _wind_down(self) -> None:
        if self.listener.fileno() >= 0:
            self.sel.unregister(self.listener)
            self.listener.close()
            with contextlib.suppress(OSError):
                if self.ray_job is None and os.stat(self.path).st_ino == self.inode:
                    os.unlink(self.path)
            for _, channel in self.zygotes.values():
                channel.close()  # each ends once its workers have
        if not self.children and not self.zygotes:
            # Not sys.exit: tearing down torch's modules (and a job's server's Ray, Ray Data and Ray Train) object
            # by object took the machine about a second per server, after its last worker had ended.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    def _answered(self, conn: socket.socket, request: Request | None = None) -> Request | None:
        """One request read, checked and forked, or declined: nothing a request holds may end the server, whose
        end would end every rank it forked on this node."""
        try:
            request = request or self._read(conn)
            why = request.decline_reason() or self.declines
            job = ray_job_of(request)
            if why is None and (job is None or self.ray_job is not None):
                return self._fork(conn, request)
            if why is None:
                why = self._hand_over(conn, request, job)
                if not why:
                    return None
        except _NowRayJobServer:
            return self._answered(conn, request)  # its first request
        except Exception as e:  # noqa: BLE001 - the request's fault or the machine's (EAGAIN at fork): declined
            why = f"{type(e).__name__}: {e}"
        _answer(conn, {"declined": why})
        conn.close()
        if request is not None:
            _close(request.out_fds)
        return None

    def _hand_over(self, conn: socket.socket, request: Request, job: tuple[str, str]) -> str:
        """The request to its Ray job's server, started for it if need be; "" once handed over."""
        if job not in self.zygotes:
            self._start_ray_job_server(job, request)  # which answers this first request itself
        else:
            channel = self.zygotes[job][1]
            try:
                socket.send_fds(channel, [struct.pack("!I", len(request.raw))], [conn.fileno(), *request.out_fds])
                channel.sendall(request.raw)
            except OSError as e:
                return f"the server of Ray job {job[0]} did not take it ({e})"
        conn.close()
        _close(request.out_fds)
        request.out_fds = []
        return ""

    @staticmethod
    def _read(conn: socket.socket, max_fds: int = 2) -> Request:
        deadline = time.monotonic() + READ_TIMEOUT_S
        conn.settimeout(READ_TIMEOUT_S)
        head, fds, _, _ = socket.recv_fds(conn, 4, max_fds)
        if not head and not fds:
            raise EOFError
        size = struct.unpack("!I", head)[0] if len(head) == 4 else 0
        if not fds or not 0 < size <= MAX_REQUEST:
            _close(fds)
            raise ValueError("a malformed request")
        body = b""
        while len(body) < size:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = conn.recv(size - len(body))
            if not chunk:
                _close(fds)
                raise ValueError("a truncated request")
            body += chunk
        try:
            request = Request(json.loads(body), fds)
        except Exception:
            _close(fds)
            raise
        request.raw = body
        return request

    def _forked(self) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        # Until the child has its own handlers, a signal must not run the server's in it (SLURM's SIGTERM reaches
        # every process of the step): blocked across the fork, pending in the child until it unblocks them.
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        try:
            return os.fork()
        finally:
            if os.getpid() == self.pid:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)

    def _fork(self, conn: socket.socket, request: Request) -> Request | None:
        pid = self._forked()
        if pid == 0:
            try:
                self._become_child(conn)
            except BaseException:
                os._exit(1)  # never a second server
            return request
        _close(request.out_fds)
        request.out_fds = []
        try:
            os.setpgid(pid, pid)  # the child does too: whichever runs first, a signal to the group finds it
        except OSError:
            pass
        self.children[pid] = conn
        _answer(conn, {"pid": pid})
        self.sel.register(conn, selectors.EVENT_READ, pid)
        return None

    def _start_ray_job_server(self, job: tuple[str, str], request: Request) -> None:
        """A child that imports Ray with the job's settings and then forks the job's workers on this node;
        in that child, raises _NowRayJobServer."""
        mine, theirs = socket.socketpair()
        pid = self._forked()
        if pid == 0:
            try:
                mine.close()
                self._become_ray_job_server(theirs, job, request.env)
            except BaseException:
                os._exit(1)  # never a second node server: this request's agent sees its connection close
            raise _NowRayJobServer
        theirs.close()
        self.zygotes[job] = (pid, mine)

    def _become_ray_job_server(self, channel: socket.socket, job: tuple[str, str], env: dict[str, str]) -> None:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != self.pid:
            os._exit(1)
        self._close_server_fds()
        self.pid, self.ray_job, self.listener = os.getpid(), job, channel
        self.children, self.zygotes = {}, {}
        self._loop_fds()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
        os.environ.clear()
        os.environ.update(env)
        ENV_BEFORE_IMPORT.clear()
        ENV_BEFORE_IMPORT.update(env)
        _import_recorded(RAY_JOB_PRELOAD, around=_actor_class_ids_from_urandom)
        READ_AT_IMPORT.update(RAY_READ_ONCE)
        print(f"warm interpreter: pid {self.pid} imported Ray for Ray job {job[0]} (raylet {job[1]})", flush=True)
        if self._ids_repeat_in_forks():
            self.declines = (
                "Ray's random IDs would repeat in every worker forked here (an import seeded their generator)"
            )
            print(f"warm interpreter: pid {self.pid} forks no worker: {self.declines}", flush=True)

    def _ids_repeat_in_forks(self) -> bool:
        """Whether two workers forked now would draw the same random Ray IDs. Ray's C++ side has one generator per
        process, seeded at its first draw; a fork copies it. Ray Train's workers would then send tasks under the
        same IDs to its synchronization actor, which crashes on the second (`Check failed: erased == 1`)."""
        ObjectRef = private_api.ObjectRef

        drawn = []
        for _ in range(2):
            r, w = os.pipe()
            pid = self._forked()  # the server's signals stay blocked in the child, which only draws and exits
            if pid == 0:
                try:
                    os.write(w, ObjectRef.from_random().binary())
                finally:
                    os._exit(0)  # never a second server: an empty answer counts as a repeat
            os.close(w)
            with os.fdopen(r, "rb") as f:
                drawn.append(f.read())
            os.waitpid(pid, 0)
        return drawn[0] == drawn[1]

    def _become_child(self, conn: socket.socket) -> None:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != self.pid:
            os._exit(1)  # the server died before the death signal was set: nobody would end this child
        os.setpgid(0, 0)  # a process group of its own: signals reach its DataLoader workers too
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
        conn.close()
        self._close_server_fds()

    def _close_server_fds(self) -> None:
        """In a forked child: the server's sockets, pipes and its children's connections are not the child's."""
        self.sel.close()
        for s in (self.listener, *self.children.values(), *(c for _, c in self.zygotes.values())):
            if s is not None:
                s.close()
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)

    def _agent_gone(self, conn) -> None:
        pid = next((p for p, c in self.children.items() if c is conn), None)
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.sel.unregister(conn)
        conn.close()
        if pid is not None:
            self.children[pid] = None  # reaped in _reap; nobody to tell

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for job, (zpid, channel) in list(self.zygotes.items()):
                if zpid == pid:
                    del self.zygotes[job]
                    channel.close()
            conn = self.children.pop(pid, None)
            if conn is not None:
                self.sel.unregister(conn)
                _answer(conn, {"exit": os.waitstatus_to_exitcode(status)})
                conn.close()


class _NowRayJobServer(Exception):
    """Raised in the child that has just become a Ray job's server (Server._start_ray_job_server)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _answer(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the agent is gone; its child is killed when the loop sees the connection close


# ---- the child: become the script --------------------------------------------------------------------------------


def become(request: Request, base_path: list[str]) -> None:
    """This forked process turns into `python script.py args` (or `python -m module args`) as a fresh
    interpreter would be: environment, directory, streams, argv, sys.path, thread count, fresh random state."""
    import io

    if request.niceness is not None:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, int(request.niceness))
        except OSError:
            pass
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(request.out_fds[0], 1)
    os.dup2(request.out_fds[-1], 2)
    _close([null, *(fd for fd in request.out_fds if fd > 2)])
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace"
    )
    global _returned_file
    _returned_file = request.env.pop(RETURNED_ENV, "")  # the agent's, not the script's
    os.environ.clear()
    os.environ.update(request.env)
    for key, value in SET_AT_IMPORT.items():
        os.environ.setdefault(key, value)
    os.chdir(request.cwd)
    sys.dont_write_bytecode = bool(request.env.get("PYTHONDONTWRITEBYTECODE"))
    if request.env.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable()
    first = os.path.dirname(os.path.realpath(request.script)) if request.script else os.getcwd()
    extra = [p for p in request.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *base_path]
    sys.argv = [request.script or "-m", *request.args]
    sys.orig_argv = list(request.argv)
    global _server_main
    _server_main = sys.modules["__main__"]  # kept: this module's functions still run
    sys.modules["__main__"] = types.ModuleType("__main__")  # the script's, or the module's: not the server's
    _fresh_numpy_and_threads(request.env, ray_worker=ray_job_of(request) is not None)
    _ray_settings_from_environment()


def _fresh_numpy_and_threads(env: dict[str, str], ray_worker: bool) -> None:
    import multiprocessing

    import numpy
    import torch

    numpy.random.seed()  # `random` reseeds itself in a forked child; numpy's global generator does not
    multiprocessing.current_process().authkey = os.urandom(32)  # made at import: the server's, on every rank
    torch.set_num_threads(_torch_threads(env, ray_worker))  # read at the OpenMP runtime's load: the server's


def _torch_threads(env: dict[str, str], ray_worker: bool) -> int:
    """The threads torch would have started with in a fresh process: OMP_NUM_THREADS, else one per CPU this
    process may use. A Ray worker gets its OMP_NUM_THREADS from Ray only when its first task starts (the CPUs the
    task holds, 1 when it holds none or one: ray._private.utils.set_omp_num_threads_if_unset), before that task
    imports torch: 1 here, the common case; raydist's training loop applies a larger value itself."""
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        return int(threads)
    return 1 if ray_worker else max(1, len(os.sched_getaffinity(0)))


def _ray_settings_from_environment() -> None:
    """In a worker forked by a Ray job's server: Ray's C++ side reads its settings again from this worker's
    environment, as ray.init does after setting one (ray._private.authentication), and forgets a cached token."""
    private_api.reread_ray_settings()


def _run_script(script: str) -> None:
    """As `python script.py` does: a fresh `__main__` whose __file__ is absolute (3.9+); argv[0] stays as given."""
    import builtins
    import importlib.machinery

    path = os.path.abspath(script)
    main = sys.modules["__main__"]
    main.__dict__.update(
        __file__=path,
        __cached__=None,
        __builtins__=builtins,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
    )
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


RETURNED_ENV = "RAYDIST_RETURNED_FILE"
"""Where a rank of raydist launch notes that its script has returned (raydist.launcher.agent reads it): what
follows is its way out, and a fault there is not a failed training run."""
_returned_file = ""


def _note_returned() -> None:
    if _returned_file:
        try:
            with open(_returned_file, "w"):
                pass
        except OSError:
            pass


def run(request: Request) -> None:
    """The script, as `python` runs it; its traceback shows its own frames only."""
    import runpy

    try:
        if request.module:
            runpy._run_module_as_main(request.module, alter_argv=True)
        else:
            _run_script(request.script)
        _note_returned()
    except SystemExit:
        _note_returned()  # as a fresh interpreter's rank_site notes it: sys.exit() ends the script too
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None and (
            tb.tb_frame.f_code in (run.__code__, _run_script.__code__)
            or tb.tb_frame.f_globals.get("__name__") == "runpy"
        ):
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        sys.exit(1)


@contextlib.contextmanager
def _actor_class_ids_from_urandom():
    """Meanwhile, `ray.remote` on a class takes its (otherwise unused) class ID from os.urandom instead of Ray's
    generator of random IDs. Ray Data defines actor classes as it is imported, and each draws an ID: the first draw
    seeds the process's one generator, which every fork would copy (Server._ids_repeat_in_forks). Where a later
    Ray draws elsewhere, that check still sees it, and the server forks nothing."""
    import ray.actor

    real = getattr(ray.actor, "ActorClassID", None)
    if real is None or not hasattr(real, "from_random"):
        yield
        return

    class FromUrandom:
        @staticmethod
        def from_random():
            try:
                return real(os.urandom(real.size()))
            except Exception:  # noqa: BLE001 - another Ray's IDs: draw as Ray does, which the check then sees
                return real.from_random()

    ray.actor.ActorClassID = FromUrandom
    try:
        yield
    finally:
        ray.actor.ActorClassID = real


def _import_recorded(names: tuple[str, ...], around=contextlib.nullcontext) -> None:
    """Ray's or its dependencies' modules, recording the settings they read (READ_AT_IMPORT); one that is missing is
    skipped (pyarrow and pandas come with ray[data], not ray). `around` is entered inside the recording: what it
    imports itself (Ray, for _actor_class_ids_from_urandom) is recorded too."""
    # fsspec unrecorded: it copies the whole environment at its import (to pick its FSSPEC_* settings out), which
    # would record every variable as read. Ray Data imports it.
    with contextlib.suppress(ImportError):
        __import__("fsspec")
    with _recording_reads(READ_AT_IMPORT), around():
        for name in names:
            with contextlib.suppress(ImportError):
                __import__(name)
    _note_set_at_import()


def _note_set_at_import() -> None:
    SET_AT_IMPORT.update({k: v for k, v in os.environ.items() if ENV_BEFORE_IMPORT.get(k) != v})


@contextlib.contextmanager
def _recording_reads(keys: set[str]):
    """Every environment variable read through os.environ (os.getenv too) meanwhile, into `keys`."""
    cls = os._Environ
    original = cls.__getitem__

    def recorded(self, key):
        keys.add(key)
        return original(self, key)

    cls.__getitem__ = recorded
    try:
        yield
    finally:
        cls.__getitem__ = original


def main(argv: list[str]) -> Request:
    if len(argv) not in (2, 4) or (len(argv) == 4 and (argv[2] != "--parent" or not argv[3].isdigit())):
        print("usage: python -m raydist.warm.server SOCKET_PATH [--parent PID]", file=sys.stderr)
        sys.exit(2)
    if len(argv) == 4:  # the embedded Ray instance's: it ends with the job's process
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != int(argv[3]):
            sys.exit(0)
    env_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path[1:] if p not in env_path]
    if os.path.exists(argv[1]):
        os.unlink(argv[1])  # a socket left by a server of this job that was killed
    # Listening before the imports: a request that comes meanwhile waits in the backlog, not the cold way.
    server = Server(argv[1])
    ENV_BEFORE_IMPORT.update(os.environ)
    with _recording_reads(READ_AT_IMPORT):
        for name in PRELOAD:
            __import__(name)
    _note_set_at_import()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, server.stop)
    print(f"warm interpreter: pid {os.getpid()}, torch imported, listening on {argv[1]}", flush=True)
    request = server.serve()
    become(request, base_path)
    return request


if __name__ == "__main__":
    run(main(sys.argv))
