"""The node's server: listens on the Unix socket agents and Ray's stand-in workers connect to, forks ranks itself,
and hands each Ray worker on to its Ray job's server (raydist.warm.rayjob)."""

from __future__ import annotations

import contextlib
import os
import socket
import time

from . import preload
from .loop import Server
from .rayjob import JobServers
from .request import Request, ray_job_of

IDLE_BEFORE_RAY_DEPS_S = 0.5
"""How long the node's server waits, idle after torch's import, before it imports Ray's dependencies
(raydist.warm.preload.RAY_DEPS_PRELOAD): a rank asked for meanwhile is forked first."""


class NodeServer(Server):
    """The node's server, which forks each request from itself; for a Ray worker, from the server of that Ray job,
    to which it hands the request over."""

    def __init__(self, path: str):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        os.chmod(path, 0o600)
        self.path, self.inode = path, os.stat(path).st_ino  # unlinked only while it is still this server's
        listener.listen(64)
        super().__init__(listener)
        self.job_servers = JobServers()
        self.ray_deps = False  # RAY_DEPS_PRELOAD imported (when idle)

    def close_fds(self) -> None:
        super().close_fds()
        self.job_servers.close_channels()

    def _next(self) -> Request | None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return None  # the agent gave up before it was accepted
        return self.answered(conn)

    def _take(self, conn: socket.socket, request: Request) -> Request | None:
        job = ray_job_of(request)
        if job is None:
            return self.fork(conn, request)
        self.job_servers.hand_over(self, conn, request, job)
        return None

    def _idle_work_after(self) -> float | None:
        return None if self.ray_deps or self.stopping else IDLE_BEFORE_RAY_DEPS_S

    def _idle_work(self) -> None:
        self.ray_deps, start = True, time.monotonic()
        preload.import_recorded(preload.RAY_DEPS_PRELOAD)
        print(
            f"warm interpreter: pid {self.pid} imported Ray's dependencies in {time.monotonic() - start:.1f} s",
            flush=True,
        )

    def _stopped_listening(self) -> None:
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        self.job_servers.close_channels()

    def _all_ended(self) -> bool:
        return super()._all_ended() and not self.job_servers

    def _reaped(self, pid: int) -> None:
        self.job_servers.reaped(pid)
