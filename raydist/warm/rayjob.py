"""A Ray job's server: a child of the node's server that imported Ray with that job's settings, and forks the job's
Ray workers on the node (raydist.warm.worker_exec asks for them). Ray's C++ side reads the job's id and the
raylet's pid only at its import, so the node's server, which has not imported Ray, forks one per Ray job and hands
each of the job's requests on to it over a socket pair: the agent's connection and the output fds, then the
request's bytes (raydist.warm.wire)."""

from __future__ import annotations

import contextlib
import os
import socket
import time

from . import forking, preload, wire
from .loop import Became, Declined, Server
from .request import Request

RAY_JOB_PRELOAD = ("ray", "pyarrow", "pandas", "ray.data", "ray.train", "ray.train.torch")
"""What a Ray job's server imports, and with them what they import (gRPC, ...): Ray, and what Ray Train's
controller, its helper actors and its workers import next. Not in the node's server: Ray's C++ side reads settings
the raylet gives each worker (RAY_JOB_ID, RAY_RAYLET_PID) once, as it is imported (ray/common/ray_internal_flag_def.h).
Ray Data and Ray Train are imported without drawing a Ray ID (actor_class_ids_from_urandom). Ray Train's import
reads RAY_TRAIN_V2_ENABLED, which Ray Train gives its own actors: raydist gives it to every worker of its jobs
(raydist.warm.client.JOB_WIDE), so that the job's first worker on a node, the one this server takes its settings
from, has it as Ray Train's actors do."""
RAY_READ_ONCE = ("RAY_JOB_ID", "RAY_RAYLET_PID", "RAY_OVERRIDE_NODE_ID_FOR_TESTING")
RAY_JOB_IDLE_S = 60.0


class JobServers:
    """The node's server's side: each Ray job's server (its child) and the channel its requests go over."""

    def __init__(self):
        self.servers: dict[tuple[str, str], tuple[int, socket.socket]] = {}  # Ray job -> its server's pid, channel

    def __bool__(self) -> bool:
        return bool(self.servers)

    def hand_over(self, node: Server, conn: socket.socket, request: Request, job: tuple[str, str]) -> None:
        """The request to its Ray job's server, started for it if need be (in that new server, which answers
        this first request itself, raises Became); closed here once handed over."""
        if job not in self.servers:
            self.servers[job] = _start(node, job, conn, request)
        else:
            channel = self.servers[job][1]
            try:
                wire.send_request(channel, request.raw, [conn.fileno(), *request.out_fds])
            except OSError as e:
                raise Declined(f"the server of Ray job {job[0]} did not take it ({e})") from None
        conn.close()
        wire.close_fds(request.out_fds)
        request.out_fds = []

    def reaped(self, pid: int) -> None:
        for job, (server_pid, channel) in list(self.servers.items()):
            if server_pid == pid:
                del self.servers[job]
                channel.close()

    def close_channels(self) -> None:
        """Each server ends once its workers have (its channel closed: it is asked to stop)."""
        for _, channel in self.servers.values():
            channel.close()


def _start(node: Server, job: tuple[str, str], conn: socket.socket, request: Request) -> tuple[int, socket.socket]:
    mine, theirs = socket.socketpair()
    pid = forking.fork(node.pid)
    if pid == 0:
        try:
            mine.close()
            forking.dies_with_server(node.pid)
            node.close_fds()
            server = RayJobServer(theirs, job, request.env)
        except BaseException:
            os._exit(1)  # never a second node server: this request's agent sees its connection close
        raise Became(server, conn, request)
    theirs.close()
    return pid, mine


class RayJobServer(Server):
    """Forks the workers of one Ray job, whose requests come from the node's server over `channel`. It ends once it
    has had no worker for a while (its job is likely over; a later worker of the job gets a new one), when its
    raylet is gone, or when the node's server closes the channel."""

    def __init__(self, channel: socket.socket, job: tuple[str, str], env: dict[str, str]):
        super().__init__(channel)
        self.job = job
        self.handle_stop_signals()
        forking.unblock()
        os.environ.clear()
        os.environ.update(env)
        preload.ENV_BEFORE_IMPORT.clear()
        preload.ENV_BEFORE_IMPORT.update(env)
        preload.import_recorded(RAY_JOB_PRELOAD, around=actor_class_ids_from_urandom)
        preload.READ_AT_IMPORT.update(RAY_READ_ONCE)
        print(f"warm interpreter: pid {self.pid} imported Ray for Ray job {job[0]} (raylet {job[1]})", flush=True)
        if ids_repeat_in_forks(self.pid):
            self.declines = (
                "Ray's random IDs would repeat in every worker forked here (an import seeded their generator)"
            )
            print(f"warm interpreter: pid {self.pid} forks no worker: {self.declines}", flush=True)

    def _next(self) -> Request | None:
        try:  # the request and its agent's connection come from the node's server
            request = Request.read(self.listener, max_fds=3)
        except EOFError:
            self.stopping = True  # the node's server is ending
            return None
        except (OSError, ValueError):
            return None
        return self.answered(socket.socket(fileno=request.out_fds.pop(0)), request)

    def _over(self) -> bool:
        if self.children:
            self.idle_since = time.monotonic()
            return False
        return time.monotonic() - self.idle_since > RAY_JOB_IDLE_S or not _alive(int(self.job[1]))


def ids_repeat_in_forks(server_pid: int) -> bool:
    """Whether two workers forked now would draw the same random Ray IDs. Ray's C++ side has one generator per
    process, seeded at its first draw; a fork copies it. Ray Train's workers would then send tasks under the
    same IDs to its synchronization actor, which crashes on the second (`Check failed: erased == 1`)."""
    ObjectRef = preload.private_api.ObjectRef

    drawn = []
    for _ in range(2):
        r, w = os.pipe()
        pid = forking.fork(server_pid)  # the server's signals stay blocked in the child, which only draws and exits
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


@contextlib.contextmanager
def actor_class_ids_from_urandom():
    """Meanwhile, `ray.remote` on a class takes its (otherwise unused) class ID from os.urandom instead of Ray's
    generator of random IDs. Ray Data defines actor classes as it is imported, and each draws an ID: the first draw
    seeds the process's one generator, which every fork would copy (ids_repeat_in_forks). Where a later Ray draws
    elsewhere, that check still sees it, and the server forks nothing."""
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
