"""scaling.engine=launch: a loop strategy's job run by `raydist launch`'s loop, one plain process per worker.

The workers are `raydist.engines.process_worker` ranks started by the launcher's agents; what happens to them (a failed rank,
a lost node, a hang, the time limit, preemption) is the launcher's policy (raydist.launcher.policy), and a restart
resumes from the run's newest valid checkpoint. The summary is the same `JobSummary` as on Ray Train, from rank 0's
final report (`raydist.train.result`) or, for a run resumed at its very end, the newest checkpoint's report.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

from raydist import registry
from raydist.atomic import write_json_atomic
from raydist.config import Config
from raydist.driver.session import Session, connect, starts_embedded
from raydist.engines.raytrain_worker import FAILURE_FILE
from raydist.errors import RaydistError
from raydist.launcher.settings import LaunchConfig
from raydist.observability.metrics import METRICS_FILE
from raydist.summary import JobSummary

STOP_GRACE_S = 60.0
"""After the stop signal, how long the ranks have to reach a sync point and checkpoint (less when the cluster's
deadline is nearer: the launcher's rule)."""


def launch_settings(cfg: Config) -> LaunchConfig:
    """The launcher's settings that say the same as the job's config."""
    from raydist.typedconfig import validate

    s = cfg.scaling
    return validate(
        LaunchConfig(
            workers=s.num_workers,
            cpus_per_worker=s.cpus_per_worker,
            use_gpu=s.use_gpu,
            max_restarts=s.max_failures,
            hang_timeout_s=cfg.faults.hang_timeout_s,
            grace_s=STOP_GRACE_S,
            output="rank0",
            name=cfg.run.name,
            # raydist's own worker loop is known to be safe to fork from a warm interpreter (a user's script is not)
            warm=True,
            storage_path=cfg.run.storage_dir,
            address=cfg.run.address,
        )
    )


def fit_as_processes(cfg: Config, spec: registry.StrategySpec, session: Session) -> JobSummary:
    """Run a loop strategy's workers as `raydist launch` ranks; its summary from rank 0's final report."""
    from raydist.launcher.driver import LaunchRun
    from raydist.observability.console import MetricsTail, ProgressBar, start_line
    from raydist.observability.ray_metrics import Exporter

    settings = launch_settings(cfg)
    fit_id = uuid.uuid4().hex
    job_file = Path(cfg.run.run_dir) / f".launch-{fit_id}.json"
    job_file.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        job_file,
        {"config": cfg.to_dict(), "strategy": spec.name, "fit_id": fit_id, "stop_signal": settings.stop_signal},
    )
    failure = Path(cfg.run.run_dir) / FAILURE_FILE
    failure.unlink(missing_ok=True)  # an earlier session's
    connected: list[float] = []
    began = time.time()  # the ranks of the first start may enter before Ray is up (LaunchRun's `embedded`)

    def join(_: LaunchConfig) -> str:
        session.ray = connect(cfg)
        connected.append(time.time())
        return session.ray

    command = [sys.executable, "-m", "raydist.engines.process_worker", str(job_file)]
    run = LaunchRun(
        settings,
        command,
        os.getcwd(),
        session.started,
        join,
        label=spec.name,
        hand_over=False,
        embedded=starts_embedded(cfg),
    )
    print(start_line(spec.name, cfg.run.run_dir), file=sys.stderr, flush=True)
    bar = ProgressBar(spec.name, export=Exporter(cfg.run.name, spec.name, "driver", 0))
    tail = MetricsTail(os.path.join(cfg.run.run_dir, METRICS_FILE), bar).start()
    outcome = None
    try:
        outcome = run.run()
    finally:
        tail.stop()
        bar.close(completed=outcome is not None and outcome.status == "completed" and not failure.exists())
        job_file.unlink(missing_ok=True)
    if outcome.status == "failed":
        raise RaydistError(f"training failed: {outcome.reason}")
    if failure.exists():
        raise RaydistError(f"training failed: {json.loads(failure.read_text())['reason']}")
    summary = _summary(cfg, session, connected[0] if connected else time.time(), began, fit_id, outcome.restarts)
    summary.warm_workers = sum(bool(r.get("warm")) for r in outcome.ranks)
    return summary


def _summary(cfg: Config, session: Session, connected: float, began: float, fit_id: str, restarts: int) -> JobSummary:
    from raydist.engines.raytrain import summary_of

    result = SimpleNamespace(metrics={}, checkpoint=None)
    newest = _newest_report(cfg.run.run_dir)
    if newest is not None:  # a run resumed at its very end took no step: its newest checkpoint has the final report
        result = SimpleNamespace(metrics=newest[0], checkpoint=SimpleNamespace(path=newest[1]))
    summary = summary_of(result, cfg, session, connected, fit_id, since=began)
    summary.restarts = max(summary.restarts, restarts)
    return summary


def _newest_report(run_dir: str) -> tuple[dict, str] | None:
    """The metrics rank 0 reported with the run's newest valid checkpoint, and its directory."""
    from raydist.torchkit.checkpoint import STATE_FILE, newest_valid
    from raydist.train.context import REPORT_FILE

    found, _ = newest_valid(run_dir, STATE_FILE)
    try:
        return (json.loads(Path(found, REPORT_FILE).read_text()), found) if found else None
    except (OSError, ValueError):
        return None
