"""One request to a warm interpreter, read and checked: what it cannot fork exactly as a fresh interpreter would
start (another Python, interpreter options, a setting that acts at start-up), it declines."""

from __future__ import annotations

import os
import socket
import sys

from . import preload, wire

KEPT_PYTHON_VARS = frozenset(
    {"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE", "PYTHONBREAKPOINT"}
)
"""PYTHON* variables the child applies itself, or that Python reads later (PYTHONBREAKPOINT, which Ray sets for its
workers, at each breakpoint()); any other that differs from the server's acts at a fresh start and is declined."""
SAME_AS_SERVER = ("LD_PRELOAD", "LD_LIBRARY_PATH")
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
"""The preloaded modules' own settings among those they read (not HOME, PATH and the like, which some read only to
pass on): these must equal the server's for a fork to be the same process. From SYMPY_ on: what torch._dynamo's
import reads (sympy, mpmath, inductor's and its partitioner's config, the C++ compiler inductor would use, CI)."""
RECORDED_NAMES = ("TMPDIR", "TEMP", "TMP")
"""Recorded too: torch._dynamo's import fixes the temp dir (tempfile's, and inductor's cache dir in it)."""
READ_TIMEOUT_S = 10.0  # for a whole request: an agent sends it at once, and the server serves one at a time


class Request:
    """One child to start: what the agent sent, checked."""

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

    @classmethod
    def read(cls, conn: socket.socket, max_fds: int = 2) -> Request:
        """The next request on `conn` (raydist.warm.wire); its fds are closed if it is malformed."""
        data, fds, raw = wire.read_request(conn, max_fds, READ_TIMEOUT_S)
        try:
            request = cls(data, fds)
        except Exception:
            wire.close_fds(fds)
            raise
        request.raw = raw
        return request

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
        before, set_at_import = preload.ENV_BEFORE_IMPORT, preload.SET_AT_IMPORT
        differ = sorted(
            k
            for k in set(self.env) | set(before)
            if acts_at_start(k) and self.env.get(k) not in (before.get(k), set_at_import.get(k, "\0"))
        )
        if differ:
            return f"{', '.join(differ)} differ{'s' if len(differ) == 1 else ''} from the warm interpreter's"
        return None


def ray_job_of(request: Request) -> tuple[str, str] | None:
    """Ray's worker process, of which job under which raylet: the settings Ray's C++ side reads only once, as it
    is imported (ray/common/ray_internal_flag_def.h), so that only a server that imported Ray with them can fork
    that worker with Ray imported."""
    if request.script and os.path.basename(request.script) == "default_worker.py":
        job, raylet = request.env.get("RAY_JOB_ID"), request.env.get("RAY_RAYLET_PID")
        if job and raylet:
            return job, raylet
    return None


def acts_at_start(key: str) -> bool:
    """Whether a variable acts at a fresh start (Python's own, the dynamic loader's) or was one of the preloaded
    modules' settings read at their import: it must then equal the server's."""
    if key.startswith("PYTHON"):
        return key not in KEPT_PYTHON_VARS
    return key in SAME_AS_SERVER or (
        key in preload.READ_AT_IMPORT and (key.startswith(RECORDED_PREFIXES) or key in RECORDED_NAMES)
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
