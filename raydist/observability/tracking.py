"""A run in MLflow: its config as params, every step's metrics, its summary and its run directory as artifacts.

On when `run.mlflow` is true or `MLFLOW_TRACKING_URI` is set. The driver logs the run when a session ends (completed,
stopped or failed), from the files the run already writes (metrics.jsonl, summary.json): no worker imports MLflow
and training never waits on a tracking server. One raydist run is one MLflow run: a resumed session (a requeue, a
re-run with the same name) logs into it, adding only the steps after those already logged.

The default store is MLflow's file store under the storage path (`<storage_path>/mlruns`): it needs no server, and
every node writes its own run's directory on the shared file system, where a SQLite file would need locks that
network file systems do not keep. MLflow 3 keeps that store in maintenance mode and asks for
MLFLOW_ALLOW_FILE_STORE=true to use it; raydist sets it for its own default only. Checked with mlflow-skinny 3.17.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from raydist.errors import UsageError

TRACKING_ENV = "MLFLOW_TRACKING_URI"
STORE_DIR = "mlruns"
RUN_DIR_TAG = "raydist.run_dir"
LOGGED_TAG = "raydist.logged_through_step"
MAX_PARAM_CHARS = 6000  # MLflow refuses a longer param value
BATCH = 1000  # MLflow's limit on metrics per log_batch (params: 100)
SKIPPED = ("checkpoint_",)  # the run directory's checkpoints stay where they are; their path is a tag
STATUS = {"completed": "FINISHED", "stopped": "KILLED", "failed": "FAILED", "exit_fault": "FAILED"}


def enabled(wanted: bool) -> bool:
    return wanted or bool(os.environ.get(TRACKING_ENV))


def tracking_uri(storage_dir: str) -> str:
    return os.environ.get(TRACKING_ENV) or "file:" + os.path.join(storage_dir, STORE_DIR)


def check_available(wanted: bool) -> None:
    """Before Ray starts: MLflow must be importable where tracking is on."""
    if not enabled(wanted):
        return
    try:
        import mlflow  # noqa: F401
    except ImportError:
        why = "run.mlflow is true" if wanted else f"{TRACKING_ENV} is set"
        raise UsageError(
            f"{why} but MLflow is not installed: pip install 'raydist[mlflow]', or --set run.mlflow=false"
            + (f" and unset {TRACKING_ENV}" if os.environ.get(TRACKING_ENV) else "")
        ) from None


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{'optim': {'lr': 0.1}} -> {'optim.lr': '0.1'}: a nested config as MLflow params (strings, within its limit)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_params(value, name + "."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            out[name] = text[:MAX_PARAM_CHARS]
    return out


NOT_METRICS = ("step", "epoch", "time_s")


def step_metrics(
    records: Iterable[dict[str, Any]], after: int, every_key: bool = False
) -> Iterator[tuple[str, float, int]]:
    """(name, value, step) for every step after `after` in metrics.jsonl's records: `train/<key>` per step (the
    TensorBoard tags; with `every_key`, each number a record holds, as a launched script's hook reports them) and
    `eval/<key>` per evaluation; a re-run step's latest record wins."""
    from raydist.observability.tensorboard_log import EVAL_KEYS, TRAIN_KEYS

    steps: dict[int, dict[str, Any]] = {}
    evals: dict[int, dict[str, Any]] = {}
    for r in records:
        if "step" in r:
            steps[r["step"]] = r
        elif "eval_at_step" in r:
            evals[r["eval_at_step"]] = r
    for group, keys, rows in (("train", TRAIN_KEYS, steps), ("eval", EVAL_KEYS, evals)):
        for step in sorted(s for s in rows if s > after):
            for key in [k for k in rows[step] if k not in NOT_METRICS] if every_key and group == "train" else keys:
                value = rows[step].get(key)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    yield f"{group}/{key}", float(value), int(step)


def summary_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The summary's numbers (test_accuracy, wall_s, steps_per_s, ...) as `summary/<key>`."""
    return {
        f"summary/{k}": float(v)
        for k, v in summary.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line torn by a kill: the others stand
            continue
    return out


def artifacts(run_dir: Path) -> list[Path]:
    """What of the run directory is logged: everything but its checkpoints."""
    if not run_dir.is_dir():
        return []
    return sorted(p for p in run_dir.iterdir() if not p.name.startswith(SKIPPED))


class Tracker:
    """One raydist run's MLflow run, found again by its run directory."""

    def __init__(self, storage_dir: str, experiment: str):
        if not os.environ.get(TRACKING_ENV):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        import mlflow

        self.uri = tracking_uri(storage_dir)
        self.client = mlflow.MlflowClient(tracking_uri=self.uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)

    def run_for(self, run_dir: str, name: str, params: dict[str, str], tags: dict[str, str]) -> tuple[str, int]:
        """The MLflow run of `run_dir` (made, with its params, the first time), and the last step it has."""
        hits = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{RUN_DIR_TAG}` = '{run_dir}'", max_results=1
        )
        if hits:
            run = hits[0]
            self.client.update_run(run.info.run_id, status="RUNNING")
            return run.info.run_id, int(run.data.tags.get(LOGGED_TAG, "0"))
        run = self.client.create_run(self.experiment_id, run_name=name, tags={RUN_DIR_TAG: run_dir, **tags})
        items = list(params.items())
        from mlflow.entities import Param

        for i in range(0, len(items), 100):
            self.client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in items[i : i + 100]])
        return run.info.run_id, 0

    def log(self, run_id: str, metrics: list[tuple[str, float, int]], last_step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        for i in range(0, len(metrics), BATCH):
            batch = [Metric(k, v, now, s) for k, v, s in metrics[i : i + BATCH]]
            self.client.log_batch(run_id, metrics=batch)
        self.client.set_tag(run_id, LOGGED_TAG, str(last_step))

    def finish(self, run_id: str, run_dir: Path, status: str) -> None:
        for path in artifacts(run_dir):
            if path.is_dir():
                self.client.log_artifacts(run_id, str(path), artifact_path=path.name)
            else:
                self.client.log_artifact(run_id, str(path))
        self.client.set_terminated(run_id, status=status)


def log_run(
    *,
    storage_dir: str,
    experiment: str,
    run_dir: str,
    name: str,
    config: dict[str, Any],
    summary: dict[str, Any] | None,
    tags: dict[str, str],
    failed: str | None = None,
    every_key: bool = False,
) -> str:
    """Log one session of a run (raydist.observability.tracking's docstring); its MLflow run id."""
    tracker = Tracker(storage_dir, experiment)
    status = (summary or {}).get("status", "failed" if failed else "completed")
    tags = {**tags, "raydist.status": status, **({"raydist.error": failed[:5000]} if failed else {})}
    run_id, logged = tracker.run_for(run_dir, name, flat_params(config), tags)
    for key, value in tags.items():
        tracker.client.set_tag(run_id, key, value)
    from raydist.observability.metrics import METRICS_FILE

    new = list(step_metrics(read_records(Path(run_dir) / METRICS_FILE), after=logged, every_key=every_key))
    last = max([logged, *(s for _, _, s in new)])
    final = [(k, v, last) for k, v in summary_metrics(summary or {}).items()]
    tracker.log(run_id, new + final, last)
    tracker.finish(run_id, Path(run_dir), STATUS.get(status, "FAILED"))
    return run_id


def log_as_a_view(say: Callable[[str], None], name: str, storage_dir: str, **run: Any) -> None:
    """`log_run`, saying its run's id in one line, or in one line why the store failed: tracking is a view, as the
    dashboard is, and the job's result and exit stay the training's."""
    try:
        run_id = log_run(storage_dir=storage_dir, name=name, **run)
        say(f"{name}: MLflow run {run_id} at {tracking_uri(storage_dir)}")
    except Exception as e:  # noqa: BLE001 - any store error
        say(
            f"{name}: not logged to MLflow ({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else '-'})"
        )
