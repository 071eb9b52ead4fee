"""Sweeps with Ray Tune (jobs/tune.py): the space as the config writes it, refused before anything starts when a
trial's job would refuse it; a short sweep end to end, where ASHA stops the trailing trial, the best settings come
out as a config the strategy's job takes, and the same command again keeps the finished trials."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from raydist.config import load_config
from raydist.errors import ConfigError
from raydist.observability.metrics import read_steps
from raydist.sweeps import space
from raydist.sweeps.trial import Tail, evaluation_reports
from tests.support.jobutil import REPO, clean_env, run_job, summary
from tests.support.mlflowutil import mlflow_runs


def _cfg(*overrides: str):
    return load_config(None, [], list(overrides))


@pytest.mark.parametrize(
    "text, kind, args",
    [
        ("loguniform(1e-4, 1e-1)", "loguniform", (1e-4, 0.1)),
        ("uniform(0, 0.5)", "uniform", (0, 0.5)),
        ("randint(1, 4)", "randint", (1, 4)),
        ("choice([32, 64])", "choice", ((32, 64),)),
        ("grid([sgd, adamw])", "grid", (("sgd", "adamw"),)),
    ],
)
def test_each_distribution_is_read_as_written(text, kind, args):
    assert space.parse("optim.lr", text) == space.Dimension("optim.lr", kind, args)


@pytest.mark.parametrize(
    "key, text, message",
    [
        ("optim.lr", "loguniform(0, 0.1)", r"tune.space.optim.lr: needs 0 < low"),
        ("optim.lr", "uniform(0.1, 0.01)", r"tune.space.optim.lr: needs low < high"),
        ("optim.lr", "normal(0, 1)", r"tune.space.optim.lr: must be one of uniform\(...\)"),
        ("optim.lr", "choice([])", r"tune.space.optim.lr: choice\(\[a, b, ...\]\)"),
        ("optim.bogus", "choice([1, 2])", r"tune.space.optim.bogus: 1 is refused: unknown key 'optim.bogus'"),
        ("train.batch_size", "randint(0, 8)", r"tune.space.train.batch_size: 0 is refused: train.batch_size"),
        ("run.name", "choice([a, b])", r"tune.space.run.name: must be a run-config key like optim.lr outside run"),
    ],
)
def test_a_space_a_trial_would_refuse_is_refused_naming_the_key(key, text, message):
    with pytest.raises(ConfigError, match=message):
        space.dimensions(_cfg(), {key: text})


def test_the_space_can_come_from_set_as_nested_keys():
    cfg = _cfg("tune.space.optim.lr=loguniform(1e-4, 1e-1)", "tune.space.train.batch_size=choice([16, 32])")
    assert cfg.tune.space == {"optim.lr": "loguniform(1e-4, 1e-1)", "train.batch_size": "choice([16, 32])"}
    assert space.overrides({"optim.lr": 0.1, "train.batch_size": 16}) == {
        "optim": {"lr": 0.1},
        "train": {"batch_size": 16},
    }


def test_each_evaluation_becomes_one_report_with_the_latest_loss(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = Tail(path)
    with open(path, "w") as f:
        f.write(json.dumps({"step": 1, "loss": 2.0}) + "\n" + json.dumps({"step": 2, "loss": 1.5}) + "\n")
        f.write(json.dumps({"eval_at_step": 2, "test_accuracy": 0.5, "test_loss": 1.4}) + "\n")
        f.write('{"step": 3, "lo')  # a line being written: not read until whole
    reports, last = evaluation_reports(tail.lines(), None)
    assert reports == [{"step": 2, "test_accuracy": 0.5, "test_loss": 1.4, "loss": 1.5}] and last == 1.5
    with open(path, "a") as f:
        f.write('ss": 1.0}\n')
    assert evaluation_reports(tail.lines(), last) == ([], 1.0)


def test_a_trial_the_clusters_stop_request_ended_is_unfinished_not_errored_and_the_sweep_stopped(tmp_path):
    from types import SimpleNamespace

    from raydist.sweeps import results
    from raydist.sweeps.trial import STOPPED, Stopped

    def result(trial: str, error: Exception | None) -> SimpleNamespace:
        return SimpleNamespace(metrics_dataframe=None, metrics={"trial_id": trial}, config={"optim.lr": 0.01},
                               path=str(tmp_path / trial), error=error)  # fmt: skip

    stopped = Stopped(f"trial b stopped at step 12: SLURM time limit (cluster ends in 80 s) ({STOPPED})")
    grid = [result("a", RuntimeError("trial a: sync exited 1: raydist: error: boom")), result("b", stopped)]
    cfg = _cfg(f"run.storage_path={tmp_path}", "tune.space.optim.lr=grid([0.01])")
    Path(cfg.run.run_dir).mkdir(parents=True, exist_ok=True)
    done = results.write(cfg, grid, tmp_path / "trials", 0.0)
    assert (done.status, done.unfinished, done.errored) == ("stopped", 1, 1)
    rows = (Path(cfg.run.run_dir) / "results.md").read_text().splitlines()
    assert rows[2].startswith("| a | 0.01 | error: trial a: sync exited 1") and rows[3].endswith(
        "| unfinished (resumes) |"
    )


@pytest.mark.slow
@pytest.mark.shared_ray  # as on a cluster: compare, its sweep and the trials' jobs join a running Ray
def test_compare_with_tune_sweeps_the_strategy_then_runs_it_at_its_best_settings(tmp_path):
    """The short version of the next and of the fair comparison (benchmarks/strategies_compare.py --tune): compare's
    sweep is the tune job, whose trial's job joins the sweep's Ray and reports its evaluations to Tune; its best
    settings file is what the strategy's job then runs."""
    done = summary(run_job("compare", f"run.storage_path={tmp_path}", "run.name=fair", "compare.tune=true",
                           "compare.strategies=sync", "tune.space.optim.lr=grid([0.02])", "tune.num_samples=1",
                           "train.epochs=1", "scaling.num_workers=1", timeout=600))  # fmt: skip
    assert done["tuned"] == {"sync": {"optim.lr": 0.02}} and done["test_accuracy"]["sync"] >= 0.85, done
    swept = json.loads((tmp_path / "fair" / "results.json").read_text())["sweeps"]["sync"]
    assert (swept["trials"], swept["stopped_early"], swept["errored"]) == (1, 0, 0) and swept["best_metric"] >= 0.85
    best = yaml.safe_load(Path(swept["best_config"]).read_text())
    assert best["optim"]["lr"] == 0.02 and "run" not in best and "tune" not in best
    (trial,) = json.loads((tmp_path / "fair" / "sweeps" / "sync" / "results.json").read_text())["trials"]
    assert trial["steps"] == 44 and [step for step, _ in trial["curve"]] == [44, 44]  # its evaluation, its summary
    # compare's own run of sync is at the sweep's best: its schedule peaks at 0.02 (the job's default is 0.003)
    steps = read_steps(json.loads((tmp_path / "fair" / "runs" / "sync" / "summary.json").read_text())["metrics_file"])
    assert max(s["lr"] for s in steps.values()) == pytest.approx(0.02)
    table = (tmp_path / "fair" / "results.md").read_text().splitlines()
    assert table[0].startswith("| strategy | settings (best of its sweep) |") and "| optim.lr 0.02 |" in table[2]


@pytest.mark.long
def test_a_sweep_stops_the_trailing_trial_writes_the_best_config_and_resumes_without_rerunning(tmp_path):
    sweep = (
        f"run.storage_path={tmp_path}",
        "run.name=sweep",
        "tune.space.optim.lr=grid([0.02, 0.00001])",  # in this order; the second trails from its first evaluation
        "tune.num_samples=1",
        "tune.max_concurrent=1",  # one after the other: ASHA has the first trial's result when the second reports
        "train.epochs=2",
        "scaling.num_workers=1",
        "run.mlflow=true",
    )
    first = summary(run_job("tune", *sweep, timeout=600))
    assert (first["trials"], first["stopped_early"], first["errored"]) == (2, 1, 0), first
    assert first["best_values"] == {"optim.lr": 0.02} and first["best_metric"] >= 0.9
    rows = (tmp_path / "sweep" / "results.md").read_text().splitlines()
    assert rows[0] == "| trial | optim.lr | test_accuracy | steps | time (s) | stopped early |"
    assert [r.rsplit("|", 2)[-2].strip() for r in rows[2:]] == ["no", "yes"]
    assert (tmp_path / "sweep" / "plot.png").stat().st_size > 0
    # MLflow: the sweep, and the finished trial's job (the stopped one's logs only if it ends before Tune ends it)
    assert [r.info.run_name for r in mlflow_runs(tmp_path)] == ["sweep"]
    trials = {r.data.params["optim.lr"]: r.info.status for r in mlflow_runs(tmp_path / "sweep" / "trials")}
    assert trials["0.02"] == "FINISHED" and trials.get("1e-05", "KILLED") in ("FINISHED", "KILLED")
    # The best settings, as a config the strategy's job takes as it is
    best = yaml.safe_load((tmp_path / "sweep" / "best.yaml").read_text())
    assert best["optim"]["lr"] == 0.02 and "run" not in best and "tune" not in best
    shown = subprocess.run(
        [sys.executable, "-m", "raydist.cli", "config", "show", "--job", "sync", "--config",
         str(tmp_path / "sweep" / "best.yaml")], capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert shown.returncode == 0 and "  lr: 0.02\n" in shown.stdout, shown.stderr
    # The same command again: the finished sweep is restored, no trial runs again
    again = run_job("tune", *sweep, timeout=600)
    assert summary(again)["best_values"] == first["best_values"]
    assert "[tune] restoring the sweep" in again.stdout
    logs = sorted((tmp_path / "sweep" / "trials").glob("*.log"))
    assert len(logs) == 2 and all(log.read_text().count('{"strategy": "sync"') <= 1 for log in logs)


def test_the_python_api_refuses_a_bad_space_before_ray_starts(tmp_path):
    import raydist

    with pytest.raises(ConfigError, match=r"^tune.space.optim.lr: needs low < high"):
        raydist.tune("sync", space={"optim.lr": "uniform(0.1, 0.01)"}, num_samples=2,
                     run={"storage_path": str(tmp_path)})  # fmt: skip
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()
    assert not (tmp_path / "tune-digits").exists()


def _request_stop(head) -> None:
    """The cluster's stop request on `head`, as the SLURM side sets it at the time-limit warning."""
    code = (f"import ray; ray.init(address={head.gcs_address!r}, logging_level='ERROR'); "
            "from raydist.cluster.preemption import request_stop; request_stop('SLURM time limit', 90)")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], env=head.node_env(), cwd=REPO, check=True, capture_output=True)


@pytest.mark.long
def test_a_sweep_stopped_by_the_clusters_request_shows_its_trials_in_top_and_resumes_only_the_unfinished(tmp_path):
    """On a Ray head: `raydist top` and the dashboard's Train page show each trial's run while it trains; the
    cluster's stop request (SLURM's warning sets it) lands while the second trial trains; the sweep ends stopped. The same command on a new head
    (the requeued allocation's) keeps the first trial and resumes the second at its checkpoint.
    test_slurm_resilience runs the same in batch mode on SLURM."""
    import time

    from raydist.cluster.dashboard_client import get_json
    from raydist.observability import top
    from tests.support.cluster.resilience import trained_past
    from tests.support.rayhead import ray_head

    args = [sys.executable, str(REPO / "jobs" / "tune.py")]
    for o in (f"run.storage_path={tmp_path}", "run.name=sw", "tune.space.optim.lr=grid([0.02, 0.01])",
              "tune.num_samples=1", "tune.max_concurrent=1", "tune.scheduler=fifo", "train.epochs=3",
              "scaling.num_workers=1", "checkpoint.every_steps=10", "straggler.worker=0", "straggler.slowdown=4"):  # fmt: skip
        args += ["--set", o]
    trials, seen, listed = tmp_path / "sw" / "trials", set(), set()
    with ray_head(num_cpus=2, env={"RAY_metrics_report_interval_ms": "1000"}) as head:
        source = top.Source(
            "test head", dashboard_url=head.dashboard_url, token=Path(head.token_path).read_text().strip()
        )
        proc = subprocess.Popen(args, cwd=REPO, env={**head.node_env(), "RAY_ADDRESS": head.gcs_address},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        deadline = time.monotonic() + 400
        while True:
            done = list(trials.glob("*/summary.json")) if trials.is_dir() else []
            training = [d for d in trials.iterdir() if d.is_dir() and d / "summary.json" not in done] if done else []
            if len(done) == 1 and any(trained_past(d, 10) for d in training):
                break
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-4000:]
            if done or seen & listed:  # the first trial, once seen; the second's stop must not wait on the looks
                time.sleep(0.2)
                continue
            try:
                seen |= {r["run"] for r in top.snapshot(source)["runs"]}
                runs = get_json(f"{head.dashboard_url}/api/train/v2/runs/v1", source.token)["train_runs"]
                listed |= {r["name"] for r in runs}
            except Exception:  # noqa: BLE001 — a look that failed (the head busy) is retried
                pass
            time.sleep(0.5)
        first, written = done[0].parent, done[0].stat().st_mtime
        _request_stop(head)
        out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out[-4000:]
    # `raydist top` and the dashboard's Train page showed the first trial's run, by its trial id
    assert first.name in seen and first.name in listed, (seen, listed)
    stopped = json.loads((tmp_path / "sw" / "summary.json").read_text())
    assert (stopped["status"], stopped["unfinished"], stopped["errored"]) == ("stopped", 1, 0), stopped
    assert "1 trial(s) unfinished; the same command resumes the sweep" in out and "Traceback" not in out, out[-4000:]
    with ray_head(num_cpus=2) as head:
        again = subprocess.run(args, cwd=REPO, env={**head.node_env(), "RAY_ADDRESS": head.gcs_address},
                               capture_output=True, text=True, timeout=600)  # fmt: skip
    assert again.returncode == 0 and "[tune] restoring the sweep" in again.stdout, again.stdout[-4000:]
    result = json.loads((tmp_path / "sw" / "summary.json").read_text())
    assert (result["status"], result["trials"], result["unfinished"], result["errored"]) == ("completed", 2, 0, 0)
    assert (first / "summary.json").stat().st_mtime == written  # the finished trial was not run again
    (second,) = [d for d in trials.iterdir() if d.is_dir() and d != first]
    resumed = json.loads((second / "summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["resumed_from_step"] >= 10, resumed


@pytest.mark.long
def test_raydist_tune_sweeps_your_own_model_and_data_by_its_own_loss(tmp_path):
    """From Python, as docs/tune.md shows: a regression raydist has never seen (its model, data and loss passed as
    functions from the user's module), swept by test loss, lower is better; each trial's job imports the module."""
    from tests.test_your_code import REGRESSION

    (tmp_path / "regress.py").write_text(REGRESSION)
    script = (
        "import raydist, regress\n"
        "s = raydist.tune('sync', space={'optim.lr': 'grid([0.1, 0.0001])'}, num_samples=1, metric='test_loss',\n"
        "                 model=regress.make_model, data=regress.make_datasets, loss=regress.mse,\n"
        "                 train={'max_steps': 60}, schedule={'name': 'constant', 'warmup_steps': 0},\n"
        "                 scaling={'num_workers': 1}, tune={'scheduler': 'fifo', 'max_concurrent': 1},\n"
        f"                 run={{'name': 'own', 'storage_path': {str(tmp_path / 'runs')!r}}})\n"
        "print('BEST', s.best_values, s.best_metric, s.trials, s.errored)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=clean_env(), capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    best = next(ln for ln in done.stdout.splitlines() if ln.startswith("BEST"))
    assert best.startswith("BEST {'optim.lr': 0.1} ") and best.endswith(" 2 0"), best
    assert float(best.split()[3]) < 1.0, best  # the variance of y is 14.25: the best trial learned the map


def _job_pid(trial_yaml: Path) -> int | None:
    """The pid of the trial's job (`python -m raydist.job <strategy> --config <trial>.yaml`), a descendant of this
    test's sweep."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"raydist.job" in argv and str(trial_yaml).encode() in argv:
            return int(cmdline.parent.name)
    return None


@pytest.mark.long
def test_a_trial_whose_job_dies_runs_once_more_and_resumes_while_the_other_trials_are_untouched(tmp_path):
    """What a lost node does to the trials on it: the first trial's job is SIGKILLed mid-run. Tune runs that trial
    once more, its job resumes from its own checkpoint, and the sweep completes with no error; the second trial runs
    once."""
    import os
    import signal
    import time

    from tests.support.cluster.resilience import trained_past

    args = [sys.executable, str(REPO / "jobs" / "tune.py")]
    for o in (f"run.storage_path={tmp_path}", "run.name=sw", "tune.space.optim.lr=grid([0.02, 0.01])",
              "tune.num_samples=1", "tune.max_concurrent=1", "tune.scheduler=fifo", "train.epochs=3",
              "scaling.num_workers=1", "checkpoint.every_steps=10", "straggler.worker=0", "straggler.slowdown=4"):  # fmt: skip
        args += ["--set", o]
    proc = subprocess.Popen(
        args, cwd=REPO, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    trials, deadline = tmp_path / "sw" / "trials", time.monotonic() + 300
    while not (trials.is_dir() and any(trained_past(d, 12) for d in trials.iterdir() if d.is_dir())):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-4000:]
        time.sleep(0.2)
    (first,) = [d for d in trials.iterdir() if d.is_dir()]
    pid = _job_pid(trials / f"{first.name}.yaml")
    assert pid, "the trial's job is not running"
    os.kill(pid, signal.SIGKILL)
    out = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, out[-4000:]
    result = json.loads((tmp_path / "sw" / "summary.json").read_text())
    assert (result["status"], result["trials"], result["errored"], result["unfinished"]) == ("completed", 2, 0, 0)
    again = json.loads((first / "summary.json").read_text())
    assert again["status"] == "completed" and again["resumed_from_step"] >= 10, again
    (second,) = [d for d in trials.iterdir() if d.is_dir() and d != first]
    assert json.loads((second / "summary.json").read_text())["resumed_from_step"] is None
