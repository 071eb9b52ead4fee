"""Reading a run's MLflow store back with MLflow's own client, as a user's `mlflow ui` or script would."""

from __future__ import annotations

import os
from pathlib import Path


def client(storage: Path):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    import mlflow

    return mlflow.MlflowClient(tracking_uri=f"file:{storage / 'mlruns'}")


def mlflow_runs(storage: Path, experiment: str = "raydist") -> list:
    c = client(storage)
    found = c.get_experiment_by_name(experiment)
    return [] if found is None else c.search_runs([found.experiment_id])


def mlflow_history(storage: Path, run_id: str, key: str) -> list:
    return sorted(client(storage).get_metric_history(run_id, key), key=lambda m: m.step)
