"""raydist.cluster.listen_port: the ports raydist's own listeners take, apart from the kernel's ephemeral range and
from each other."""

from __future__ import annotations

import pytest


def test_listen_ports_come_from_below_the_ephemeral_range():
    import random
    import socket

    from raydist.cluster.listen_port import LISTEN_RANGE, candidate_ports, ephemeral_low, free_port

    ports = candidate_ports(32768, random.Random(0))
    assert sorted(ports) == list(range(LISTEN_RANGE[0], LISTEN_RANGE[1] + 1)) and ports != sorted(ports)
    assert candidate_ports(32100, random.Random(0)) and max(candidate_ports(32100, random.Random(0))) == 32099
    assert candidate_ports(30000, random.Random(0)) == []  # a kernel whose ephemeral range starts lower
    port = free_port("127.0.0.1")
    if ephemeral_low() > LISTEN_RANGE[0]:
        assert LISTEN_RANGE[0] <= port < ephemeral_low()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free indeed


def test_a_port_one_raydist_process_picked_is_not_picked_by_another_until_its_claim_expires(tmp_path):
    import random

    from raydist.cluster.listen_port import CLAIM_TTL_S, LISTEN_RANGE, candidate_ports, claim, ephemeral_low, free_port

    if ephemeral_low() <= LISTEN_RANGE[0]:
        pytest.skip("this kernel's ephemeral range covers raydist's listen range")
    first = free_port("127.0.0.1", clock=lambda: 1000.0, directory=tmp_path)
    assert not claim(first, 1000.0 + CLAIM_TTL_S - 1, tmp_path)  # a second pick meanwhile skips it
    others = [p for p in candidate_ports(ephemeral_low(), random.Random(0)) if p != first]
    for p in others:
        assert claim(p, 5000.0, tmp_path)
    # every other port claimed just now; the first pick's claim has expired: it is the only one left
    assert free_port("127.0.0.1", tries=len(others) + 1, clock=lambda: 5001.0, directory=tmp_path) == first
