"""A free port for a server raydist starts itself (the embedded dashboard, a launched group's MASTER_PORT).

A port the kernel hands out for `bind(0)` comes from the ephemeral range, the same range every outgoing connection
takes its source port from; on a machine busy with Ray's own connections, one of them took the port between our
check and the server's bind (seen in the suite: "Failed to bind to 127.0.0.1:46539 because it's already
occupied"). So pick from just below the ephemeral range and above raydist's SLURM port blocks
(`ports.end`, 31999 by default), where no outgoing socket lands.
"""

from __future__ import annotations

import random
import socket

LISTEN_RANGE = (32000, 32767)
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


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


def free_port(host: str = "127.0.0.1", tries: int = 64) -> int:
    """A port nothing listens on at `host`, outside the ephemeral range where possible."""
    for port in candidate_ports(ephemeral_low(), random.Random())[:tries]:
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a kernel whose ephemeral range covers ours, or every candidate busy
        s.bind((host, 0))
        return s.getsockname()[1]
