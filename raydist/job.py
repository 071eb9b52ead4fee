"""The entry of every job: parse its command line, check it, run the strategy's driver, hand over the summary.

    python -m raydist.job <job> [--config FILE] [--set key=value] ...
jobs/<job>.py are the same entry point with the job's name filled in.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from raydist import registry
from raydist.atomic import write_json_atomic
from raydist.cli import OneLineParser
from raydist.config import Config, job_defaults, load_config
from raydist.driver.preflight import check_before_ray
from raydist.driver.session import Session, prepare_ray_environment
from raydist.engines import finished
from raydist.errors import UsageError, exits_cleanly, last_error_line
from raydist.summary import RESULT_ENV


def parse_job_args(job: str, argv: list[str] | None, doc: str | None = None) -> Config:
    parser = OneLineParser(prog=f"jobs/{job}.py", description=doc)
    parser.add_argument(
        "--config", action="append", default=[], metavar="FILE", help="YAML merged over the job's defaults (repeatable)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="override one key, e.g. --set optim.lr=0.01 (repeatable)",
    )
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also print Ray Train's per-report and per-checkpoint lines and every report's metrics "
        "(the same as --set run.verbose=true)",
    )
    args = parser.parse_args(argv)
    cfg = load_config(
        job_defaults(job), args.config, [*args.overrides, *(["run.verbose=true"] if args.verbose else [])], job=job
    )
    if args.print_config:
        import yaml

        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
        sys.exit(0)
    return cfg


def run_job(job: str, cfg: Config, started: float | None = None) -> Any:
    """Run `job` (a registry name) on `cfg`; writes its summary.json and returns the summary. A run that completed
    with this very config is reported again without starting Ray (raydist.engines.finished). A strategy that cannot run
    here runs as its registry fallback, after one line saying why."""
    job, why = registry.runnable(job, cfg)
    if why:
        print(
            f"[raydist] {why}: training with {job}, which restarts from checkpoints, instead",
            file=sys.stderr,
            flush=True,
        )
    prepare_ray_environment()  # before anything imports Ray, which reads some of it then
    check_before_ray(job, cfg)
    summary = finished.completed_summary(job, cfg)
    if summary is not None:
        print(finished.notice(summary), file=sys.stderr, flush=True)
    else:
        finished.forget(cfg)  # until this session's summary is written, the record may not vouch for it
        session = Session(job=job, started=time.perf_counter() if started is None else started)
        spec = registry.get(job)
        try:
            summary = spec.load_driver(cfg.scaling.engine)(cfg, spec, session)
        except KeyboardInterrupt:  # Ctrl-C, or a sweep stopping this trial
            track(job, cfg, {"status": "stopped"})
            raise
        except Exception as e:
            track(job, cfg, None, failed=last_error_line(e))
            raise
        summary.write()
        finished.record(job, cfg)
        if session.ray == "local":  # the embedded instance ends with the job: now, not in Ray's exit hook,
            from raydist.driver.ending import end_local  # which first sleeps half a second

            end_local()
        track(job, cfg, summary.to_dict())
    if os.environ.get(RESULT_ENV):  # batch mode reads the job's status there, a reported run's too
        write_json_atomic(Path(os.environ[RESULT_ENV]), summary.to_dict())
    return summary


def track(job: str, cfg: Config, summary: dict | None, failed: str | None = None) -> None:
    """This session in MLflow, where tracking is on (raydist.observability.tracking)."""
    from raydist.observability import tracking

    if tracking.enabled(cfg.run.mlflow):
        tracking.log_as_a_view(
            lambda line: print(f"[raydist] {line}", file=sys.stderr, flush=True),
            cfg.run.name,
            cfg.run.storage_dir,
            experiment=cfg.run.mlflow_experiment,
            run_dir=cfg.run.run_dir,
            config=cfg.to_dict(),
            summary=summary,
            tags={"raydist.strategy": job},
            failed=failed,
        )


@exits_cleanly
def job_main(job: str, argv: list[str] | None = None, doc: str | None = None) -> int:
    from raydist.versions import check_versions

    started = time.perf_counter()
    check_versions()
    if job not in registry.jobs():
        raise UsageError(f"unknown job {job!r} (choose from {', '.join(registry.jobs())})")
    cfg = parse_job_args(job, argv, doc or registry.get(job).summary)
    summary = run_job(job, cfg, started)
    print(json.dumps(summary.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        from raydist.errors import fail

        fail(
            f"usage: python -m raydist.job JOB [--config FILE] [--set KEY=VALUE]... (JOB: {', '.join(registry.jobs())})"
        )
    from raydist.process_exit import exit_now

    exit_now(job_main(sys.argv[1], sys.argv[2:]))
