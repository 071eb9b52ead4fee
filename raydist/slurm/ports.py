"""Per-job Ray port blocks derived from SLURM_JOB_ID, checked free, so jobs sharing a node do not collide."""

from __future__ import annotations

import dataclasses
import errno
import socket
from collections.abc import Callable, Iterator

from raydist.errors import RaydistError

# Offsets inside a job's block; the worker range fills the rest of the block.
HEAD_SERVICES = ("gcs", "dashboard", "client")
NODE_SERVICES = (
    "node_manager",
    "object_manager",
    "dashboard_agent_listen",
    "dashboard_agent_grpc",
    "metrics_export",
    "runtime_env_agent",
)
_OFFSETS = {name: i for i, name in enumerate(HEAD_SERVICES + NODE_SERVICES)}
WORKER_OFFSET = 16


@dataclasses.dataclass(frozen=True)
class PortBlock:
    """The ports of one slot: `start` .. `start + size - 1`."""

    start: int
    size: int

    def __post_init__(self):
        if self.size < WORKER_OFFSET + 2:
            raise RaydistError(f"a port block needs at least {WORKER_OFFSET + 2} ports (got {self.size})")

    def port(self, service: str) -> int:
        return self.start + _OFFSETS[service]

    @property
    def min_worker(self) -> int:
        return self.start + WORKER_OFFSET

    @property
    def max_worker(self) -> int:
        return self.start + self.size - 1

    def ports(self, head: bool) -> list[int]:
        """Every port this block binds on a node (the head also binds the GCS, dashboard and client ports)."""
        services = (HEAD_SERVICES if head else ()) + NODE_SERVICES
        return [self.port(s) for s in services] + list(range(self.min_worker, self.max_worker + 1))

    def ray_start_args(self, head: bool) -> list[str]:
        args = []
        if head:
            args += [
                f"--port={self.port('gcs')}",
                f"--dashboard-port={self.port('dashboard')}",
                f"--ray-client-server-port={self.port('client')}",
            ]
        args += [
            f"--node-manager-port={self.port('node_manager')}",
            f"--object-manager-port={self.port('object_manager')}",
            f"--dashboard-agent-listen-port={self.port('dashboard_agent_listen')}",
            f"--dashboard-agent-grpc-port={self.port('dashboard_agent_grpc')}",
            f"--metrics-export-port={self.port('metrics_export')}",
            f"--runtime-env-agent-port={self.port('runtime_env_agent')}",
            f"--min-worker-port={self.min_worker}",
            f"--max-worker-port={self.max_worker}",
        ]
        return args


def slot_count(base: int, end: int, size: int) -> int:
    n = (end - base + 1) // size
    if n < 1:
        raise RaydistError(f"port range {base}-{end} is smaller than one block of {size} ports")
    return n


def candidate_blocks(job_id: int, base: int, end: int, size: int) -> Iterator[PortBlock]:
    """Every block of the range, starting at the job's own slot (job id modulo the number of slots), so each job
    tries a different block first; when its own is busy, the slots of the jobs submitted before it, newest first.
    (Not the next ones: those are the own slots of jobs submitted after it, which may be starting at this moment,
    both seeing the block free; the earlier jobs' slots are taken already, or free for good.)"""
    n = slot_count(base, end, size)
    for k in range(n):
        yield PortBlock(base + ((job_id - k) % n) * size, size)


def port_is_free(port: int, host: str = "") -> bool:
    """Nothing listens on or holds `port` (a bind without SO_REUSEADDR also refuses ports in TIME_WAIT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def pick_block(
    job_id: int, base: int, end: int, size: int, head: bool, is_free: Callable[[int], bool] = port_is_free
) -> PortBlock:
    """The first candidate block whose ports are all free on this node."""
    for block in candidate_blocks(job_id, base, end, size):
        if all(is_free(p) for p in block.ports(head)):
            return block
    raise RaydistError(
        f"no free block of {size} ports in {base}-{end} on this node "
        f"(every slot is busy: other jobs, or a leftover Ray)"
    )
