"""A warm interpreter's loop: it accepts requests, forks each child it can start as a fresh interpreter would,
tells the agent its pid and later its exit code, and kills the child's process group when the agent's connection
closes first (the agent died): the rank dies with its agent, as PR_SET_PDEATHSIG gives a rank started the cold
way. The node's server (raydist.warm.node) and a Ray job's server (raydist.warm.rayjob) are two kinds of it."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import sys
import time

from . import child, forking, wire
from .request import Request

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
WAIT_S = 5.0  # the longest select: a signal (SIGCHLD too) wakes it earlier


class Declined(Exception):
    """A request the server cannot take, and why."""


class Became(BaseException):
    """Raised in a forked child that has become another server (a Ray job's: raydist.warm.rayjob), out of the
    loop of the server it was forked from; `conn` and `request` are the request it was forked for, which it
    answers first. A BaseException: nothing between the fork and serve() may take it for a failed request."""

    def __init__(self, server: Server, conn: socket.socket, request: Request):
        super().__init__()
        self.server, self.conn, self.request = server, conn, request


def serve(server: Server) -> Request:
    """Requests answered until one is this process's own: in a forked child, that request is returned."""
    while True:
        try:
            return server.serve()
        except Became as became:
            server, conn, first = became.server, became.conn, became.request
        # Outside the handler: a child forked next must not be handling an exception when it becomes the script.
        request = server.answered(conn, first)
        if request is not None:
            return request


class Server:
    """The loop on `listener`; what a request is read from, which ones it forks itself and when it ends are the
    subclass's."""

    def __init__(self, listener: socket.socket):
        self.pid, self.listener = os.getpid(), listener
        self.children: dict[int, socket.socket | None] = {}  # pid -> its agent's connection (None: gone)
        self.declines: str | None = None  # why every request is declined (a Ray job's server that cannot fork)
        self.idle_since = time.monotonic()
        self.stopping = False
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the loop: reaping happens there

    def handle_stop_signals(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self.stop)

    def stop(self, *_) -> None:
        """SLURM's SIGTERM reaches every process of the step at once: the ranks decide for themselves what it
        means, so it only ends the server once no rank of its is left (none is, once Ray has stopped: a rank dies
        with its agent). New requests go the cold way meanwhile."""
        self.stopping = True

    def serve(self) -> Request:
        while True:
            idle_s = self._idle_work_after()
            events = self.sel.select(timeout=WAIT_S if idle_s is None else idle_s)
            if not events and idle_s is not None:
                self._idle_work()
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
            if self.stopping or self._over():
                self._wind_down()

    def answered(self, conn: socket.socket, request: Request | None = None) -> Request | None:
        """One request read, checked and forked, or declined: nothing a request holds may end the server, whose
        end would end every rank it forked on this node."""
        try:
            request = request or Request.read(conn)
            why = request.decline_reason() or self.declines
            if why is None:
                return self._take(conn, request)
        except Declined as e:
            why = str(e)
        except Exception as e:  # noqa: BLE001 - the request's fault or the machine's (EAGAIN at fork): declined
            why = f"{type(e).__name__}: {e}"
        _answer(conn, {"declined": why})
        conn.close()
        if request is not None:
            wire.close_fds(request.out_fds)
        return None

    def fork(self, conn: socket.socket, request: Request) -> Request | None:
        """The child that becomes the request's script: in it, the request is returned."""
        pid = forking.fork(self.pid)
        if pid == 0:
            try:
                forking.dies_with_server(self.pid)
                os.setpgid(0, 0)  # a process group of its own: signals reach its DataLoader workers too
                child.fresh_signals()
                conn.close()
                self.close_fds()
            except BaseException:
                os._exit(1)  # never a second server
            return request
        wire.close_fds(request.out_fds)
        request.out_fds = []
        try:
            os.setpgid(pid, pid)  # the child does too: whichever runs first, a signal to the group finds it
        except OSError:
            pass
        self.children[pid] = conn
        _answer(conn, {"pid": pid})
        self.sel.register(conn, selectors.EVENT_READ, pid)
        return None

    def close_fds(self) -> None:
        """In a forked child: the server's sockets, pipes and its children's connections are not the child's."""
        self.sel.close()
        for s in (self.listener, *self.children.values()):
            if s is not None:
                s.close()
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)

    # ---- what the kinds of server differ in ----

    def _next(self) -> Request | None:
        """The listener is readable: the next request answered (in a forked child: returned)."""
        raise NotImplementedError

    def _take(self, conn: socket.socket, request: Request) -> Request | None:
        """A request it can run: forked (in the child: returned), or handed on. Declined: raise Declined."""
        return self.fork(conn, request)

    def _idle_work_after(self) -> float | None:
        """How long the loop waits before it does its idle work (None: it has none)."""
        return None

    def _idle_work(self) -> None:
        pass

    def _over(self) -> bool:
        """Whether it ends now that it is not asked to stop (it then ends once its children have)."""
        return False

    def _stopped_listening(self) -> None:
        pass

    def _all_ended(self) -> bool:
        return not self.children

    def _reaped(self, pid: int) -> None:
        pass

    # ---- children and their agents ----

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
            self._reaped(pid)
            conn = self.children.pop(pid, None)
            if conn is not None:
                self.sel.unregister(conn)
                _answer(conn, {"exit": os.waitstatus_to_exitcode(status)})
                conn.close()

    def _wind_down(self) -> None:
        if self.listener.fileno() >= 0:
            self.sel.unregister(self.listener)
            self.listener.close()
            self._stopped_listening()
        if self._all_ended():
            # Not sys.exit: tearing down torch's modules (and a job's server's Ray, Ray Data and Ray Train) object
            # by object took the machine about a second per server, after its last worker had ended.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


def _answer(conn: socket.socket, message: dict) -> None:
    try:
        wire.send_answer(conn, message)
    except OSError:
        pass  # the agent is gone; its child is killed when the loop sees the connection close
