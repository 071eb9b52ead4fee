"""The emulated cluster's links can be shaped like an Ethernet cluster's (tests/support/cluster/emucluster.py `shape`):
shaped links really limit bandwidth, and two senders into one host share its link (the fan-in a parameter server
sees)."""

from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

RATE_MBIT = 200
TOOL = "tests/support/cluster/throughput.py"


def _goodput(cluster, receiver: str, senders: list[str], mbytes: int, port: int = 5601) -> float:
    """Mbit/s the receiver took in from all senders together."""
    ip = cluster.hosts[receiver].ip
    rx = cluster.popen(
        receiver, ["python3", TOOL, "recv", str(port), str(len(senders))], stdout=subprocess.PIPE, text=True
    )
    tx = []
    try:
        assert rx.stdout.readline().strip() == "listening"
        tx = [cluster.popen(s, ["python3", TOOL, "send", ip, str(port), str(mbytes)]) for s in senders]
        out, _ = rx.communicate(timeout=120)
    finally:
        for p in (rx, *tx):
            if p.poll() is None:
                p.kill()  # nsenter's process: the tool itself ends when its peer's socket closes
            p.wait(timeout=30)
    return json.loads(out)["mbit_s"]


def test_a_shaped_link_carries_its_rate_and_fan_in_shares_the_receivers_link(slurm_cluster):
    c = slurm_cluster
    try:
        c.shape(RATE_MBIT)
        one = _goodput(c, "node02", ["node01"], mbytes=40)
        two = _goodput(c, "node02", ["node01", "master-node"], mbytes=20)
    finally:
        c.shape(None)
    free = _goodput(c, "node02", ["node01"], mbytes=100)
    print(
        f"\nshaped links at {RATE_MBIT} Mbit/s: one sender {one:.0f}, two senders into one host {two:.0f} together, "
        f"unshaped {free:.0f} Mbit/s"
    )
    # TCP goodput under a token bucket counted in wire bytes: under the rate, never over it by much. The floor is
    # loose: on a loaded 2-core machine the sending and receiving processes wait for a core too (a suite run saw 0.77
    # of the rate), and the floor only shows that the shaped link carries traffic at all.
    assert 0.5 * RATE_MBIT <= one <= 1.05 * RATE_MBIT, one
    assert 0.5 * RATE_MBIT <= two <= 1.05 * RATE_MBIT, two  # the receiver's link is the bottleneck
    assert free > 2 * RATE_MBIT, free  # and the limit is gone again for the tests after this one
