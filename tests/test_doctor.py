"""`raydist doctor`'s pure parts: verdicts from facts, facts from faked probes, bandwidth arithmetic, the table,
the exit line, bad input. Fast: no Ray, no SLURM (the end-to-end checks are in test_slurm_cluster.py)."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import sys

import pytest

from raydist.doctor import agent, bandwidth, checks, facts, report
from raydist.doctor.checks import FAIL, OK, SKIP, WARN, NodeFacts, Probe, Space
from raydist.slurm import netif

GiB = 2**30


def healthy(node: str = "node01", ip: str = "192.168.20.16", iface: str = "ens1f1", **changes) -> NodeFacts:
    base = dict(
        node=node,
        iface=iface,
        ip=ip,
        why="cluster config",
        operstate="UP",
        speed_mbps=10000,
        gloo_ifname=iface,
        nccl_ifname=f"={iface}",
        own_address=ip,
        peer_addresses={"master-node": "192.168.20.15"},
        shm=Space("/dev/shm", 4 * GiB, 8 * GiB),
        temp=Space("/tmp", 50 * GiB, 100 * GiB),
    )
    base.update(changes)
    return NodeFacts(**base)


CHOSEN = {"master-node": "192.168.20.15", "node01": "192.168.20.16"}


# ---- per-node verdicts ----------------------------------------------------------------------------------


def test_a_healthy_node_is_ok_on_every_row():
    f = healthy()
    rows = [
        checks.check_interface(f, "192.168.20.16"),
        checks.check_link_speed(f, None),
        checks.check_socket_env(f),
        checks.check_hostname(f, CHOSEN),
        checks.check_space("node01", "/dev/shm", f.shm, checks.SHM_FAIL, checks.SHM_WARN),
    ]
    assert [r.status for r in rows] == [OK] * 5, rows
    assert rows[0].value == "ens1f1 192.168.20.16"


def test_the_127_0_1_1_trap_fails_naming_the_node_and_the_fix():
    row = checks.check_hostname(healthy(own_address="127.0.1.1"), CHOSEN)
    assert row.status == FAIL and row.node == "node01" and row.value == "node01 -> 127.0.1.1"
    assert "loopback" in row.detail and "map it to 192.168.20.16" in row.detail
    # Without GLOO_SOCKET_IFNAME gloo would bind there: the socket env row fails too.
    row = checks.check_socket_env(healthy(own_address="127.0.1.1", gloo_ifname=None))
    assert row.status == FAIL and "loopback 127.0.1.1" in row.detail


def test_peer_names_resolving_elsewhere_warn():
    row = checks.check_hostname(healthy(peer_addresses={"master-node": "10.0.0.5"}), CHOSEN)
    assert row.status == WARN and "master-node -> 10.0.0.5 (chosen 192.168.20.15)" in row.detail
    row = checks.check_hostname(healthy(own_address=None, own_address_error="cannot resolve node01"), CHOSEN)
    assert row.status == WARN


def test_interface_rows_fail_on_choice_error_link_down_and_ray_on_another_address():
    assert checks.check_interface(healthy(iface=None, ip=None, choice_error="node01: no route"), None).status == FAIL
    down = checks.check_interface(healthy(operstate="DOWN"), "192.168.20.16")
    assert down.status == FAIL and "down" in down.detail
    other = checks.check_interface(healthy(), "172.17.0.1")
    assert other.status == FAIL and "172.17.0.1" in other.detail
    assert checks.check_interface(healthy(operstate="UNKNOWN"), None).status == OK


def test_link_speed_unknown_is_not_a_failure_but_a_slower_link_than_expected_is():
    assert checks.check_link_speed(healthy(speed_mbps=None), 100).status == OK
    slow = checks.check_link_speed(healthy(speed_mbps=1000), 100)
    assert slow.status == FAIL and "1 Gb/s" in slow.detail and "expected 100 Gb/s" in slow.detail
    assert checks.check_link_speed(healthy(speed_mbps=100000), 100).status == OK


@pytest.mark.parametrize(
    "gloo, nccl, status",
    [
        ("ens1f1", "=ens1f1", OK),
        ("ens1f1", "ens1", OK),
        ("ens1f1", None, OK),
        ("ens1f1", "^docker", OK),
        ("ens1f1", "=ens1f0", FAIL),
        ("docker0", "=ens1f1", FAIL),
        (None, None, WARN),
    ],
)
def test_socket_env(gloo, nccl, status):
    assert checks.check_socket_env(healthy(gloo_ifname=gloo, nccl_ifname=nccl)).status == status


@pytest.mark.parametrize("free, status", [(4 * GiB, OK), (512 * 2**20, WARN), (100 * 2**20, FAIL)])
def test_shm_space(free, status):
    assert (
        checks.check_space("n", "/dev/shm", Space("/dev/shm", free, 8 * GiB), checks.SHM_FAIL, checks.SHM_WARN).status
        == status
    )


def test_space_errors_fail_and_no_path_gives_no_row():
    row = checks.check_space(
        "n", "storage", Space("/shared/runs", error="No such file or directory"), checks.DISK_FAIL, checks.DISK_WARN
    )
    assert row.status == FAIL and "/shared/runs" in row.detail
    assert checks.check_space("n", "storage", None, 1, 2) is None


def test_clock_offset_takes_the_shortest_round_trip_and_subtracts_its_uncertainty():
    offset, unc = checks.best_offset([(100.0, 100.5, 101.0), (200.0, 202.01, 200.02)])
    assert offset == pytest.approx(2.0) and unc == pytest.approx(0.01)
    assert checks.check_clock("n", offset, unc).status == WARN
    assert checks.check_clock("n", 0.4, 0.001).status == OK
    assert checks.check_clock("n", 1.2, 0.5).status == OK  # could be round trip alone
    assert checks.check_clock("n", -45.0, 0.01).status == FAIL
    assert checks.check_clock("n", None, None).status == SKIP
    assert checks.best_offset([]) is None


def test_reachability_rows_and_who_nobody_reaches():
    matrix = {
        "master-node": {"node01": Probe(True, 0.3), "node02": Probe(False, error="no answer")},
        "node01": {"master-node": Probe(True, 0.2), "node02": Probe(False, error="no answer")},
        "node02": {"master-node": Probe(False, error="x"), "node01": Probe(False, error="x")},
    }
    rows = {n: checks.check_reachability(n, r) for n, r in matrix.items()}
    assert rows["master-node"].status == FAIL and rows["master-node"].value == "1/2 peers"
    assert "node02: no answer" in rows["master-node"].detail
    assert checks.unreachable_from(matrix) == {
        "node02": ["master-node", "node01"],
        "master-node": ["node02"],
        "node01": ["node02"],
    }
    ok = checks.check_reachability("a", {"b": Probe(True, 0.5), "c": Probe(True, 1.5)})
    assert ok.status == OK and "1.5 ms (c)" in ok.detail


# ---- bandwidth ------------------------------------------------------------------------------------------


def test_bus_bandwidth_is_the_ring_all_reduce_traffic_per_link():
    # 3 ranks, 1 GB buffer in 1 s: each link carries 2*(3-1)/3 GB -> 10.67 Gb/s.
    assert bandwidth.bus_bandwidth_gbps(10**9, 1.0, 3) == pytest.approx(2 * 2 / 3 * 8)
    assert bandwidth.bus_bandwidth_gbps(10**9, 1.0, 2) == pytest.approx(8.0)
    assert bandwidth.bus_bandwidth_gbps(10**9, 1.0, 1) == 0.0
    assert bandwidth.algo_bandwidth_gbps(125_000_000, 0.1) == pytest.approx(10.0)


def test_bound_comes_from_the_flag_else_the_slowest_known_link_else_none():
    assert checks.link_bound([10000, 25000], None) == (10.0, "link speed")
    assert checks.link_bound([10000, None], None) == (None, "unknown")
    assert checks.link_bound([None], 100.0) == (100.0, "--link-gbps")


def test_bandwidth_rows_never_fail_for_lack_of_a_bound():
    def row(*figure, min_ratio=checks.MIN_RATIO_DEFAULT, **named):
        return checks.check_bandwidth(checks.BandwidthFigure(*figure, **named), min_ratio)

    assert row("all", "all-reduce", 0.001, None, "unknown").status == OK
    assert row("all", "all-reduce", 9.0, 10.0, "link speed").status == OK
    assert row("all", "all-reduce", 3.0, 10.0, "link speed").status == WARN
    low = row("all", "all-reduce", 0.5, 10.0, "link speed")
    assert low.status == FAIL and "0.05 of 10 Gb/s (link speed)" in low.detail
    assert row("all", "all-reduce", 0.5, 10.0, "x", min_ratio=0).status == WARN
    assert row("n", "p2p -> m", None, None, "", error="timed out").status == FAIL


def test_timed_loops_on_a_one_rank_gloo_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        t = bandwidth.time_allreduce(4096, 2)
        assert t.nbytes == 4096 and t.iters == 2 and t.seconds > 0
        with pytest.raises(ValueError, match="two ranks"):
            bandwidth.time_ring_p2p(4096, 2)
    finally:
        dist.destroy_process_group()


# ---- facts through faked probes -------------------------------------------------------------------------


def fake_resolve(host: str) -> str:
    known = {"node01": "127.0.1.1", "master-node": "192.168.20.15"}
    if host not in known:
        raise netif.NetworkError(f"cannot resolve node name {host}")
    return known[host]


def fake_probes(**changes) -> facts.Probes:
    base = dict(
        choose=lambda w: netif.Choice("ens1f1", "192.168.20.16", "cluster config"),
        operstate=lambda i: "UP",
        speed_mbps=lambda i: None,
        resolve=fake_resolve,
        space=lambda p: Space(p, GiB, 2 * GiB),
        environ={"GLOO_SOCKET_IFNAME": "ens1f1"},
        temp_dir=lambda: "/tmp/raydist-7",
    )
    base.update(changes)
    return facts.Probes(**base)


WHERE = facts.Where(
    node="node01",
    head="master-node",
    head_ip="192.168.20.15",
    workers=("node01",),
    configured="ens1f1",
    peers=("master-node", "node03"),
    storage_path="/shared",
)


def test_gather_turns_failed_probes_into_facts():
    f = facts.gather(WHERE, fake_probes())
    assert (f.iface, f.ip, f.own_address, f.gloo_ifname, f.nccl_ifname) == (
        "ens1f1",
        "192.168.20.16",
        "127.0.1.1",
        "ens1f1",
        None,
    )
    assert f.peer_addresses == {"master-node": "192.168.20.15", "node03": None}
    assert f.temp.path == "/tmp/raydist-7" and f.storage.path == "/shared" and f.shm.path == "/dev/shm"
    assert checks.NodeFacts.from_dict(facts.as_dict(f)) == f  # survives the trip through Ray


def test_gather_records_a_failed_interface_choice():
    def no_route(w):
        raise netif.NetworkError("node01: no route to the head's address 192.168.20.15")

    f = facts.gather(WHERE, fake_probes(choose=no_route))
    assert f.iface is None and "no route" in f.choice_error and f.operstate is None


def test_the_head_of_a_single_node_cluster_picks_the_interface_holding_its_address(monkeypatch):
    addrs = {"lo": [ipaddress.IPv4Interface("127.0.0.1/8")], "eth0": [ipaddress.IPv4Interface("10.1.2.3/24")]}
    monkeypatch.setattr(netif, "local_addresses", lambda: addrs)
    monkeypatch.setattr(netif, "route_to", lambda ip: ("lo", ip))
    where = facts.Where(node="solo", head="solo", head_ip="10.1.2.3", workers=(), configured=None)
    assert facts._choose(where) == netif.Choice("eth0", "10.1.2.3", "holds the head address")


# ---- the agent's probe, on loopback ---------------------------------------------------------------------


def test_probe_connects_and_names_a_refusal():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        assert agent._probe("127.0.0.1", "127.0.0.1", s.getsockname()[1], 2.0).ok
        closed = s.getsockname()[1]
    bad = agent._probe("127.0.0.1", "127.0.0.1", closed, 2.0)
    assert not bad.ok and "refused" in bad.error


# ---- table, exit line, command line ---------------------------------------------------------------------


def test_table_and_exit_line_name_the_failing_rows():
    rows = [
        checks.Row("node01", "hostname", FAIL, "node01 -> 127.0.1.1", "loopback"),
        checks.Row("node02", "agent", FAIL, "-", "no answer"),
        checks.Row("master-node", "interface", OK, "ens1f1 192.168.20.15", ""),
        checks.Row("all", "all-reduce", WARN, "1 Gb/s", ""),
    ]
    text = report.table(rows)
    assert text.splitlines()[0].split() == ["NODE", "CHECK", "STATUS", "VALUE", "DETAIL"]
    assert "FAIL" in text and len(text.splitlines()) == 5
    assert checks.exit_line(rows) == "doctor: 2 check(s) failed: node01 hostname, node02 agent"
    assert checks.exit_line(rows[2:]) is None
    assert '"failing": [\n  "node01 hostname",\n  "node02 agent"\n ]' in report.as_json(rows)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--bytes", "lots"], "raydist: error: raydist doctor: argument --bytes: --bytes: must be a size"),
        (["--min-ratio", "2"], "raydist: error: raydist doctor: argument --min-ratio: must be between 0 and 1"),
        (["--timeout", "0"], "raydist: error: raydist doctor: argument --timeout: must be above 0"),
        (["--address", "http://10.0.0.1:8265"], "raydist: error: --address: give the GCS address host:port"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, expected):
    r = subprocess.run(
        [sys.executable, "-m", "raydist.cli", "doctor", *args], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(expected) and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_no_cluster_to_find_is_one_line_and_exit_1(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"job_dir: {tmp_path}/jobs\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-m", "raydist.cli", "doctor", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 1 and r.stderr.startswith("raydist: error: no running raydist cluster found"), r.stderr
