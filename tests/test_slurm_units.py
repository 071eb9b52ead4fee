"""Unit tests of the pure parts of raydist.slurm: node lists, interface choice, ports, config, connection, teardown."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from raydist.cluster import connection
from raydist.errors import ConfigError, RaydistError
from raydist.slurm import netif, ports, readiness, settings, sweep, teardown
from raydist.slurm.bringup import private_dir
from raydist.slurm.jobdir import JobDir, Plan
from raydist.slurm.nodes import Allocation, cpus_from_env, expand_hostlist, gpus_from_env

REPO = Path(__file__).resolve().parents[1]


# ---- node lists ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hostlist, expected",
    [
        ("master-node", ["master-node"]),
        ("master-node,node[01-02]", ["master-node", "node01", "node02"]),
        ("node[08-10]", ["node08", "node09", "node10"]),
        ("gpu[1-2,5]", ["gpu1", "gpu2", "gpu5"]),
        ("rack[1-2]-n[0-1]", ["rack1-n0", "rack1-n1", "rack2-n0", "rack2-n1"]),
        ("a,b,a", ["a", "b"]),
    ],
)
def test_expand_hostlist(hostlist, expected):
    assert expand_hostlist(hostlist) == expected


@pytest.mark.parametrize("bad", ["node[1-2", "node1-2]", "node[a-b]", "node[5-1]"])
def test_expand_hostlist_rejects_malformed_lists(bad):
    with pytest.raises(RaydistError, match="bad SLURM hostlist"):
        expand_hostlist(bad)


def test_resources_come_from_the_allocation_not_the_machine():
    assert cpus_from_env({"SLURM_CPUS_PER_TASK": "8", "SLURM_CPUS_ON_NODE": "32"}) == 8
    assert cpus_from_env({"SLURM_CPUS_ON_NODE": "4"}) == 4
    assert gpus_from_env({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_GPUS_ON_NODE": "8"}) == 2
    assert gpus_from_env({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert gpus_from_env({"SLURM_GPUS_PER_NODE": "a100:4"}) == 4
    assert gpus_from_env({}) == 0


def test_allocation_from_slurm_environment():
    env = {
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "master-node,node[01-02]",
        "SLURMD_NODENAME": "node01",
        "SLURM_CPUS_PER_TASK": "2",
        "SLURM_SUBMIT_HOST": "login1",
        "SLURM_JOB_USER": "ana",
    }
    a = Allocation.from_env(env, expand=expand_hostlist)
    assert (a.job_id, a.head, a.workers, a.this_node, a.cpus, a.gpus) == (
        42,
        "master-node",
        ("node01", "node02"),
        "node01",
        2,
        0,
    )
    with pytest.raises(RaydistError, match="not inside a SLURM job"):
        Allocation.from_env({}, expand=expand_hostlist)


# ---- interface choice ------------------------------------------------------------------------------------

PROC_NET_ROUTE = textwrap.dedent("""\
    Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
    eno1\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0
    eno1\t0000000A\t00000000\t0001\t0\t0\t100\t0000FFFF\t0\t0\t0
    ens1f1\t0014A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
    docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
    ib0\t0014A8C0\t00000000\t0001\t0\t0\t50\t00FFFFFF\t0\t0\t0
    down0\t0015A8C0\t00000000\t0000\t0\t0\t0\t00FFFFFF\t0\t0\t0
    """)


def test_route_lookup_takes_the_longest_prefix_then_the_lowest_metric():
    routes = netif.parse_proc_net_route(PROC_NET_ROUTE)
    assert netif.route_lookup(routes, "192.168.20.15") == "ens1f1"  # /24 beats the default; metric 0 beats ib0's 50
    assert netif.route_lookup(routes, "10.0.3.4") == "eno1"
    assert netif.route_lookup(routes, "8.8.8.8") == "eno1"  # the default route
    assert netif.route_lookup(routes, "192.168.21.1") == "eno1"  # down0's route is not up
    assert netif.route_lookup([r for r in routes if r.iface == "docker0"], "8.8.8.8") is None


ADDRS = {
    "lo": [ipaddress.IPv4Interface("127.0.0.1/8")],
    "docker0": [ipaddress.IPv4Interface("172.17.0.1/16")],
    "ens1f0np0": [ipaddress.IPv4Interface("192.168.20.17/24")],
    "ib0": [],
}


def test_ip_json_parsing():
    data = [
        {
            "ifname": "lo",
            "addr_info": [
                {"family": "inet", "local": "127.0.0.1", "prefixlen": 8},
                {"family": "inet6", "local": "::1", "prefixlen": 128},
            ],
        },
        {"ifname": "ens1f1", "addr_info": [{"family": "inet", "local": "192.168.20.15", "prefixlen": 24}]},
        {"ifname": "ib0"},
    ]
    assert netif.parse_ip_addr_json(data) == {
        "lo": [ipaddress.IPv4Interface("127.0.0.1/8")],
        "ens1f1": [ipaddress.IPv4Interface("192.168.20.15/24")],
        "ib0": [],
    }
    assert netif.parse_route_get_json([{"dst": "192.168.20.15", "dev": "ens1f0np0", "prefsrc": "192.168.20.17"}]) == (
        "ens1f0np0",
        "192.168.20.17",
    )
    assert netif.parse_route_get_json([]) is None


def test_automatic_choice_is_the_interface_carrying_the_route_to_the_head():
    c = netif.choose("node02", ADDRS, head_ip="192.168.20.15", route=("ens1f0np0", "192.168.20.17"))
    assert (c.iface, c.ip) == ("ens1f0np0", "192.168.20.17")
    # On the head the route to its own address is local; the answer is the interface that holds it.
    addrs = {**ADDRS, "ens1f1": [ipaddress.IPv4Interface("192.168.20.15/24")]}
    c = netif.choose("master-node", addrs, head_ip="192.168.20.15", route=("lo", "192.168.20.15"))
    assert (c.iface, c.ip) == ("ens1f1", "192.168.20.15")


def test_configured_interface_wins_and_a_missing_one_names_node_and_interface():
    c = netif.choose("node02", ADDRS, configured="ens1f0np0", head_ip="192.168.20.15")
    assert (c.iface, c.ip, c.why) == ("ens1f0np0", "192.168.20.17", "cluster config")
    with pytest.raises(netif.NetworkError) as e:
        netif.choose("node02", ADDRS, configured="ens1f1", head_ip="192.168.20.15")
    assert "node02" in str(e.value) and "ens1f1" in str(e.value) and "ens1f0np0" in str(e.value)
    with pytest.raises(netif.NetworkError, match="ib0 .*no IPv4"):
        netif.choose("node02", ADDRS, configured="ib0")


def test_no_route_to_the_head_is_an_error_naming_the_node():
    with pytest.raises(netif.NetworkError, match="node02: no route to the head"):
        netif.choose("node02", ADDRS, head_ip="10.9.9.9", route=None)


def test_a_loopback_head_address_is_refused_on_this_machine():
    with pytest.raises(netif.NetworkError, match="loopback"):
        netif.choose_here("here", configured=None, head_ip="127.0.0.1")


# ---- ports ------------------------------------------------------------------------------------------------


def test_port_blocks_derive_from_the_job_id_and_wrap_around():
    first = [b.start for b in ports.candidate_blocks(7, 20000, 20999, 100)]
    assert first[0] == 20700 and first[1] == 20600 and first[7] == 20000 and first[8] == 20900 and len(first) == 10
    assert len(set(first)) == 10
    # Two jobs whose ids differ by less than the number of slots never start on the same block.
    assert len({next(ports.candidate_blocks(j, 20000, 31999, 400)).start for j in range(100, 130)}) == 30


def test_port_block_layout():
    b = ports.PortBlock(20400, 400)
    head, worker = b.ports(head=True), b.ports(head=False)
    assert len(head) == len(set(head)) and set(worker) < set(head)
    assert all(20400 <= p <= 20799 for p in head)
    assert b.port("gcs") == 20400 and b.port("dashboard") == 20401 and (b.min_worker, b.max_worker) == (20416, 20799)
    args = b.ray_start_args(head=True)
    assert "--port=20400" in args and "--dashboard-port=20401" in args and "--max-worker-port=20799" in args
    assert not any(a.startswith("--port=") for a in b.ray_start_args(head=False))


def test_a_busy_port_moves_the_job_to_an_earlier_jobs_free_block_not_a_later_ones():
    busy = {20700 + 5}
    b = ports.pick_block(7, 20000, 20999, 100, head=True, is_free=lambda p: p not in busy)
    assert b.start == 20600  # job 8's own block, 20800, may be starting this very moment
    with pytest.raises(RaydistError, match="no free block"):
        ports.pick_block(7, 20000, 20999, 100, head=True, is_free=lambda p: False)


def test_port_is_free_sees_a_listening_socket():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not ports.port_is_free(port)


# ---- cluster config -----------------------------------------------------------------------------------


def test_shipped_cluster_config_loads_with_the_seeds_interfaces():
    cfg = settings.load(str(REPO / "cluster" / "cluster.yaml"))
    assert cfg.interfaces == {"master-node": "ens1f1", "node01": "ens1f1", "node02": "ens1f0np0"}
    assert cfg.dashboard_host == "cluster" and cfg.object_store_memory == 2 * 10**9


def test_config_expands_hostlists_and_sizes():
    cfg = settings.from_dict(
        {
            "interfaces": {"gpu[01-03]": "ib0"},
            "object_store_memory": "512MiB",
            "ports": {"base": 30000, "end": 30999, "block": 100},
        }
    )
    assert cfg.interface_for("gpu02") == "ib0" and cfg.interface_for("cpu1") is None
    assert cfg.object_store_memory == 512 * 2**20 and cfg.ports.block == 100
    assert cfg.temp_path(9) == Path("/tmp/raydist-9")


@pytest.mark.parametrize(
    "data, message",
    [
        ({"interface": {}}, "unknown key 'interface' \\(did you mean 'interfaces'"),
        ({"interfaces": {"n1": "a b"}}, "not an interface name"),
        ({"object_store_memory": "lots"}, "must be a size"),
        ({"object_store_memory": "1MB"}, "at least 75MiB"),
        ({"dashboard_host": "everywhere"}, "dashboard_host"),
        ({"ports": {"base": 50000, "end": 40000}}, "base < end"),
        ({"ports": {"blok": 4}}, "unknown key 'ports.blok'"),
        ({"timeouts": {"ready": -1}}, "timeouts.ready: must be > 0"),
        ({"temp_dir": "tmp"}, "absolute"),
        ({"ports": {"block": 4}}, "ports.block: must be >= 18 \\(got 4\\)"),
        ({"ports": {"base": 30000, "end": 30009}}, "ports.block: must be at most the size of the range"),
        ({"source": "me"}, "unknown key 'source'"),  # set by the loader, not the user
    ],
)
def test_config_errors_are_one_line(data, message):
    with pytest.raises(ConfigError, match=message) as e:
        settings.from_dict(data)
    assert "\n" not in str(e.value)


def test_config_file_errors_name_the_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("ports: [1, 2\n")
    with pytest.raises(ConfigError, match=f"cannot parse {p}"):
        settings.load(str(p))
    with pytest.raises(ConfigError, match="not found"):
        settings.load(str(tmp_path / "missing.yaml"))
    p.write_text("ports:\n  base: 50000\n  end: 40000\n")
    with pytest.raises(ConfigError, match=f"^{p}: ports: need base < end"):
        settings.load(str(p))


def test_cluster_config_takes_overrides_like_the_run_config(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("timeouts:\n  ready: 60\n")
    cfg = settings.load(str(p), ["timeouts.ready=90", "object_store_memory=1GiB"])
    assert cfg.timeouts.ready == 90.0 and cfg.object_store_memory == 2**30 and cfg.source == str(p)


# ---- job dir, connection file ---------------------------------------------------------------------------


def _plan(tmp_path: Path, **kw) -> Plan:
    base = dict(
        job_id=42,
        nodes=("master-node", "node01"),
        head="master-node",
        head_ip="127.0.0.1",
        head_iface="lo",
        head_why="test",
        block_start=20000,
        block_size=400,
        dashboard_host="127.0.0.1",
        temp_dir=str(tmp_path / "raydist-42"),
        token_path=str(tmp_path / "job" / "token"),
        object_store_memory=None,
        login_host="login1",
        config_source="test",
    )
    base.update(kw)
    return Plan(**base)


def test_job_dir_is_private_and_the_token_0600(tmp_path):
    jd = JobDir(tmp_path / "jobs" / "42")
    jd.create()
    jd.write_token()
    assert stat.S_IMODE(jd.path.stat().st_mode) == 0o700
    assert stat.S_IMODE(jd.token.stat().st_mode) == 0o600
    assert len(jd.read_token()) == 64
    with pytest.raises(RaydistError, match="already exists"):
        jd.create()


def test_connection_file_round_trip_and_export_lines(tmp_path):
    conn = readiness.connection_for(_plan(tmp_path), user="ana")
    path = tmp_path / "connection.env"
    conn.write(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = connection.read(path)
    assert again == conn
    assert conn.dashboard_url == "http://127.0.0.1:20001" and conn.gcs_address == "127.0.0.1:20000"
    assert conn.tunnel == "ssh -N -L 20001:127.0.0.1:20001 ana@login1"
    out = subprocess.run(["bash", "-c", f"{conn.export_lines(path)}\nenv"], capture_output=True, text=True).stdout
    assert "RAY_ADDRESS=http://127.0.0.1:20001" in out and "RAY_AUTH_MODE=token" in out
    assert f"RAYDIST_CONNECTION={path}" in out
    # Sourcing the file itself gives the same values.
    out = subprocess.run(["bash", "-c", f"set -a; . {path}; env"], capture_output=True, text=True).stdout
    assert "RAYDIST_TUNNEL=ssh -N -L 20001:127.0.0.1:20001 ana@login1" in out


def test_a_driver_started_after_raydist_env_joins_the_gcs_the_connection_file_names(tmp_path, monkeypatch):
    from raydist.driver.preflight import join_address

    conn = readiness.connection_for(_plan(tmp_path), user="ana")
    path = tmp_path / "connection.env"
    conn.write(path)
    monkeypatch.setenv("RAY_ADDRESS", conn.dashboard_url)  # what `eval "$(raydist env)"` exports, for ray job submit
    monkeypatch.setenv("RAYDIST_CONNECTION", str(path))
    assert join_address("") == "127.0.0.1:20000"  # a job or raydist launch started by hand joins the GCS
    assert join_address("10.0.0.5:6379") == "10.0.0.5:6379"  # an address given explicitly wins
    monkeypatch.delenv("RAYDIST_CONNECTION")
    assert join_address("") == conn.dashboard_url  # refused later, in one line (address_host_port)
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert join_address("") == ""


def test_connection_lookup(tmp_path, monkeypatch):
    monkeypatch.delenv(connection.CONNECTION_ENV, raising=False)
    with pytest.raises(RaydistError, match="no running raydist cluster"):
        connection.find(tmp_path)
    for job in (7, 8):
        (tmp_path / str(job)).mkdir()
        (tmp_path / str(job) / "connection.env").write_text("")
        os.utime(tmp_path / str(job) / "connection.env", (job, job))
    assert connection.find(tmp_path).parent.name == "8"
    assert connection.find(tmp_path, job_id=7).parent.name == "7"
    with pytest.raises(RaydistError, match="no connection file for job 9"):
        connection.find(tmp_path, job_id=9)


# ---- readiness ------------------------------------------------------------------------------------------


def _job_dir(tmp_path: Path, **plan_kw) -> JobDir:
    jd = JobDir(tmp_path / "job")
    jd.create()
    jd.write_token()
    with socket.socket() as s:  # a port nobody listens on: the dashboard is "not up"
        s.bind(("127.0.0.1", 0))
        start = s.getsockname()[1]
    jd.write_plan(_plan(tmp_path, block_start=start - 1, **plan_kw))
    return jd


def test_missing_nodes_are_described_by_what_is_known_of_them():
    text = readiness.describe_missing(
        ["master-node", "node01", "node02"],
        {
            "master-node": {"state": "started", "pid": 5},
            "node01": {"state": "waiting", "iface": "ens1f1", "ip": "1.2.3.4"},
        },
        head="master-node",
        dashboard_up=False,
    )
    assert text == (
        "master-node: started (ray start pid 5), dashboard not answering; "
        "node01: waiting for the head from ens1f1 (1.2.3.4); "
        "node02: not started (no srun task reported from it)"
    )


def test_a_failed_node_ends_the_wait_at_once(tmp_path):
    jd = _job_dir(tmp_path)
    jd.write_record("node01", state="failed", error="node01: interface ens9 from the cluster config does not exist")
    with pytest.raises(readiness.BringupFailed, match="node01: interface ens9"):
        readiness.wait_ready(jd, readiness.Wait(timeout=60, log=lambda m: None))


def test_the_wait_times_out_naming_the_missing_nodes(tmp_path):
    jd = _job_dir(tmp_path)
    jd.write_record("master-node", state="started", pid=1)
    shown = []
    with pytest.raises(readiness.BringupFailed) as e:
        readiness.wait_ready(jd, readiness.Wait(timeout=0.3, poll=0.05, log=shown.append))
    assert "within 0s" in str(e.value) and "node01: not started" in str(e.value)
    assert shown and "[--------------------] 0/2 nodes joined; waiting for master-node, node01" in shown[0]
    assert readiness.joined_bar(2, 3, width=6) == "[####--]" and readiness.joined_bar(3, 3, width=6) == "[######]"


def test_the_wait_stops_when_the_node_step_ends(tmp_path):
    jd = _job_dir(tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    with pytest.raises(readiness.BringupFailed, match="node step ended"):
        readiness.wait_ready(jd, readiness.Wait(timeout=30, step_pid=dead.pid, log=lambda m: None))


# ---- teardown ---------------------------------------------------------------------------------------------


def test_teardown_stops_only_processes_carrying_the_job_tag(tmp_path):
    tag = teardown.job_tag(4242, "unit-test-node")
    env = dict(os.environ, **{teardown.TAG_ENV: tag})
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env=dict(env, **{teardown.TAG_ENV: teardown.job_tag(4243, "unit-test-node")}),
    )
    try:
        temp = tmp_path / "raydist-4242"
        temp.mkdir()
        (temp / "f").write_text("x")
        summary = teardown.cleanup_node(4242, "unit-test-node", temp, grace=5)
        assert mine.wait(timeout=5) is not None
        assert other.poll() is None
        assert not temp.exists() and "stopped 1 leftover" in summary
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()


def test_teardown_refuses_a_temp_dir_that_is_not_the_jobs(tmp_path):
    d = tmp_path / "raydist-1"
    d.mkdir()
    assert not teardown.remove_temp_dir(d, 2) and d.exists()


# ---- sweeping what killed jobs left behind ----------------------------------------------------------------


@pytest.mark.parametrize(
    "name, kind, job",
    [
        ("raydist-41", sweep.TEMP, 41),
        ("raydist-041", sweep.TEMP, None),
        ("raydist-41.old", sweep.TEMP, None),
        ("raydist-", sweep.TEMP, None),
        ("raydist-x", sweep.TEMP, None),
        ("ray", sweep.TEMP, None),
        ("41", sweep.TEMP, None),
        ("41", sweep.JOB, 41),
        ("041", sweep.JOB, None),
        ("41_2", sweep.JOB, None),
        ("raydist-41", sweep.JOB, None),
        ("0", sweep.JOB, None),
    ],
)
def test_only_names_raydist_gives_carry_a_job_id(name, kind, job):
    assert sweep.job_of(name, kind) == job


def test_live_ids_from_squeue_count_array_and_het_jobs_by_every_id_they_show():
    text = "41 41\n57 55_2\n55 55_[3-9%2]\n71 70+1\n70 70+0\n"
    assert sweep.live_ids(text) == {41, 55, 57, 70, 71}
    assert sweep.live_ids("") == set()


def _entry(name: str, kind: str = sweep.TEMP, ours: bool = True, marked: bool = True) -> sweep.Entry:
    return sweep.Entry(Path("/r") / name, kind, sweep.job_of(name, kind), ours, marked)


def test_the_sweep_removes_only_our_entries_of_jobs_slurm_no_longer_runs():
    entries = [
        _entry("raydist-5"),
        _entry("raydist-6"),
        _entry("raydist-7"),
        _entry("raydist-8", ours=False),
        _entry("raydist-x"),
        _entry("5", sweep.JOB),
        _entry("9", sweep.JOB, marked=False),
        _entry("6", sweep.JOB),
        _entry("notes", sweep.JOB),
    ]
    gone = sweep.to_remove(entries, live={6, 7}, current_job=7)
    assert [e.path.name for e in gone] == ["raydist-5", "5"]
    # The current job is never swept, even when SLURM's answer omitted it; live jobs never are.
    assert [e.path.name for e in sweep.to_remove(entries, live=set(), current_job=7)] == [
        "raydist-5",
        "raydist-6",
        "5",
        "6",
    ]
    assert sweep.to_remove(entries, live={5, 6, 7, 8, 9}) == []
    assert [e.job_id for e in sweep.candidates(entries, current_job=7)] == [5, 6, 5, 6]


def _leftovers(root: Path) -> dict[str, Path]:
    """A temp dir root and a job dir root as a killed job's clean-up leaves them, with things to keep."""
    tmp, jobs = root / "tmp", root / "jobs"
    made = {}
    for name in ("raydist-5", "raydist-6", "raydist-7", "raydist-x"):
        made[name] = tmp / name
        (tmp / name / "session_x").mkdir(parents=True)
    (tmp / "raydist-8").write_text("a file, not a dir")
    os.symlink(root / "elsewhere", tmp / "raydist-9")
    (root / "elsewhere").mkdir()
    for name, marker in (("5", "token"), ("6", "nodes"), ("7", "plan.json"), ("11", None)):
        made[f"job {name}"] = jobs / name
        (jobs / name).mkdir(parents=True)
        if marker:
            (jobs / name / marker).write_text("")
    return made


def test_sweep_lists_asks_about_candidates_only_and_removes(tmp_path):
    made = _leftovers(tmp_path)
    asked = []

    def ask(ids, current):
        asked.append((ids, current))
        return {6, 7}

    roots = [(tmp_path / "tmp", sweep.TEMP), (tmp_path / "jobs", sweep.JOB)]
    line = sweep.sweep(roots, current_job=7, who="node01", ask=ask)
    assert asked == [([5, 6], 7)]  # not 11 (no raydist file in it), not 7 (this job), not the link or the file
    assert line == f"node01: removed leftovers of ended job(s) 5: {made['raydist-5']}, {made['job 5']}"
    assert not made["raydist-5"].exists() and not made["job 5"].exists()
    assert all(p.exists() for k, p in made.items() if k not in ("raydist-5", "job 5"))
    assert (tmp_path / "tmp" / "raydist-8").is_file() and (tmp_path / "tmp" / "raydist-9").is_symlink()
    assert (tmp_path / "elsewhere").is_dir()
    assert sweep.sweep(roots, current_job=7, who="node01", ask=ask) is None  # nothing left to do: silent


def test_sweep_removes_nothing_when_slurm_cannot_say_which_jobs_are_live(tmp_path):
    made = _leftovers(tmp_path)

    def ask(ids, current):
        raise sweep.SlurmUnavailable("squeue exited 1: Unable to contact slurm controller")

    line = sweep.sweep([(tmp_path / "tmp", sweep.TEMP), (tmp_path / "jobs", sweep.JOB)], 7, "node01", ask=ask)
    assert line.startswith("node01: not removing 4 possible leftover(s) of earlier jobs (")
    assert line.endswith("cannot ask SLURM which jobs are live: squeue exited 1: Unable to contact slurm controller")
    assert "\n" not in line and all(p.exists() for p in made.values())
    assert sweep.sweep([(tmp_path / "absent", sweep.TEMP)], 7, "node01", ask=ask) is None


def test_a_leftover_that_cannot_be_removed_is_named_in_the_same_line(tmp_path, monkeypatch):
    made = _leftovers(tmp_path)

    def rmtree(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(sweep.shutil, "rmtree", rmtree)
    line = sweep.sweep([(tmp_path / "tmp", sweep.TEMP)], 7, "node01", ask=lambda ids, current: {7})
    assert line == (
        f"node01: removed leftovers of ended job(s) 5, 6: none; could not remove {made['raydist-5']} "
        f"(Permission denied), {made['raydist-6']} (Permission denied)"
    )


def test_entries_of_another_user_are_never_candidates(tmp_path):
    (tmp_path / "raydist-5").mkdir()
    (tmp_path / "raydist-5" / "token").mkdir()
    assert sweep.candidates(sweep.scan(tmp_path, sweep.TEMP, uid=os.getuid() + 1)) == []
    assert [e.job_id for e in sweep.candidates(sweep.scan(tmp_path, sweep.TEMP))] == [5]


def _fake_squeue(tmp_path: Path, monkeypatch, script: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f'#!/bin/bash\necho "$@" > {tmp_path}/args; env > {tmp_path}/env\n{script}\n')
    os.chmod(bin_dir / "squeue", 0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SQUEUE_STATES", "R")  # would hide pending and suspended jobs
    return tmp_path / "args"


def test_asking_slurm_lists_the_current_job_too_and_distrusts_an_answer_without_it(tmp_path, monkeypatch):
    args = _fake_squeue(tmp_path, monkeypatch, "printf '7 7\\n12 10_2\\n'")
    assert sweep.ask_slurm([5, 10], current_job=7) == {7, 10, 12}
    assert "--jobs=5,7,10" in args.read_text() and "--format=%A %i" in args.read_text()
    assert "SQUEUE_STATES" not in (tmp_path / "env").read_text()
    with pytest.raises(sweep.SlurmUnavailable, match=r"does not list this job \(8\) itself"):
        sweep.ask_slurm([5], current_job=8)


@pytest.mark.parametrize(
    "script, message",
    [
        (
            "echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1",
            "squeue exited 1: slurm_load_jobs error: Unable to contact slurm controller",
        ),
        ("sleep 5", "squeue did not answer within 0s"),
    ],
)
def test_a_failing_squeue_is_one_line(tmp_path, monkeypatch, script, message):
    _fake_squeue(tmp_path, monkeypatch, script)
    with pytest.raises(sweep.SlurmUnavailable) as e:
        sweep.ask_slurm([5], current_job=7, timeout=0.3)
    assert str(e.value) == message


def test_the_jobs_temp_dir_is_0700_whatever_the_umask_and_never_a_strangers(tmp_path):
    old = os.umask(0o022)
    try:
        d = tmp_path / "t" / "raydist-42"
        private_dir(d)
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
        os.chmod(d, 0o755)  # left by this job's run before a requeue
        private_dir(d)
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    finally:
        os.umask(old)
    (tmp_path / "target").mkdir()
    os.symlink(tmp_path / "target", tmp_path / "raydist-43")
    with pytest.raises(RaydistError, match="exists but is not a directory of this user's"):
        private_dir(tmp_path / "raydist-43")


# ---- command line and the sbatch script -------------------------------------------------------------------


def _raydist(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RAY", "RAYDIST_"))}
    return subprocess.run(
        [sys.executable, "-m", "raydist.cli", *args],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        cwd=REPO,
    )


def test_cli_errors_are_one_line(tmp_path):
    r = _raydist("slurm", "plan")
    assert r.returncode == 1 and r.stderr.startswith("raydist: error: not inside a SLURM job")
    assert len(r.stderr.strip().splitlines()) == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("portz: {}\n")
    r = _raydist("status", "--config", str(bad))
    assert r.returncode == 2 and "unknown key 'portz'" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    good = tmp_path / "good.yaml"
    good.write_text(f"job_dir: {tmp_path}/jobs\n")
    r = _raydist("env", "--config", str(good))
    assert r.returncode == 1 and "no running raydist cluster" in r.stderr
    for args in (["slurm", "run"], ["slurm", "run", "--"]):  # batch mode with nothing to run: bad input
        r = _raydist(*args)
        assert r.returncode == 2 and r.stderr.strip() == (
            "raydist: error: raydist slurm run: give the command to run, e.g. -- python jobs/sync.py"
        ), r.stderr


def test_env_prints_export_lines_from_the_connection_file(tmp_path):
    path = tmp_path / "connection.env"
    readiness.connection_for(_plan(tmp_path)).write(path)
    r = _raydist("env", "--connection", str(path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "export RAY_ADDRESS=http://127.0.0.1:20001"


def test_sbatch_script_is_thin_and_valid_bash():
    script = (REPO / "cluster" / "ray_up.slurm").read_text()
    assert subprocess.run(["bash", "-n", str(REPO / "cluster" / "ray_up.slurm")]).returncode == 0
    assert "#SBATCH --ntasks-per-node=1" in script and "#SBATCH --signal=" in script
    assert "scontrol show hostnames" in script
    assert "raydist slurm node" in script and "raydist slurm wait" in script
    assert "ray stop" not in script
    code = [ln for ln in script.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(code) < 30  # bring-up, batch mode and the warning traps; the logic is in `raydist slurm`


# ---- batch mode: the requeue rule and SLURM's time-left format ---------------------------------------------


@pytest.mark.parametrize(
    "outcome, restarts, requeue, why",
    [
        (
            dict(exit_code=0, signal="time_limit", status="stopped"),
            0,
            True,
            "requeueing after the time limit (1 of at most 3)",
        ),
        (
            dict(exit_code=0, signal="time_limit", status=None),
            2,
            True,
            "requeueing after the time limit (3 of at most 3)",
        ),
        (
            dict(exit_code=0, signal="time_limit", status="stopped"),
            3,
            False,
            "requeued 3 times already (requeue.max_requeues=3)",
        ),
        (dict(exit_code=0, signal="time_limit", status="completed"), 0, False, "the run had completed"),
        (
            dict(exit_code=0, signal="preemption", status="stopped"),
            0,
            False,
            "PreemptMode=REQUEUE requeues the job itself",
        ),
        (dict(exit_code=0), 0, False, "command completed"),
        (dict(exit_code=1), 0, False, "requeue.on_failure is off"),
    ],
)
def test_requeue_decision(outcome, restarts, requeue, why):
    from raydist.slurm.batch import Outcome, decide
    from raydist.slurm.settings import Requeue

    d = decide(Outcome(**outcome), restarts, Requeue())
    assert d.requeue is requeue and why in d.why, d


def test_failures_requeue_only_when_asked_and_only_up_to_the_cap():
    from raydist.slurm.batch import Outcome, decide
    from raydist.slurm.settings import Requeue

    cfg = Requeue(max_requeues=2, on_failure=True)
    assert decide(Outcome(exit_code=1), 1, cfg).requeue
    last = decide(Outcome(exit_code=1), 2, cfg)
    assert not last.requeue and last.why == (
        "not requeueing after a failure (exit 1): the job was requeued 2 times already (requeue.max_requeues=2)"
    )


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("45", 45),
        ("12:03", 723),
        ("1:02:03", 3723),
        ("2-01:02:03", 176523),
        ("UNLIMITED", None),
        ("INVALID", None),
        ("", None),
        ("1:x", None),
    ],
)
def test_squeue_time_left(text, seconds):
    from raydist.slurm.batch import parse_time_left

    assert parse_time_left(text) == seconds


# ---- a node's `ray start`, supervised -------------------------------------------------------------------

# run_node in a process of its own (it installs SIGTERM/SIGINT/SIGHUP handlers), on the head of a one-node job
# whose `ray start` is a stand-in script: what it does when Ray exits by itself, and when SLURM stops the step.
_NODE_DRIVER = textwrap.dedent("""
    import sys
    from raydist.slurm import bringup, settings
    from raydist.slurm.jobdir import JobDir
    from raydist.slurm.nodes import Allocation

    root, job, fake_ray = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    bringup.ray_start_command = lambda *a: [sys.executable, "-c", fake_ray]
    cfg = settings.from_dict({"job_dir": f"{root}/jobs", "temp_dir": f"{root}/tmp", "timeouts": {"teardown": 1}})
    alloc = Allocation(job_id=job, nodes=("node-a",), this_node="node-a", cpus=1, gpus=0, submit_host="login1",
                       user="ana")
    sys.exit(bringup.run_node(cfg, alloc, log=lambda m: print(m, flush=True)))
""")


def _node_job(tmp_path: Path) -> tuple[JobDir, int]:
    job = 700000 + os.getpid() % 100000  # the job tag of the processes cleanup_node stops: this test's own
    jd = JobDir(tmp_path / "jobs" / str(job))
    jd.create()
    jd.write_token()
    jd.write_plan(
        _plan(
            tmp_path,
            job_id=job,
            nodes=("node-a",),
            head="node-a",
            temp_dir=str(tmp_path / "tmp" / f"raydist-{job}"),
            token_path=str(jd.token),
        )
    )
    return jd, job


def _start_node(tmp_path: Path, job: int, fake_ray: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _NODE_DRIVER, str(tmp_path), str(job), fake_ray],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_started(jd: JobDir, node: subprocess.Popen, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and node.poll() is None:
        record = jd.records().get("node-a")
        if record and record.get("state") == "started":
            return record
        time.sleep(0.05)
    raise AssertionError(f"the node never reported started: {node.communicate(timeout=10)}")


def test_a_ray_start_that_exits_by_itself_fails_the_node_with_its_log_tail(tmp_path):
    jd, job = _node_job(tmp_path)
    node = _start_node(tmp_path, job, "import sys; print('first line'); print('gcs died', flush=True); sys.exit(3)")
    out, err = node.communicate(timeout=60)
    assert node.returncode == 1, (out, err)
    record = jd.records()["node-a"]
    assert record["state"] == "failed" and record["error"] == "node-a: ray start exited with status 3: gcs died"
    log_path = tmp_path / "tmp" / f"raydist-{job}" / "ray-start.log"
    assert (
        f"raydist: error: node-a: ray start exited with status 3; last lines of {log_path}:\n"
        "first line\ngcs died" in err
    )
    assert "node-a: head on lo 127.0.0.1 (test), 1 CPU, 0 GPU, ports 20000-" in out
    assert f"removed {log_path.parent}" in out and not log_path.parent.exists()


@pytest.mark.parametrize(
    "fake_ray, sigkilled",
    [
        ("import time; time.sleep(60)", False),  # ends on the SIGTERM run_node passes on
        (
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)",
            True,
        ),  # ignores it: killed after half the teardown budget
    ],
)
def test_a_stopped_step_stops_ray_cleans_up_and_exits_0(tmp_path, fake_ray, sigkilled):
    jd, job = _node_job(tmp_path)
    node = _start_node(tmp_path, job, fake_ray)
    record = _wait_started(jd, node)
    assert record["head"] is True and record["iface"] == "lo" and record["cpus"] == 1
    if sigkilled:  # its SIGTERM handler must be in place before the signal comes
        log_path = tmp_path / "tmp" / f"raydist-{job}" / "ray-start.log"
        while "up" not in log_path.read_text():
            time.sleep(0.05)
    started = time.monotonic()
    node.send_signal(signal.SIGTERM)
    out, err = node.communicate(timeout=60)
    assert node.returncode == 0, (out, err)
    assert jd.records()["node-a"]["state"] == "stopped" and not err
    if sigkilled:
        assert time.monotonic() - started >= 0.5  # half of timeouts.teardown
    assert not (tmp_path / "tmp" / f"raydist-{job}").exists()


def test_ray_start_runs_once_more_only_after_rays_raylet_registration_timeout():
    from raydist.slurm.bringup import start_again

    timed_out = (
        "... Exception: The current node timed out during startup. This could happen because some of "
        "the raylet failed to startup or the GCS has become overloaded."
    )
    assert start_again(1, timed_out, attempt=0, requested=False)
    assert not start_again(1, timed_out, attempt=1, requested=False)  # once more, not for ever
    assert not start_again(1, timed_out, attempt=0, requested=True)  # the job is ending: no new start
    assert not start_again(1, "ValueError: port 6379 already in use", attempt=0, requested=False)
    assert not start_again(0, timed_out, attempt=0, requested=False)


# ---- the warning on an interactive cluster: naming the submitted runs ----------------------------------------------


def test_a_job_api_that_fails_once_is_asked_again_and_one_that_never_answers_is_named(monkeypatch):
    from raydist.slurm import interrupt

    class Job:
        submission_id, entrypoint, type, status = "raysubmit_1", "python jobs/async.py", "SUBMISSION", "RUNNING"

    answers = [ConnectionError("dashboard busy"), [Job()]]

    def listing(conn):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(interrupt, "running_submissions", listing)
    jobs, error = interrupt._listed(None, until=time.monotonic() + 5, pause_s=0.01)
    assert [j.submission_id for j in jobs] == ["raysubmit_1"] and error is None

    monkeypatch.setattr(interrupt, "running_submissions", lambda conn: (_ for _ in ()).throw(TimeoutError("no answer")))
    jobs, error = interrupt._listed(None, until=time.monotonic() + 0.05, pause_s=0.01)
    assert jobs == [] and error == "TimeoutError: no answer"
