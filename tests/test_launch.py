"""`raydist launch` on one machine, with scripts as users write them (examples/ddp_train.py: reads
SLURM_PROCID or RANK, init_process_group, DDP, DistributedSampler, its own snapshot): it trains to torchrun's
checksum, survives a SIGKILLed rank by restarting the group from the script's snapshot, names a SIGSTOPped rank with
every rank's stack, stops every rank with SIGTERM and resumes, gives each rank a coherent launcher environment (the
one Lightning Fabric detects), and refuses a script that exits 2 with one line, leaving nothing running.
The same on emulated SLURM hosts: tests/test_slurm_launch.py.

torchrun's checksum, SIGTERM and the launcher environment run on the embedded instance, where the first start's ranks
begin before Ray does; the tests marked `shared_ray` join the shared Ray head (tests/support/sharedray.py) as `raydist
launch` joins a cluster, its warm interpreter forking the ranks as a SLURM node's does: an embedded instance of its
own costs a short run much CPU on the 2-core suite (benchmarks/shared_head.py, docs/dev/testing.md)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.jobutil import REPO, clean_env, launched_rank_pid
from tests.support.mlflowutil import client, mlflow_history, mlflow_runs

pytestmark = pytest.mark.slow

SCRIPT = REPO / "examples" / "ddp_train.py"
EPOCHS = ["--epochs", "6"]
BIN = Path(sys.executable).parent


def env(**extra: str) -> dict[str, str]:
    """A user's shell with the venv active; TMPDIR short (Ray's socket paths live under it)."""
    return clean_env(PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra)


@pytest.fixture(scope="module")
def work() -> Path:
    d = Path(tempfile.mkdtemp(prefix="rl-", dir="/tmp"))
    yield d
    import shutil

    shutil.rmtree(d, ignore_errors=True)


def launch(
    work: Path,
    name: str,
    *options: str,
    script_args: list[str] = (),
    extra_env: dict | None = None,
    command: list[str] | None = None,
    stderr=subprocess.PIPE,
) -> subprocess.Popen:
    return subprocess.Popen(
        [
            str(BIN / "raydist"),
            "launch",
            "--name",
            name,
            "--storage",
            str(work / "runs"),
            *options,
            "--",
            *(command or ["python", str(SCRIPT), *script_args]),
        ],
        cwd=work,
        env=env(TMPDIR=str(work), **(extra_env or {})),
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def summary(work: Path, name: str) -> dict:
    return json.loads((work / "runs" / name / "summary.json").read_text())


def rank_pid(work: Path, name: str, rank: int, start: int = 1) -> int:
    """The pid of `rank`'s script in start `start`, from the header of its log."""
    return launched_rank_pid(work / "runs" / name, rank, start)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.1)


def left_running(marker: str) -> list[str]:
    """Processes whose command line holds `marker` (a test's private directory)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmd:
                found.append(f"{d.name}: {cmd[:150]}")
    return found


@pytest.fixture(scope="module")
def torchrun_checksum(work: Path) -> float:
    """The same script, uninterrupted, under torchrun on this machine."""
    out = work / "torchrun.json"
    r = subprocess.run(
        [
            str(BIN / "torchrun"),
            "--standalone",
            "--nproc-per-node",
            "2",
            str(SCRIPT),
            *EPOCHS,
            "--snapshot",
            str(work / "torchrun-snap.pt"),
            "--out",
            str(out),
        ],
        cwd=work,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())["checksum"]


def test_a_torchrun_script_trains_unmodified_to_torchruns_checksum(work, torchrun_checksum):
    out = work / "plain.json"
    rc, stdout, stderr = finish(
        launch(
            work,
            "plain",
            "--workers",
            "2",
            "--set",
            "mlflow=true",
            script_args=[
                *EPOCHS,
                "--snapshot",
                str(work / "plain-snap.pt"),
                "--out",
                str(out),
                "--loader-workers",
                "1",
            ],
        )
    )
    assert rc == 0, stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["checksum"] == torchrun_checksum and result["world_size"] == 2
    lines = stdout.splitlines()
    assert lines and all(ln.startswith("[rank 0 ") for ln in lines), stdout[-2000:]  # rank 0's only, prefixed
    assert any("done: 192 steps" in ln for ln in lines)
    s = summary(work, "plain")
    assert (s["status"], s["exit_code"], s["restarts"], s["workers"]) == ("completed", 0, 0, 2)
    # On the embedded instance the first start's ranks begin before Ray is up, and import torch while it starts.
    t = s["startup_s"]
    assert 0 < t["placed"] < t["started"] < t["connected"] < s["wall_s"] and t["started"] < t["first_step"], t
    for rank in (0, 1):  # every rank's whole output is kept
        log = (work / "runs" / "plain" / "logs" / f"rank{rank}.log").read_text()
        assert f"=== raydist launch: start 1, rank {rank} on" in log
    assert "done: 192 steps" in (work / "runs" / "plain" / "logs" / "rank0.log").read_text()
    assert stderr.strip().splitlines()[-1].startswith("[raydist] plain: completed (every rank exited 0)")
    assert left_running(str(work)) == []  # the embedded instance (its temp dir is here) ended before the command
    # In MLflow (its file store under the storage path): the options, rank 0's hook values, the summary, the logs
    (run,) = mlflow_runs(work / "runs")
    assert run.info.run_name == "plain" and run.info.status == "FINISHED"
    assert run.data.params["workers"] == "2" and "ddp_train.py" in run.data.params["command"]
    losses = mlflow_history(work / "runs", run.info.run_id, "train/loss")
    assert losses and [m.step for m in losses] == sorted({m.step for m in losses}) and losses[-1].step <= 192
    assert run.data.metrics["summary/restarts"] == 0
    assert {"summary.json", "logs", "metrics.jsonl"} <= {a.path for a in client(work / "runs").list_artifacts(
        run.info.run_id)}  # fmt: skip


@pytest.mark.shared_ray
def test_a_killed_rank_restarts_the_group_which_resumes_from_the_scripts_snapshot(work, torchrun_checksum):
    snap, out = work / "kill-snap.pt", work / "kill.json"
    # warm=true: what is tested is the launcher's restart, not the rank's start (a fresh one imports torch: CPU)
    proc = launch(
        work,
        "kill",
        "--workers",
        "2",
        "--max-restarts",
        "2",
        "--set",
        "warm=true",
        script_args=[*EPOCHS, "--step-sleep", "0.03", "--snapshot", str(snap), "--out", str(out)],
    )
    wait_for(snap, proc)  # trained 20 steps at least
    os.kill(rank_pid(work, "kill", 1), signal.SIGKILL)
    rc, stdout, stderr = finish(proc)
    assert rc == 0, stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["resumed_from"] and result["resumed_from"] >= 20 and result["steps"] == 192
    assert result["checksum"] == torchrun_checksum  # not a step lost or repeated
    s = summary(work, "kill")
    assert s["restarts"] == 1 and s["status"] == "completed"
    assert re.fullmatch(
        r"rank 1 on \S+ \(pid \d+\) was killed by signal 9(: .*)?; restarting every rank "
        r"\(1 of at most 2\)",
        s["failures"][0],
    ), s["failures"]
    assert "resumed from" in stdout
    assert rank_pid(work, "kill", 0, start=2)  # start 2 logged
    log = (work / "runs" / "kill" / "logs" / "rank1.log").read_text()
    assert "start 2, rank 1" in log


@pytest.mark.long
@pytest.mark.shared_ray
def test_a_stopped_rank_is_named_with_every_ranks_stack_within_the_bound(work):
    # The bound counts from each rank's start (a rank that hangs in init_process_group is the case users meet most):
    # it must outlast a silent start-up of Python, torch and DDP on 2 loaded cores (6 s once did not).
    snap, bound = work / "hang-snap.pt", 20.0
    proc = launch(
        work,
        "hang",
        "--workers",
        "2",
        "--max-restarts",
        "0",
        "--hang-timeout",
        f"{bound:g}",
        "--set",
        "warm=true",  # the hang rule is tested, not the rank's start (a fresh one imports torch)
        script_args=["--epochs", "100", "--step-sleep", "0.05", "--snapshot", str(snap)],
    )
    wait_for(snap, proc)
    pid = rank_pid(work, "hang", 1)
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    rc, _, stderr = finish(proc)
    took = time.monotonic() - stopped
    assert rc == 1, stderr[-3000:]
    line = stderr.strip().splitlines()[-1]
    stacks = work / "runs" / "hang" / "stacks" / "start1"
    assert re.fullmatch(
        rf"raydist: error: hang: rank 1 on \S+ \(pid {pid}\) printed nothing and reported no step for "
        rf"\d+ s \(hang_timeout_s=20\) \(its process was stopped\); every rank's stack is in {stacks}",
        line,
    ), line
    # Not before the bound, and once: before a second bound could pass. What comes after the bound (the launcher's
    # poll, the dumps, the shutdown) took 8-9 s on 2 loaded cores, and 9.5 s once with the SLURM tests beside it,
    # so a tighter upper limit tests the machine's load, not the launcher.
    assert bound <= took < 2 * bound, took
    for rank in (0, 1):
        text = (stacks / f"rank{rank}.txt").read_text()
        assert "ddp_train.py" in text and "main" in text, text  # the script's own frames
    assert left_running(str(work / "hang-snap.pt")) == []


def dashboard_run(stderr, run: str, proc: subprocess.Popen, timeout: float = 120) -> dict:
    """The run as the local instance's dashboard lists it (Ray Train's run list), once it shows two workers."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        text = stderr()
        url = re.search(r"local Ray dashboard: (http://\S+)", text)
        token = re.search(r"the dashboard's token is in (\S+) ", text)
        if url and token:
            req = urllib.request.Request(
                f"{url.group(1)}/api/train/v2/runs/v1",
                headers={"Authorization": f"Bearer {Path(token.group(1)).read_text().strip()}"},
            )
            try:
                with urllib.request.urlopen(req, timeout=20) as resp:
                    runs = [r for r in json.loads(resp.read())["train_runs"] if r["name"] == run]
            except urllib.error.HTTPError as e:  # a 500 while Ray Train's state actor starts on a loaded machine
                if e.code < 500:
                    raise
                text, runs = f"{text}\n(last answer: HTTP {e.code}: {e.read()[:300]!r})", []
            except (TimeoutError, urllib.error.URLError) as e:  # no answer in 20 s once, on the loaded CI machine
                text, runs = f"{text}\n(last answer: {e!r})", []
            if runs and runs[0]["attempts"] and len(runs[0]["attempts"][-1]["workers"]) == 2:
                return runs[0]
        assert proc.poll() is None and time.monotonic() < deadline, text[-2000:]
        time.sleep(1)


def top_ranks(work: Path, run: str, proc: subprocess.Popen, timeout: float = 60) -> list[dict]:
    """`raydist top --once --json` on the run's local Ray instance, once it shows the run's ranks with a step."""
    deadline = time.monotonic() + timeout
    while True:
        r = subprocess.run(
            [str(BIN / "raydist"), "top", "--once", "--json", "--temp-dir", str(work / "ray")],
            env=env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        runs = {x["run"]: x for x in json.loads(r.stdout)["runs"]} if r.returncode == 0 else {}
        ranks = runs.get(run, {}).get("processes", [])
        if len(ranks) == 2 and all("step" in x and "cpu_share" in x for x in ranks):
            assert runs[run]["strategy"] == "launch"
            return ranks
        assert proc.poll() is None and time.monotonic() < deadline, (r.stdout[-2000:], r.stderr[-2000:])
        time.sleep(1)


@pytest.mark.long
def test_sigterm_reaches_every_rank_which_snapshots_and_a_rerun_resumes(work, torchrun_checksum):
    snap, out = work / "term-snap.pt", work / "term.json"
    args = [*EPOCHS, "--snapshot", str(snap), "--out", str(out)]
    # Slow steps until the SIGTERM (about 40 s of run), so that a dashboard slow to answer on a loaded machine
    # still finds the run going; the rerun, whose checksum is compared, runs at full speed.
    slow = [*args, "--step-sleep", "0.3"]
    log = work / "term-stderr.txt"
    with open(log, "w") as err:
        proc = launch(work, "term", "--workers", "2", script_args=slow, stderr=err)
    wait_for(snap, proc)
    run = dashboard_run(log.read_text, "term", proc)  # in the dashboard's Train run list, with both ranks
    assert run["status"] == "RUNNING" and run["attempts"][-1]["status"] == "RUNNING"
    assert sorted(w["world_rank"] for w in run["attempts"][-1]["workers"]) == [0, 1]
    ranks = top_ranks(work, "term", proc)  # `raydist top` lists the script's ranks while it runs
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    for r in ranks:
        assert r["state"] == "alive" and r["restarts"] == 0 and r["step"] >= 1 and r["loss"] > 0
        assert r["rss_bytes"] > 50 * 2**20 and 0 <= r["cpu_share"] < 4
    proc.send_signal(signal.SIGTERM)
    rc, stdout, _ = finish(proc)
    stderr = log.read_text()
    assert rc == 0, stderr[-3000:]
    s = summary(work, "term")
    assert (s["status"], s["reason"]) == ("stopped", "raydist launch received SIGTERM")
    m = re.search(r"SIGTERM: snapshot at step (\d+), exiting", stdout)
    assert m, stdout[-2000:]
    assert not out.exists()
    from tests.support import sharedray

    # The rerun joins the shared head, as `raydist launch` joins a cluster: where it resumes is the script's own.
    rc, stdout, stderr = finish(launch(work, "term", "--workers", "2", script_args=args, extra_env=sharedray.job_env()))
    assert rc == 0, stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["resumed_from"] == int(m.group(1)) and result["checksum"] == torchrun_checksum


def test_each_rank_sees_one_coherent_launcher_and_none_of_the_ray_start_steps_task(work):
    seen = work / "env"
    seen.mkdir()
    # As on a SLURM node: the Ray worker inherits the `srun ray start` step's variables.
    inherited = {
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "3",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "ray-up",
        "RANK": "9",
    }
    rc, _, stderr = finish(
        launch(
            work,
            "env",
            "--workers",
            "3",
            "--max-restarts",
            "0",
            extra_env=inherited,
            command=["python", str(REPO / "tests" / "launch_scripts" / "env_dump.py"), str(seen), "--beside"],
        )
    )
    assert rc == 0, stderr[-3000:]
    ranks = [json.loads((seen / f"rank{r}.json").read_text()) for r in range(3)]
    for r, got in enumerate(ranks):
        e = got["env"]
        assert got["rank_sum"] == 3.0  # 0 + 1 + 2: the group really met at MASTER_ADDR:MASTER_PORT
        assert e["RANK"] == e["SLURM_PROCID"] == e["LOCAL_RANK"] == e["SLURM_LOCALID"] == str(r)
        assert e["WORLD_SIZE"] == e["SLURM_NTASKS"] == e["LOCAL_WORLD_SIZE"] == e["SLURM_NTASKS_PER_NODE"] == "3"
        assert e["GROUP_RANK"] == e["SLURM_NODEID"] == "0" and e["SLURM_NNODES"] == "1"
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert e["SLURM_JOB_ID"] == "4242" and e["SLURM_JOB_NAME"] == "ray-up"  # the allocation's: kept
        assert "SLURM_STEP_ID" not in e and not any(k.startswith("RAY_JOB") for k in e)
        assert e["TORCHELASTIC_RUN_ID"] == ranks[0]["env"]["TORCHELASTIC_RUN_ID"]
        assert e["SLURM_NODELIST"] == got["hostname"]
        # Ray's daemons beside it yield to it (raydist.driver.yielding), the rank keeps the caller's priority, and
        # raydist's own Ray setting did not reach the script's environment.
        assert got["niceness"] == os.getpriority(os.PRIO_PROCESS, 0) and "RAY_prestart_worker_first_driver" not in e
        assert got["beside"] == {"gcs_server": 19, "raylet": got["niceness"]}, got["beside"]


@pytest.mark.long
@pytest.mark.shared_ray
def test_lightning_fabric_finds_one_launcher_and_trains_under_it(work):
    pytest.importorskip("lightning_fabric")
    seen = work / "fabric"
    seen.mkdir()
    rc, _, stderr = finish(
        launch(
            work,
            "fabric",
            "--workers",
            "2",
            "--max-restarts",
            "0",
            command=["python", str(REPO / "tests" / "launch_scripts" / "fabric_env.py"), str(seen)],
        )
    )
    assert rc == 0, stderr[-3000:]
    for r in range(2):
        got = json.loads((seen / f"rank{r}.json").read_text())
        assert got["chosen"] == "TorchElasticEnvironment"  # Fabric's first choice, and it is there
        assert (got["global_rank"], got["world_size"], got["local_rank"], got["node_rank"]) == (r, 2, r, 0)
        assert got["rank_sum"] == 1.0
        views = got["views"]  # the SLURM view Fabric would take otherwise says the same
        assert views["TorchElasticEnvironment"][:4] == views["SLURMEnvironment"][:4] == [r, 2, r, 0]
        assert views["TorchElasticEnvironment"][4:] == views["SLURMEnvironment"][4:]  # same MASTER_ADDR:PORT


@pytest.mark.shared_ray
def test_a_script_that_refuses_its_input_is_one_line_exit_2_and_nothing_left_running(work):
    script = work / "refuses.py"
    script.write_text("import sys\nprint('usage: refuses.py --data DIR', file=sys.stderr)\nsys.exit(2)\n")
    rc, stdout, stderr = finish(launch(work, "refuses", "--workers", "2", command=["python", str(script)]))
    assert rc == 2, stderr[-3000:]
    errors = [ln for ln in stderr.splitlines() if ln.startswith("raydist: error:")]
    assert len(errors) == 1 and stderr.strip().splitlines()[-1] == errors[0]
    assert re.fullmatch(
        r"raydist: error: refuses: rank \d on \S+ \(pid \d+\) exited 2: usage: refuses.py --data DIR "
        r"\(exit 2: the script refused its input; not restarted\)",
        errors[0],
    ), errors
    assert "Traceback" not in stderr
    assert summary(work, "refuses")["restarts"] == 0
    time.sleep(1)
    assert left_running(str(work)) == []  # neither the ranks nor the local Ray instance (its temp dir is here)
    assert list(work.glob("raydist-launch-*")) == []  # nor the agents' files for the hook


EDGES = REPO / "tests" / "launch_scripts" / "edges.py"


@pytest.mark.shared_ray
def test_a_variable_set_only_in_the_callers_shell_reaches_every_rank_as_under_srun(work):
    seen = work / "caller-env"
    seen.mkdir()
    rc, _, stderr = finish(
        launch(
            work,
            "caller-env",
            "--workers",
            "2",
            "--env",
            "FROM_ENV_FLAG=yes",
            extra_env={"CLIENT_EPOCHS": "3", "PYTHONPATH": str(work), "HOSTNAME": "login01"},
            command=["python", str(EDGES), "env", str(seen)],
        )
    )
    assert rc == 0, stderr[-3000:]
    for r in range(2):
        got = json.loads((seen / f"rank{r}.json").read_text())
        assert got["CLIENT_EPOCHS"] == "3" and got["FROM_ENV_FLAG"] == "yes" and got["RANK"] == str(r)
        # What raydist adds to notice the script's return is gone before the script runs: its PYTHONPATH is its own.
        assert got["PYTHONPATH"] == str(work) and not got["sys_path_has_raydist_site"], got
        assert got["raydist_variables"] == [] and got["HOSTNAME"] != "login01"
        assert got["TORCHELASTIC_ERROR_FILE"].endswith(f"error-start0-rank{r}.json")


@pytest.mark.shared_ray
@pytest.mark.parametrize(
    "mode, fault",
    [
        ("abort-at-exit", r"rank 1 on \S+ \(pid \d+\) was then killed by signal 6 on its way out"),
        (
            "hang-at-exit",
            r"rank 0 on \S+ \(pid \d+\) then printed nothing and did not exit for 3 s \(exit_timeout_s\); "
            r"its stack is in \S+/stacks/start1/exit-rank0\.txt; killed",
        ),
    ],
)
def test_a_rank_that_fails_after_its_script_returned_is_one_line_exit_1_and_never_rerun(work, mode, fault):
    name = f"exit-{mode}"
    rc, stdout, stderr = finish(
        launch(
            work,
            name,
            "--workers",
            "2",
            "--max-restarts",
            "3",
            "--set",
            "exit_timeout_s=3",
            command=["python", str(EDGES), mode, str(work)],
        )
    )
    assert rc == 1, stderr[-3000:]
    errors = [ln for ln in stderr.splitlines() if ln.startswith("raydist: error:")]
    assert len(errors) == 1 and "Traceback" not in stderr
    assert re.fullmatch(
        rf"raydist: error: {name}: every rank's script returned, but {fault}; not restarted", errors[0]
    ), errors
    s = summary(work, name)
    assert s["status"] == "exit_fault" and s["exit_code"] == 1 and s["restarts"] == 0 and s["failures"] == []
    assert sum(bool(r["exit_fault"]) for r in s["ranks"]) == 1
    if mode == "hang-at-exit":
        assert "never-ends" in (work / "runs" / name / "stacks" / "start1" / "exit-rank0.txt").read_text()


@pytest.mark.shared_ray
def test_a_script_decorated_with_record_is_named_by_its_exception_and_line_as_torchrun_does(work):
    rc, _, stderr = finish(
        launch(
            work, "record", "--workers", "2", "--max-restarts", "0", command=["python", str(EDGES), "record", str(work)]
        )
    )
    assert rc == 1, stderr[-3000:]
    errors = [ln for ln in stderr.splitlines() if ln.startswith("raydist: error:")]
    assert len(errors) == 1, stderr[-3000:]
    assert re.fullmatch(
        r"raydist: error: record: rank 1 on \S+ \(pid \d+\) exited 1: ValueError: learning rate 7 is "
        rf"out of range \(at {re.escape(str(EDGES))}:\d+\)",
        errors[0],
    ), errors
    s = summary(work, "record")
    assert s["error"]["message"] == "ValueError: learning rate 7 is out of range" and s["error"]["rank"] == 1
    assert s["error"]["where"].startswith(f"{EDGES}:")
