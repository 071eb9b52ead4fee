"""A free port for a server raydist starts itself (the embedded dashboard, a launched group's MASTER_PORT).

A port the kernel hands out for `bind(0)` comes from the ephemeral range, the same range every outgoing connection
takes its source port from; on a machine busy with Ray's own connections, one of them took the port between our
check and the server's bind (seen in the suite: "Failed to bind to 127.0.0.1:46539 because it's already
occupied"). So pick from just below the ephemeral range and above raydist's SLURM port blocks
(`ports.end`, 31999 by default), where no outgoing socket lands.

That range is small, and between our check and the server's bind (seconds: Ray's dashboard binds late in
`ray.init`) another raydist process on the machine can pick the same port; the suite's parallel workers did
("[Errno 98] ... ('127.0.0.1', 32417): address already in use"). So each pick is also claimed: a file per port
in a per-user directory holds the time it was picked, and no raydist process picks a port claimed less than
CLAIM_TTL_S ago. By then the server has bound it (a check sees it taken) or never will.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

LISTEN_RANGE = (32000, 32767)
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
CLAIM_TTL_S = 120.0


def candidate_ports(ephemeral_low: int, rng: random.Random) -> list[int]:
    """LISTEN_RANGE below the ephemeral range, shuffled; empty when the kernel's range starts lower."""
    ports = list(range(LISTEN_RANGE[0], min(LISTEN_RANGE[1] + 1, ephemeral_low)))
    rng.shuffle(ports)
    return ports


def ephemeral_low() -> int:
    try:
        with open(EPHEMERAL_RANGE_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def claims_dir() -> Path:
    # Not raydist-<number>: that is a SLURM job's temp dir, which the sweep removes once the job is gone.
    return Path(tempfile.gettempdir(), f"raydist-ports-{os.getuid()}")


def claim(port: int, now: float, directory: Path) -> bool:
    """Claim `port` at time `now`: False while another pick's claim on it is younger than CLAIM_TTL_S.
    A directory that cannot be used claims nothing and refuses nothing (the bind check alone then decides)."""
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(directory / str(port), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # read, compare and write as one step; held for microseconds
        try:
            last = float(os.read(fd, 64) or b"-inf")
        except ValueError:
            last = float("-inf")
        if 0 <= now - last < CLAIM_TTL_S:
            return False
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, repr(now).encode())
        return True
    finally:
        os.close(fd)  # releases the lock


def free_port(
    host: str = "127.0.0.1", tries: int = 64, clock: Callable[[], float] = time.time, directory: Path | None = None
) -> int:
    """A port nothing listens on at `host` and no other raydist process picked lately, outside the ephemeral range
    where possible."""
    directory = directory or claims_dir()
    for port in candidate_ports(ephemeral_low(), random.Random())[:tries]:
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        if claim(port, clock(), directory):
            return port
    with socket.socket() as s:  # a kernel whose ephemeral range covers ours, or every candidate busy
        s.bind((host, 0))
        return s.getsockname()[1]
