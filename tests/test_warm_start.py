"""A node's warm interpreter (raydist/warm/server.py): a rank forked from it, with torch already imported,
behaves as the same script started by `python` would: its argv, directory, sys.path, environment, output, exit
code, traceback and signals; fresh random state; it dies with its agent. What it cannot run that way it declines,
and the rank starts cold. Real processes, no Ray: the agent (RankAgent) is driven directly, as Ray would call it.
The SLURM bring-up that starts it per node is covered by tests/test_slurm_launch.py and test_slurm_cluster.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from raydist.launcher.agent import RankAgent
from raydist.warm import server as warm_server
from raydist.warm.client import WARM_ENV

# Slow: its ranks fork from interpreters that import torch (half a minute in all on 2 cores), and `make test` sends
# the slow modules out before the quick ones, so that neither xdist worker ends on a long module alone.
pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""\
    import os, sys
    print("warm" if "torch" in sys.modules else "cold", __name__, sys.argv, os.getcwd(), sys.path[0],
          os.environ.get("RANK"), flush=True)
    import multiprocessing, numpy, torch
    print("random", numpy.random.rand(), "threads", torch.get_num_threads(),
          "authkey", multiprocessing.current_process().authkey.hex(), flush=True)
    if sys.argv[1:] == ["fail"]:
        def inner():
            raise ValueError("boom")
        inner()
    if sys.argv[1:] == ["sleep"]:
        import time
        time.sleep(120)
    sys.exit(3)
""")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    here = tmp_path_factory.mktemp("warm")
    sock = here / "warm.sock"
    log = open(here / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, warm_server.__file__, str(sock)], stdout=log, stderr=subprocess.STDOUT, env=node_env()
    )
    deadline = time.monotonic() + 60
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, (here / "server.log").read_text()
        time.sleep(0.1)
    (here / "train.py").write_text(SCRIPT)
    yield proc, sock, here
    proc.kill()
    proc.wait()
    log.close()


@pytest.fixture
def agent(server, monkeypatch):
    monkeypatch.setenv(WARM_ENV, str(server[1]))
    agents = []

    def make() -> RankAgent:
        agents.append(RankAgent("warm-test", len(agents)))
        return agents[-1]

    yield make
    for a in agents:
        a.kill()


def node_env() -> dict[str, str]:
    """This process's environment as a node's warm interpreter would have it: without the variables Ray sets for its
    own worker process (an earlier test's in-process ray.init in this xdist worker sets RAY_CLIENT_MODE), which a
    rank's environment never carries (raydist.launcher.environment.RAY_WORKER_ONLY)."""
    from raydist.launcher.environment import RAY_WORKER_ONLY

    return {k: v for k, v in os.environ.items() if k not in RAY_WORKER_ONLY}


def _env(**extra) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "RANK": "1", **extra}


def _run_to_end(a: RankAgent, timeout: float = 60) -> tuple[list[str], int]:
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = a.poll()
        lines += p["lines"]
        if p["exit_code"] is not None:
            return lines, p["exit_code"]
        time.sleep(0.2)
    raise AssertionError(f"no exit within {timeout} s: {lines}")


def test_a_forked_rank_runs_the_script_as_python_would(agent, server):
    here = server[2]
    a = agent()
    started = a.start([sys.executable, "train.py", "x"], _env(OMP_NUM_THREADS="1"), str(here), 1, 0, warm=True)
    assert started["warm"], started
    lines, code = _run_to_end(a)
    assert code == 3
    assert lines[0] == f"warm __main__ ['train.py', 'x'] {here} {here} 1"
    assert lines[1].split()[2:4] == ["threads", "1"]


def test_a_failing_forked_rank_prints_the_traceback_python_prints(agent, server):
    here = server[2]
    a = agent()
    assert a.start([sys.executable, "train.py", "fail"], _env(), str(here), 1, 0, warm=True)["warm"]
    lines, code = _run_to_end(a)
    cold = subprocess.run([sys.executable, "train.py", "fail"], cwd=here, capture_output=True, text=True)
    assert code == cold.returncode == 1
    assert lines[2:] == cold.stderr.splitlines(), lines


@pytest.mark.long  # its short version: test_launch's Lightning Fabric, cold, finds its launcher the same way
def test_lightning_fabric_forked_warm_finds_its_launcher_and_trains(agent, server, tmp_path):
    """A framework that detects its launcher from the environment (Lightning Fabric), in two forked ranks with the
    variables raydist launch gives: it sees the ranks' environment, not the warm interpreter's."""
    pytest.importorskip("lightning_fabric")
    from raydist.cluster.listen_port import free_port
    from raydist.launcher import environment as E

    host = os.uname().nodename
    slots = E.assign_ranks([E.Place("n1", host, "127.0.0.1"), E.Place("n1", host, "127.0.0.1")])
    group = E.Group(tuple(slots), "127.0.0.1", free_port("127.0.0.1"), "warm-fabric", 0, 0, "fabric", 1.0)
    script = Path(__file__).with_name("launch_scripts") / "fabric_env.py"
    ranks = []
    for slot in slots:
        ranks.append(agent())
        env = {**_env(), **E.rank_environment(slot, group)}
        started = ranks[-1].start(
            [sys.executable, str(script), str(tmp_path)], env, str(tmp_path), slot.rank, 0, warm=True
        )
        assert started["warm"], started
    for a in ranks:
        lines, code = _run_to_end(a, timeout=120)
        assert code == 0, lines
    for r in range(2):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert got["chosen"] == "TorchElasticEnvironment" and got["rank_sum"] == 1.0, got
        assert (got["global_rank"], got["world_size"], got["local_rank"], got["node_rank"]) == (r, 2, r, 0)


def test_python_dash_m_and_the_pythonpath_are_honoured(agent, server, tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "helper.py").write_text("WHO = 'helper'\n")
    (tmp_path / "pkg" / "main.py").write_text(
        "import sys, helper\nprint(helper.WHO, sys.argv, sys.path[0], sorted(n for n in globals() if n[0] != '_'))\n"
    )
    a = agent()
    env = _env(PYTHONPATH=str(tmp_path / "lib"))
    assert a.start([sys.executable, "-m", "pkg.main", "--flag"], env, str(tmp_path), 1, 0, warm=True)["warm"]
    lines, code = _run_to_end(a)
    # Its own globals only, as under `python -m`: none of the warm interpreter's.
    assert code == 0 and lines == [f"helper ['{tmp_path}/pkg/main.py', '--flag'] {tmp_path} ['helper', 'sys']"], lines


def test_each_forked_rank_gets_fresh_random_state(agent, server):
    draws = []
    for _ in range(2):
        a = agent()
        assert a.start([sys.executable, "train.py"], _env(), str(server[2]), 1, 0, warm=True)["warm"]
        draws.append(_run_to_end(a)[0][1].split())
    assert draws[0][1] != draws[1][1]  # numpy's global generator
    assert draws[0][5] != draws[1][5]  # multiprocessing's authkey


def test_signals_reach_a_forked_rank_and_it_dies_with_its_agent(agent, server):
    a = agent()
    assert a.start([sys.executable, "train.py", "sleep"], _env(), str(server[2]), 1, 0, warm=True)["warm"]
    time.sleep(1)
    a.send("SIGTERM")
    assert _run_to_end(a)[1] == -signal.SIGTERM
    # An agent killed outright (its node's Ray lost): the rank it started must not outlive it.
    probe = (
        "import os, sys, time\nfrom raydist.launcher.agent import RankAgent\n"
        "a = RankAgent('warm-test', 9)\n"
        f"s = a.start([sys.executable, 'train.py', 'sleep'], {{'PATH': os.environ['PATH']}}, {str(server[2])!r}, 0, 0, warm=True)\n"
        "print(s['pid'], s['warm'], flush=True)\ntime.sleep(120)\n"
    )
    agent_proc = subprocess.Popen(
        [sys.executable, "-c", probe], stdout=subprocess.PIPE, text=True, env={**os.environ, WARM_ENV: str(server[1])}
    )
    pid, warm = agent_proc.stdout.readline().split()
    assert warm == "True"
    agent_proc.kill()
    agent_proc.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and _state(pid) != "Z":
        assert time.monotonic() < deadline, f"rank {pid} outlived its agent"
        time.sleep(0.1)


def test_a_hung_forked_rank_prints_its_stack_on_sigabrt(agent, server, monkeypatch):
    """The hang check's fallback where py-spy cannot read the process: faulthandler, on in every rank."""
    from raydist.launcher import agent as A

    a = agent()
    assert a.start(
        [sys.executable, "train.py", "sleep"], _env(PYTHONFAULTHANDLER="1"), str(server[2]), 1, 0, warm=True
    )["warm"]
    time.sleep(1.5)
    monkeypatch.setattr(A.shutil, "which", lambda _: None)
    monkeypatch.setattr(A.sys, "executable", str(server[2] / "no-bin" / "python"))  # no py-spy beside it either
    got = a.dump_stack()
    assert got["how"] == "faulthandler" and 'File "' + str(server[2] / "train.py") in got["text"], got["text"]
    assert a.proc.wait(timeout=10) == -signal.SIGABRT


def _state(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


@pytest.mark.parametrize(
    "argv, env, why",
    [
        (["/usr/bin/env", "python3", "train.py"], {}, "not this node's Python"),
        ([sys.executable, "-c", "print(1)"], {}, "interpreter options"),
        ([sys.executable, "-X", "dev", "train.py"], {}, "interpreter options"),
        ([sys.executable, "train.py"], {"PYTHONHASHSEED": "7"}, "PYTHONHASHSEED differs"),
    ],
)
def test_what_a_fork_cannot_reproduce_starts_cold(agent, server, argv, env, why):
    a = agent()
    started = a.start(argv, _env(**env), str(server[2]), 1, 0, warm=True)
    assert not started["warm"] and why in started["cold_why"], started
    _run_to_end(a)


def test_a_setting_of_rays_dependencies_read_at_their_import_starts_the_rank_cold(agent, server):
    """The idle server imports Ray's dependencies too (for Ray jobs' servers, its forks): a rank whose setting of
    theirs differs from the server's, as a setting of torch's would, cannot be forked with the server's value."""
    log = server[2] / "server.log"
    deadline = time.monotonic() + 60
    while "imported Ray's dependencies" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    a = agent()
    started = a.start([sys.executable, "train.py"], _env(PANDAS_COPY_ON_WRITE="1"), str(server[2]), 1, 0, warm=True)
    assert not started["warm"] and "PANDAS_COPY_ON_WRITE differs" in started["cold_why"], started
    _run_to_end(a)
    same = agent()
    assert same.start([sys.executable, "train.py"], _env(), str(server[2]), 1, 0, warm=True)["warm"]
    assert _run_to_end(same)[1] == 3


DDP_SCRIPT = textwrap.dedent("""\
    import os, sys
    dynamo_before = "torch._dynamo" in sys.modules
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{os.path.abspath('pg')}", rank=0, world_size=1)
    loaded = set(sys.modules)
    torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    print(dynamo_before, len(set(sys.modules) - loaded), os.environ.get("TORCHINDUCTOR_CACHE_DIR"), flush=True)
""")


def test_a_forked_rank_builds_ddp_without_importing_torchs_compiler_front_end_again(agent, server, tmp_path):
    """DistributedDataParallel imports torch._dynamo as it is built, about a second of a fresh process: a forked
    rank has it, and what its import set in the environment (inductor's cache dir), as a fresh rank would."""
    (tmp_path / "ddp.py").write_text(DDP_SCRIPT)
    a = agent()
    assert a.start([sys.executable, "ddp.py"], _env(), str(tmp_path), 1, 0, warm=True)["warm"]
    lines, code = _run_to_end(a)
    cold = subprocess.run(
        [sys.executable, "ddp.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**_env(), "PYTHONPATH": ""},
        timeout=120,
    )
    assert code == cold.returncode == 0, (lines, cold.stderr[-2000:])
    warm_line, cold_line = lines[-1].split(), cold.stdout.split()
    assert warm_line[:2] == ["True", "0"] and cold_line[0] == "False" and int(cold_line[1]) > 100, (lines, cold.stdout)
    assert warm_line[2] == cold_line[2] != "None"


def test_a_rank_with_another_setting_of_torchs_compiler_starts_cold(agent, server, tmp_path):
    a = agent()
    started = a.start(
        [sys.executable, "train.py"], _env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path)), str(server[2]), 1, 0, warm=True
    )
    assert not started["warm"] and "TORCHINDUCTOR_CACHE_DIR differs" in started["cold_why"], started
    assert _run_to_end(a)[1] == 3


def test_warm_false_starts_the_rank_cold_beside_a_warm_interpreter(agent, server):
    a = agent()
    started = a.start([sys.executable, "train.py"], _env(), str(server[2]), 1, 0, warm=False)
    assert not started["warm"] and started["cold_why"] == "warm=false"
    lines, code = _run_to_end(a)
    assert code == 3 and lines[0].startswith("cold __main__")


def test_without_a_warm_interpreter_the_rank_starts_cold(monkeypatch, tmp_path):
    monkeypatch.delenv(WARM_ENV, raising=False)
    (tmp_path / "train.py").write_text(SCRIPT)
    a = RankAgent("warm-test", 0)
    assert not a.start([sys.executable, "train.py"], _env(), str(tmp_path), 1, 0, warm=True)["warm"]
    lines, code = _run_to_end(a)
    assert code == 3 and lines[0].startswith("cold __main__")
    # One that should be there but is not (it failed to start): cold, and the start line will say where to look.
    monkeypatch.setenv(WARM_ENV, str(tmp_path / "warm.sock"))
    b = RankAgent("warm-test", 1)
    started = b.start([sys.executable, "train.py"], _env(), str(tmp_path), 1, 0, warm=True)
    assert not started["warm"] and f"{tmp_path}/warm-interpreter.log" in started["cold_why"], started
    assert _run_to_end(b)[1] == 3


@pytest.mark.parametrize("body", [b"[" * 100000 + b"]" * 100000, b"not json", b'{"argv": 1, "env": [], "cwd": 2}'])
def test_a_malformed_request_is_declined_and_the_server_serves_on(agent, server, body):
    import socket
    import struct

    read_end, write_end = os.pipe()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(server[1]))
        socket.send_fds(conn, [struct.pack("!I", len(body))], [write_end])
        conn.sendall(body)
        answer = json.loads(conn.makefile("rb").readline())
    os.close(read_end)
    os.close(write_end)
    assert "declined" in answer and server[0].poll() is None, answer
    a = agent()
    assert a.start([sys.executable, "train.py"], _env(), str(server[2]), 1, 0, warm=True)["warm"]
    assert _run_to_end(a)[1] == 3


def test_sigterm_ends_the_server_only_once_its_ranks_have_ended(server, tmp_path):
    sock = tmp_path / "w.sock"
    proc = subprocess.Popen(
        [sys.executable, warm_server.__file__, str(sock)], stdout=subprocess.DEVNULL, env=node_env()
    )
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        os.environ[WARM_ENV] = str(sock)
        a = RankAgent("warm-test", 0)
        started = a.start([sys.executable, "train.py", "sleep"], _env(), str(server[2]), 1, 0, warm=True)
        assert started["warm"], started
        proc.send_signal(signal.SIGTERM)  # as SLURM signals every process of the step
        deadline = time.monotonic() + 10
        while sock.exists():  # no new rank is forked meanwhile
            assert time.monotonic() < deadline, "the server still listens after SIGTERM"
            time.sleep(0.1)
        assert proc.poll() is None and a.poll()["exit_code"] is None
        a.send("SIGTERM")
        assert proc.wait(timeout=10) == 0
    finally:
        os.environ.pop(WARM_ENV, None)
        proc.kill()
