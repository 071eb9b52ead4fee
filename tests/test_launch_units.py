"""`raydist launch`'s pure parts: ranks from placements, each rank's variables, the restart and hang rules, the
settings and the command checks. No Ray here (tests/test_launch.py runs real scripts)."""

from __future__ import annotations

import json
import os

import pytest

from raydist.errors import ConfigError, UsageError
from raydist.launcher import environment as E
from raydist.launcher import policy as P
from raydist.launcher.command import _python_script, check_command
from raydist.launcher.driver import starts_before_ray
from raydist.launcher.group import bundles, capacity, group_size, local_gpu_ids
from raydist.launcher.settings import LaunchConfig, default_name, load


def _places(*hosts: str, gpus: bool = False) -> list[E.Place]:
    seen: dict[str, int] = {}
    out = []
    for h in hosts:
        k = seen[h] = seen.get(h, -1) + 1
        out.append(E.Place(f"id-{h}", h, f"10.0.0.{sorted(set(hosts)).index(h) + 1}", (k,) if gpus else ()))
    return out


def _group(slots, restarts=0) -> E.Group:
    return E.Group(tuple(slots), "10.0.0.1", 29500, "run1", restarts, 3, "train", 1.0)


def test_ranks_are_blocked_by_node_in_hostname_order():
    # Ray placed process 0 on node02, 1 on master, 2 on node02, 3 on master.
    slots = E.assign_ranks(_places("node02", "master", "node02", "master"))
    assert [(s.rank, s.local_rank, s.node_rank, s.local_world_size) for s in slots] == [
        (2, 0, 1, 2),
        (0, 0, 0, 2),
        (3, 1, 1, 2),
        (1, 1, 0, 2),
    ]


def test_tasks_per_node_is_slurms_compressed_list():
    assert E.tasks_per_node(E.assign_ranks(_places("a", "a", "b", "b", "c", "c"))) == "2(x3)"
    assert E.tasks_per_node(E.assign_ranks(_places("a", "a", "b", "b", "c"))) == "2(x2),1"
    assert E.tasks_per_node(E.assign_ranks(_places("a"))) == "1"


def test_both_launchers_variables_describe_the_same_ranks():
    slots = E.assign_ranks(_places("n1", "n1", "n2", "n2"))
    g = _group(slots, restarts=2)
    for s in slots:
        env = E.rank_environment(s, g)
        assert env["RANK"] == env["SLURM_PROCID"] == env["ROLE_RANK"] == str(s.rank)
        assert env["LOCAL_RANK"] == env["SLURM_LOCALID"] == str(s.local_rank)
        assert env["GROUP_RANK"] == env["SLURM_NODEID"] == str(s.node_rank)
        assert env["WORLD_SIZE"] == env["SLURM_NTASKS"] == env["SLURM_NPROCS"] == "4"
        assert env["LOCAL_WORLD_SIZE"] == env["SLURM_NTASKS_PER_NODE"] == "2"
        assert env["GROUP_WORLD_SIZE"] == env["SLURM_NNODES"] == env["SLURM_JOB_NUM_NODES"] == "2"
        assert env["SLURM_NODELIST"] == "n1,n2" and env["SLURM_TASKS_PER_NODE"] == "2(x2)"
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29500")
        assert env["TORCHELASTIC_RESTART_COUNT"] == "2" and env["TORCHELASTIC_MAX_RESTARTS"] == "3"
        assert "CUDA_VISIBLE_DEVICES" not in env


def test_an_uneven_layout_has_no_tasks_per_node_count():
    slots = E.assign_ranks(_places("n1", "n1", "n2"))
    assert "SLURM_NTASKS_PER_NODE" not in E.rank_environment(slots[0], _group(slots))


def test_device_local_rank_is_the_ranks_own_gpu():
    places = [E.Place("a", "n1", "ip", (3,)), E.Place("a", "n1", "ip", (1,)), E.Place("b", "n2", "ip2", (0,))]
    slots = E.assign_ranks(places)
    g = _group(slots)
    envs = [E.rank_environment(s, g) for s in slots]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["3,1", "3,1", "0"]
    assert [int(e["LOCAL_RANK"]) for e in envs] == [0, 1, 0]  # device 0 is GPU 3 for rank 0, device 1 GPU 1 for 1


def test_the_ray_start_steps_task_variables_are_never_passed_on():
    worker = {
        "SLURM_PROCID": "0",
        "SLURM_STEP_ID": "4",
        "SLURM_NTASKS": "3",
        "SLURM_TASK_PID": "99",
        "SLURM_JOB_ID": "17",
        "SLURM_JOB_NAME": "raydist",
        "SLURMD_NODENAME": "node01",
        "GLOO_SOCKET_IFNAME": "ens1f0np0",
        "NCCL_SOCKET_IFNAME": "ens1f0np0",
        "PATH": "/bin",
        "RANK": "7",
        "RAY_RAYLET_PID": "5",
        "PMI_RANK": "0",
    }
    slots = E.assign_ranks(_places("node01", "node02"))
    env = E.script_environment(worker, slots[1], _group(slots))
    assert env["SLURM_PROCID"] == env["RANK"] == "1"
    assert env["SLURM_NTASKS"] == "2"
    assert "SLURM_STEP_ID" not in env and "SLURM_TASK_PID" not in env and "RAY_RAYLET_PID" not in env
    assert "PMI_RANK" not in env
    # The allocation's and the node's own: kept.
    assert (env["SLURM_JOB_ID"], env["SLURM_JOB_NAME"], env["SLURMD_NODENAME"]) == ("17", "raydist", "node01")
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "ens1f0np0"


def _cfg(**kw) -> LaunchConfig:
    cfg = LaunchConfig()
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


def test_policy_restarts_until_max_then_fails():
    crash = P.Event(P.Kind.EXITED, 1, "node01", 123, 1, "RuntimeError: boom")
    d = P.decide(crash, 0, _cfg(max_restarts=2))
    assert d.action == P.Action.RESTART and "restarting every rank (1 of at most 2)" in d.reason
    d = P.decide(crash, 2, _cfg(max_restarts=2))
    assert d.action == P.Action.FAIL and d.exit_code == 1
    assert d.reason == "rank 1 on node01 (pid 123) exited 1: RuntimeError: boom (max_restarts=2 used up)"
    assert P.decide(crash, 50, _cfg(max_restarts=-1)).action == P.Action.RESTART


def test_policy_on_usage_exit_stop_and_completion():
    usage = P.decide(P.Event(P.Kind.EXITED, 0, "n", 1, 2, "usage: x"), 0, _cfg())
    assert usage.action == P.Action.FAIL and usage.exit_code == 2
    assert P.decide(P.Event(P.Kind.STOP, detail="SLURM time limit"), 0, _cfg()).action == P.Action.STOP
    assert P.decide(P.Event(P.Kind.COMPLETED), 0, _cfg()).action == P.Action.DONE
    killed = P.Event(P.Kind.EXITED, 0, "n", 1, -9)
    assert killed.describe() == "rank 0 on n (pid 1) was killed by signal 9"
    assert P.decide(P.Event(P.Kind.LOST, 2, "node02", detail="its node died"), 0, _cfg()).action == P.Action.RESTART
    grow = P.decide(P.Event(P.Kind.GROW, detail="3 of workers=2-3 fit the cluster again"), 5, _cfg(max_restarts=0))
    assert grow.action == P.Action.RESTART and not grow.counts  # an elastic run growing back is no failure


def test_the_loops_states_follow_the_policys_decisions_and_end_with_the_summarys_statuses():
    import typing

    from raydist.launcher.states import TRANSITIONS, Machine, RunState, after
    from raydist.launcher.summary import LaunchSummary

    for action in P.Action:  # whatever the policy decides, the running loop may move there
        assert after(P.Decision(action, "")) in TRANSITIONS[RunState.RUNNING]
    ends = {s.status for s in RunState if s.terminal}
    assert ends == set(typing.get_args(typing.get_type_hints(LaunchSummary)["status"]))
    assert after(P.Decision(P.Action.STOP, "")) is RunState.STOPPING and RunState.STOPPING.terminal is False
    m = Machine()
    for state in (
        RunState.STARTING,
        RunState.RUNNING,
        RunState.RESTARTING,
        RunState.STARTING,
        RunState.RUNNING,
        RunState.STOPPING,
        RunState.STOPPED,
    ):
        m.to(state)
    assert m.state.status == "stopped"
    with pytest.raises(RuntimeError, match="no transition from STOPPED to STARTING"):
        m.to(RunState.STARTING)
    assert Machine().to(RunState.RUNNING) is RunState.RUNNING  # the first start began before Ray


def test_hang_rule_and_the_culprit():
    acts = [P.Activity(0, 100.0, "S"), P.Activity(1, 98.0, "S")]
    assert P.hung_rank(acts, 105.0, 10.0) is None
    assert P.hung_rank(acts, 108.5, 10.0).rank == 1
    assert P.hung_rank(acts, 1e9, 0) is None  # off
    stopped = [P.Activity(0, 98.0, "S"), P.Activity(1, 99.0, "T")]
    assert P.culprit(stopped).rank == 1
    frozen = [P.Activity(0, 98.0, "S", True), P.Activity(1, 99.0, "S", False), P.Activity(2, 98.5, "S", True)]
    assert P.culprit(frozen).rank == 1  # the others wait in the collective for it
    assert P.culprit([P.Activity(0, 98.0, "S", True), P.Activity(1, 97.0, "S", True)]).rank == 1


def test_settings_are_checked_like_the_run_config():
    with pytest.raises(ConfigError, match=r"workers: must be >= 1 \(got 0\)"):
        load([], ["workers=0"], ["python", "x.py"])
    with pytest.raises(ConfigError, match="stop_signal: must name a signal a script can handle"):
        load([], ["stop_signal=KILL"], ["python", "x.py"])
    with pytest.raises(ConfigError, match=r"procs_per_node: must divide workers=3 \(got 2\)"):
        load([], ["workers=3", "procs_per_node=2"], ["python", "x.py"])
    cfg = load([], ["workers=2-4", "stop_signal=usr1"], ["python", "-u", "train.py", "--lr", "1"])
    assert (cfg.elastic, cfg.min_workers, cfg.max_workers, cfg.stop_signal, cfg.name) == (
        True,
        2,
        4,
        "SIGUSR1",
        "launch-train",
    )
    assert default_name(["python", "-m", "pkg.train"]) == "launch-train"


def test_group_size_and_bundles():
    nodes = [
        {"Alive": True, "Resources": {"CPU": 2.0}},
        {"Alive": True, "Resources": {"CPU": 1.0}},
        {"Alive": False, "Resources": {"CPU": 8.0}},
    ]
    assert capacity(_cfg(), nodes) == 3
    assert capacity(_cfg(procs_per_node=2), nodes) == 2
    assert group_size(_cfg(workers="2-4"), 3) == 3
    assert group_size(_cfg(workers="2-4"), 9) == 4
    assert group_size(_cfg(workers="2-4"), 1) == 2  # waits for MIN, then fails naming the dead nodes
    assert group_size(_cfg(workers=3), 1) == 3
    assert bundles(_cfg(), 3) == ([{"CPU": 1.0}] * 3, "SPREAD", 1)
    assert bundles(_cfg(procs_per_node=2), 4) == ([{"CPU": 2.0}] * 2, "STRICT_SPREAD", 2)


def test_only_a_fixed_size_group_on_the_embedded_instance_starts_before_ray():
    assert starts_before_ray(_cfg(workers=2), embedded=True)
    assert starts_before_ray(_cfg(workers=4, procs_per_node=4), embedded=True)
    assert not starts_before_ray(_cfg(workers=2), embedded=False)  # a cluster's Ray places the ranks
    assert not starts_before_ray(_cfg(workers="2-4"), embedded=True)  # its size is what Ray says fits
    assert not starts_before_ray(_cfg(workers=4, procs_per_node=2), embedded=True)  # two nodes' worth: Ray refuses


def test_ranks_started_before_ray_get_the_gpus_ray_would_give_them():
    assert local_gpu_ids(2, None) == [(0,), (1,)]
    assert local_gpu_ids(2, "3,1") == [(3,), (1,)]
    assert local_gpu_ids(2, "GPU-5e1f,2") == [(), (2,)]  # numbered ones only, as the Ray-placed agents read theirs


def test_the_command_is_checked_before_ray(tmp_path):
    (tmp_path / "train.py").write_text("")
    check_command(["python", "train.py"], str(tmp_path))
    check_command(["python", "-m", "http.server"], str(tmp_path))
    with pytest.raises(UsageError, match="script not found: missing.py"):
        check_command(["python", "-u", "missing.py"], str(tmp_path))
    with pytest.raises(UsageError, match="command not found: no-such-program"):
        check_command(["no-such-program"], str(tmp_path))
    with pytest.raises(UsageError, match="give the command every rank runs after --"):
        check_command([], str(tmp_path))
    assert _python_script(["-X", "dev", "-u", "t.py", "-m", "x"]) == "t.py"
    assert _python_script(["-c", "print(1)"]) is None


def test_the_docs_launch_benchmark_tables_are_the_stored_results():
    import json
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    from benchmarks.launch_first_step import markdown

    stored = json.loads((repo / "docs" / "data" / "launch_first_step.json").read_text())
    assert {"local", "cluster"} <= set(stored)
    for part in stored.values():  # raw rounds, the machine, the commit
        assert part["rounds"] and part["machine"]["cpus"] and len(part["commit"]) >= 40
    text = (repo / "docs" / "benchmarks.md").read_text()
    block = (
        "<!-- BEGIN launch benchmark (generated: python -m benchmarks.launch_first_step --table) -->\n\n"
        f"{markdown(stored)}\n<!-- END launch benchmark -->"
    )
    assert block in text, "docs/benchmarks.md is stale: paste `python -m benchmarks.launch_first_step --table`"


def test_without_py_spy_a_ranks_stack_comes_from_faulthandler(tmp_path, monkeypatch):
    """The agent's fallback where py-spy may not read the process: SIGABRT, and faulthandler (on in every rank)
    prints every thread's stack; a stopped rank is continued so that it can."""
    import os
    import signal
    import sys
    import time

    from raydist.launcher import agent as A

    script = tmp_path / "sleeper.py"
    script.write_text(
        "import time\ndef wait_for_peers():\n    time.sleep(600)\nprint('up', flush=True)\nwait_for_peers()\n"
    )
    rank = A.RankAgent("units", 0)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    pid = rank.start([sys.executable, str(script)], {"RANK": "0"}, str(tmp_path), 0, 0)["pid"]
    deadline = time.monotonic() + 30
    while "up" not in rank.lines and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(pid, signal.SIGSTOP)
    monkeypatch.setattr(A.shutil, "which", lambda _: None)
    monkeypatch.setattr(A.sys, "executable", str(tmp_path / "no-bin" / "python"))  # no py-spy beside it either
    got = rank.dump_stack()
    assert got["how"] == "faulthandler"
    assert "wait_for_peers" in got["text"] and "sleeper.py" in got["text"], got["text"]
    assert rank.proc.poll() == -signal.SIGABRT


def test_a_ranks_last_line_is_relayed_even_when_its_pipe_ends_during_a_poll():
    """The reader thread may append the last line and see the pipe end just after a poll took the lines: the
    poll must not report the exit without that line (one CI run lost rank 0's 'done' line so)."""
    import collections
    import time

    from raydist.launcher import agent as A

    rank = A.RankAgent("units", -1)

    class ExitedProc:
        pid = 0

        def poll(self):
            return 0

    class PipeEndsDuringThePoll(collections.deque):
        raced = False

        def __len__(self):
            n = super().__len__()
            if n == 0 and not self.raced:  # the poll has taken the lines; now the reader finishes
                self.raced = True
                self.append("done: 192 steps")
                rank.ended = time.monotonic()
            return n

    rank.proc, rank.lines = ExitedProc(), PipeEndsDuringThePoll()
    seen, code = [], None
    for _ in range(3):
        got = rank.poll()
        seen += got["lines"]
        if got["exit_code"] is not None:
            code = got["exit_code"]
            break
    assert code == 0 and seen == ["done: 192 steps"], seen


def test_a_cluster_job_gives_every_worker_the_ray_train_settings_its_servers_import_with(monkeypatch, tmp_path):
    """A node's job server takes the settings of the job's first worker there, and imports Ray Train, which reads
    RAY_TRAIN_V2_ENABLED; Ray Train gives that to its own actors only. Every worker of the job gets it, except where
    the job's own runtime_env sets it (Ray refuses a variable set twice)."""
    import json

    from raydist.warm import client as warm

    exec_path = tmp_path / "warm_exec.py"
    exec_path.write_text("")
    monkeypatch.setenv(warm.WARM_ENV, str(tmp_path / "warm.sock"))
    monkeypatch.setenv(warm.WARM_EXEC_ENV, str(exec_path))
    monkeypatch.setenv("RAY_TRAIN_V2_ENABLED", "1")
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert warm.for_cluster_job()["env_vars"] == {"RAY_TRAIN_V2_ENABLED": "1"}
    monkeypatch.setenv(
        "RAY_JOB_CONFIG_JSON_ENV_VAR",
        json.dumps({"runtime_env": {"env_vars": {"RAY_TRAIN_V2_ENABLED": "1", "A": "b"}}}),
    )
    assert "env_vars" not in warm.for_cluster_job() and "py_executable" in warm.for_cluster_job()
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"conda": "env"}}))
    assert warm.for_cluster_job() == {}


def _setup_worker_args(context: dict, language: str = "PYTHON") -> list[str]:
    """What the raylet runs for a worker of a job with a runtime_env, after the interpreter (Ray 2.60)."""
    import json

    return [
        "/ray/_private/workers/setup_worker.py",
        "/ray/_private/workers/default_worker.py",
        "--node-ip-address=x",
        "--startup-token=3",
        f"--language={language}",
        f"--serialized-runtime-env-context={json.dumps(context)}",
    ]


def test_ray_worker_set_up_is_done_without_ray_only_for_raydist_jobs_context(monkeypatch, tmp_path):
    """Ray's setup_worker.py sets the runtime_env's variables and execs its py_executable with the worker's
    command; warm_exec does that itself (no Ray to import) when that py_executable is warm_exec, and leaves every
    other context to Ray's setup_worker.py (None)."""
    import shlex

    from raydist.warm import client as warm
    from raydist.warm import worker_exec as warm_exec

    ours = {
        "command_prefix": [],
        "env_vars": {"RUST_LOG": "warn", "RAYDIST_T": "1"},
        "py_executable": warm.py_executable(),
        "override_worker_entrypoint": None,
        "java_jars": [],
    }
    monkeypatch.delenv("RAYDIST_T", raising=False)
    assert warm_exec.setup_worker(_setup_worker_args(ours)) == [
        "/ray/_private/workers/default_worker.py",
        "--node-ip-address=x",
        "--startup-token=3",
    ]
    assert os.environ["RAYDIST_T"] == "1"
    for other in (
        {"py_executable": "/usr/bin/python3"},
        {"command_prefix": ["conda", "activate", "x", "&&"]},
        {"command_prefix": ["cd", "/tmp", "&&", "cd", "/", "&&"]},
        {"command_prefix": ["cd", "/nowhere/x", "&&"]},
        {"command_prefix": ["cd", "'/tmp", "&&"]},
        {"env_vars": {"PATH": "${PATH}:/opt"}},
        {"override_worker_entrypoint": "w.py"},
        {"a_later_field": 1},
    ):
        assert warm_exec.setup_worker(_setup_worker_args(ours | other)) is None, other
    assert warm_exec.setup_worker(_setup_worker_args(ours, language="JAVA")) is None
    # A job's working_dir (`ray job submit --working-dir`): Ray's plugin gives `cd DIR &&`, DIR quoted for the shell.
    here = os.getcwd()
    work = tmp_path / "a dir"
    work.mkdir()
    try:
        with_dir = ours | {"command_prefix": ["cd", shlex.quote(str(work)), "&&"]}
        assert warm_exec.setup_worker(_setup_worker_args(with_dir)) is not None and os.getcwd() == str(work)
    finally:
        os.chdir(here)
    assert warm_exec.setup_worker(_setup_worker_args(ours)[:-1]) is None  # no context


def test_the_ray_interpreter_script_runs_anything_but_ray_worker_set_up_as_python_itself(tmp_path):
    """Ray starts its dashboard, agents and monitors with the interpreter it was given: those get Python itself
    (exec'd: same pid, same arguments)."""
    import json
    import subprocess
    import sys

    from raydist.warm import client as warm
    from raydist.warm import ray_python

    script = ray_python.write(tmp_path, warm.py_executable())
    probe = "import json, sys; print(json.dumps([sys.executable, sys.argv[1:]]))"
    out = subprocess.run([str(script), "-c", probe, "a b", "c"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [sys.executable, ["a b", "c"]]
    assert oct(script.stat().st_mode & 0o777) == "0o700"


def test_only_rays_own_command_line_runs_through_the_ray_interpreter_module(tmp_path):
    import sys

    from raydist.warm import ray_python

    wrapped = ray_python.command(tmp_path / "ray-python", ["/venv/bin/ray", "start", "--block"])
    assert wrapped == [
        sys.executable,
        "-m",
        "raydist.warm.ray_python",
        str(tmp_path / "ray-python"),
        "/venv/bin/ray",
        "start",
        "--block",
    ]
    assert ray_python.command(tmp_path / "ray-python", [sys.executable, "-c", "pass"]) == [sys.executable, "-c", "pass"]


# ---- the caller's environment (srun's --export), exit faults, torchrun's error file ------------------------------

NODE = {
    "PATH": "/node/bin",
    "TMPDIR": "/node/tmp",
    "GLOO_SOCKET_IFNAME": "ens1f0np0",
    "HOME": "/root",
    "RAY_AUTH_TOKEN_PATH": "/node/token",
    "SLURM_JOB_ID": "17",
    "SLURM_PROCID": "0",
    "TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S": "5",
    "OMP_NUM_THREADS": "1",
}
CALLER = {
    "PATH": "/venv/bin",
    "TMPDIR": "/login/tmp",
    "GLOO_SOCKET_IFNAME": "eth0",
    "CLIENT_EPOCHS": "3",
    "NCCL_DEBUG": "INFO",
    "HOSTNAME": "login01",
    "PWD": "/home/u",
    "SLURM_JOB_ID": "99",
    "SLURM_PROCID": "5",
    "RANK": "3",
    "RAY_AUTH_TOKEN_PATH": "/login/token",
    "OMP_NUM_THREADS": "4",
    "RAYDIST_RESULT_FILE": "/x",
}


def _rank_env(export: str = "ALL", env: dict | None = None, node: dict | None = None) -> dict[str, str]:
    slots = E.assign_ranks(_places("node01", "node02"))
    spec = E.Export.parse(export)
    return E.merged(
        node or NODE,
        E.rank_environment(slots[1], _group(slots)),
        E.exported(CALLER, spec),
        E.given(CALLER, spec, env or {}),
    )


def test_every_rank_gets_the_callers_environment_and_the_caller_wins_as_under_srun():
    env = _rank_env()
    assert env["CLIENT_EPOCHS"] == "3" and env["NCCL_DEBUG"] == "INFO"  # set only in the caller
    assert env["PATH"] == "/venv/bin" and env["OMP_NUM_THREADS"] == "4"  # set in both: the caller's
    assert env["HOME"] == "/root"  # the node's, where the caller has none
    assert env["RANK"] == env["SLURM_PROCID"] == "1"  # the launcher's own, never the caller's


def test_what_describes_the_callers_own_shell_or_the_node_stays_the_nodes():
    env = _rank_env()
    assert "HOSTNAME" not in env and "PWD" not in env and "RAYDIST_RESULT_FILE" not in env
    # The node's interface, temp dir and Ray settings win: the login node's NIC name may not exist on node02.
    assert (env["GLOO_SOCKET_IFNAME"], env["TMPDIR"], env["RAY_AUTH_TOKEN_PATH"]) == (
        "ens1f0np0",
        "/node/tmp",
        "/node/token",
    )
    assert env["SLURM_JOB_ID"] == "17"  # the allocation's, from the node
    assert "TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S" not in env  # raydist's own setting for its Ray Train workers
    # Where the node has no interface of its own (no raydist bring-up), the caller's is passed on, as srun does.
    assert _rank_env(node={"PATH": "/bin"})["GLOO_SOCKET_IFNAME"] == "eth0"


def test_export_none_names_and_env_values_as_sruns_export_spells_them():
    none = _rank_env("NONE")
    assert "CLIENT_EPOCHS" not in none and none["PATH"] == "/node/bin"
    named = _rank_env("CLIENT_EPOCHS,MODE=fast")
    assert named["CLIENT_EPOCHS"] == "3" and named["MODE"] == "fast" and "NCCL_DEBUG" not in named
    everything = _rank_env("ALL,MODE=fast", env={"GLOO_SOCKET_IFNAME": "ib0", "NCCL_DEBUG": "WARN"})
    assert everything["MODE"] == "fast" and everything["CLIENT_EPOCHS"] == "3"
    assert everything["GLOO_SOCKET_IFNAME"] == "ib0" and everything["NCCL_DEBUG"] == "WARN"  # named: over all
    assert E.Export.parse("all") == E.Export() and E.Export.parse("none") == E.Export(all=False)


@pytest.mark.parametrize(
    "override, message",
    [
        ("export=ALL,RANK=3", "RANK is set by raydist launch for each rank"),
        ("export=FOO,NONE", "NONE may only come first"),
        ("export=1BAD", "'1BAD' is not an environment variable name"),
        ("env.WORLD_SIZE=8", "WORLD_SIZE is set by raydist launch"),
        ("env.MASTER_PORT=1", "MASTER_PORT is set by raydist launch"),
    ],
)
def test_the_export_and_env_settings_refuse_what_a_rank_cannot_be_given(override, message):
    with pytest.raises(ConfigError, match=message):
        load([], [override], ["python", "x.py"])


def test_env_flag_values_stay_strings_as_typed():
    from raydist.launcher.command import overrides

    class Args:
        workers = procs_per_node = cpus_per_worker = max_restarts = hang_timeout_s = stop_signal = None
        grace_s = output = name = storage_path = address = export = None
        use_gpu, overrides, env = None, [], ["FLAG=yes", "EMPTY=", "EQ=a=b"]

    cfg = load([], overrides(Args()), ["python", "x.py"])
    assert cfg.env == {"FLAG": "yes", "EMPTY": "", "EQ": "a=b"}


def test_an_exit_fault_is_a_crash_or_a_silence_after_the_script_returned():
    assert P.exit_fault(None, 999, None, 60) is None  # still training: the hang rule's business
    assert P.exit_fault(None, 0, -6, 60) is None  # died before returning: a failure, restarted
    assert P.exit_fault(1.0, 1.0, -6, 60) == "signal"  # an abort in teardown
    assert P.exit_fault(1.0, 1.0, 3, 60) is None  # the script's own sys.exit(3)
    assert P.exit_fault(61.0, 61.0, None, 60) == "hung"
    assert P.exit_fault(61.0, 5.0, None, 60) is None  # still printing (an upload's progress): not hung


def test_an_exit_fault_finishes_the_run_with_exit_1_and_is_never_restarted():
    d = P.decide(
        P.Event(P.Kind.EXIT_FAULT, detail="rank 1 on n (pid 4) was then killed by signal 6"), 0, _cfg(max_restarts=3)
    )
    assert d.action == P.Action.FINISHED_FAULTY and d.exit_code == 1
    assert d.reason == (
        "every rank's script returned, but rank 1 on n (pid 4) was then killed by signal 6; not restarted"
    )


def test_batch_mode_does_not_requeue_a_run_that_finished_with_an_exit_fault():
    from raydist.slurm.batch import TIME_LIMIT, Outcome, decide
    from raydist.slurm.settings import Requeue

    for signal_seen in (None, TIME_LIMIT):
        d = decide(Outcome(1, signal_seen, "exit_fault"), 0, Requeue(on_failure=True))
        assert not d.requeue and "nothing to resume" in d.why


def test_torchruns_error_file_names_the_exception_and_where_it_was_raised(tmp_path):
    from raydist.launcher.errorfile import describe, read_error_file

    path = tmp_path / "error.json"
    stack = (
        'Traceback (most recent call last):\n  File "/lib/errors/__init__.py", line 357, in wrapper\n'
        '    return f(*args, **kwargs)\n  File "/work/train.py", line 42, in main\n'
        '    raise ValueError("lr 7 is out of range")\nValueError: lr 7 is out of range\n'
    )
    path.write_text(
        json.dumps(
            {
                "message": {
                    "message": "ValueError: lr 7 is out of range",
                    "extraInfo": {"py_callstack": stack, "timestamp": "1"},
                }
            }
        )
    )
    error = read_error_file(str(path))
    assert error == {"message": "ValueError: lr 7 is out of range", "where": "/work/train.py:42"}
    assert describe(error) == "ValueError: lr 7 is out of range (at /work/train.py:42)"
    path.write_text(json.dumps({"message": "Signal 6 (SIGABRT) received by PID 9"}))
    assert describe(read_error_file(str(path))) == "Signal 6 (SIGABRT) received by PID 9"
    path.write_text("{torn")
    assert read_error_file(str(path)) is None and read_error_file(str(tmp_path / "none")) is None
    assert describe(None) == ""


def test_the_docs_exit_fault_table_is_the_stored_result():
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    from benchmarks.exit_faults import report

    stored = json.loads((repo / "docs" / "data" / "exit_faults.json").read_text())
    assert len(stored["commit"]) == 40 and stored["counts"]["srun"]["runs"] >= 20
    text = (repo / "docs" / "benchmarks.md").read_text()
    block = (
        "<!-- BEGIN exit faults (generated: python -m benchmarks.exit_faults --table) -->\n\n"
        f"{report(stored)}\n<!-- END exit faults -->"
    )
    assert block in text, "docs/benchmarks.md is stale: paste `python -m benchmarks.exit_faults --table`"


def _supervised(monkeypatch, events: list) -> tuple[P.Decision, list[bool]]:
    """LaunchRun._supervise over a group whose ranks say `events` in turn (None: nothing yet), every poll stepping;
    returns its decision and the registrations the dashboard's run list was asked for."""
    from raydist.launcher import driver as D

    class Ranks:
        def __init__(self, *_):
            self.events = iter(events)

        def event(self):
            return next(self.events)

    class Quiet:
        def __init__(self, *_):
            pass

        def event(self, *_):
            return None

    registered: list[bool] = []
    monkeypatch.setattr(D, "RankEvents", Ranks)
    monkeypatch.setattr(D, "ClusterStops", Quiet)
    monkeypatch.setattr(D, "GrowChecks", Quiet)
    monkeypatch.setattr(D, "POLL_S", 0.0)
    run = D.LaunchRun(LaunchConfig(), ["python", "train.py"], ".", 0.0, lambda cfg: "local")
    monkeypatch.setattr(run, "_relay", lambda group: True)
    monkeypatch.setattr(run.runs, "maybe_register", lambda group, stepped: registered.append(stepped))
    return run._supervise(None), registered


def test_a_start_whose_ranks_ended_before_its_first_poll_is_never_registered_with_the_dashboard(monkeypatch):
    """A short script can end before the embedded instance is up: registering it then (Ray Train's import, its state
    actor) would only delay the command's exit, and its dashboard ends with the command."""
    done, registered = _supervised(monkeypatch, [P.Event(P.Kind.COMPLETED)])
    assert done.action == P.Action.DONE and registered == []


def test_a_start_still_running_is_registered_while_it_runs(monkeypatch):
    done, registered = _supervised(monkeypatch, [None, None, P.Event(P.Kind.COMPLETED)])
    assert done.action == P.Action.DONE and registered == [True, True]


def _run_list(monkeypatch, clock: list[float]):
    """A RunList on a fake clock whose registrations are recorded instead of started."""
    from raydist.launcher import dashboard as Dash

    runs, registered = Dash.RunList("job", ["python", "train.py"], clock=lambda: clock[0]), []
    monkeypatch.setattr(
        runs, "register", lambda group: (registered.append(clock[0]), setattr(runs, "_register_at", None))
    )
    return runs, registered


def test_a_start_is_registered_with_the_dashboard_at_its_first_step(monkeypatch):
    clock = [100.0]
    runs, registered = _run_list(monkeypatch, clock)
    runs.due()
    runs.maybe_register(None, stepped=False)
    clock[0] = 101.0
    runs.maybe_register(None, stepped=True)
    assert registered == [101.0]


def test_a_start_begun_before_ray_is_registered_only_after_running_seconds_on_ray_though_it_has_stepped(monkeypatch):
    """A short script that ends just after the embedded instance came up would otherwise wait, at its end, for Ray
    Train's import and state actor: a registration nobody sees."""
    from raydist.launcher.dashboard import REGISTER_AFTER_S

    clock = [100.0]
    runs, registered = _run_list(monkeypatch, clock)
    runs.due()
    clock[0] = 104.0  # Ray is up
    runs.due_on_ray()
    runs.maybe_register(None, stepped=True)
    clock[0] = 104.0 + REGISTER_AFTER_S - 0.1
    runs.maybe_register(None, stepped=True)
    assert registered == []
    clock[0] = 104.0 + REGISTER_AFTER_S
    runs.maybe_register(None, stepped=True)
    assert registered == [104.0 + REGISTER_AFTER_S]


def test_a_run_list_turned_off_starts_no_stand_ins_or_state_actor(monkeypatch):
    """RAY_TRAIN_ENABLE_STATE_TRACKING=0 turns the dashboard's run list off: nothing is registered, so no stand-in
    actor per rank is started for it, at the first step, at the due time or when the start ends."""
    from raydist.launcher import dashboard as Dash

    class Group:
        def actors(self):
            raise AssertionError("stand-ins started for a run list that is off")

    runs = Dash.RunList("job", ["python", "train.py"])
    runs.view = type("View", (), {"enabled": False})()
    runs.due()
    runs.maybe_register(Group(), stepped=True)
    runs.settled(Group())
    assert runs._registering is None
