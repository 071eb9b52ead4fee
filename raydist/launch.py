"""The driver side of a job: parse its command line, connect to Ray (local or a cluster), run the trainer, print the summary."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any, Callable

from raydist.cli import OneLineParser
from raydist.config import Config, job_defaults, load_config
from raydist.data import load_splits
from raydist.errors import RaydistError, exits_cleanly
from raydist.sharding import check_fits


def parse_job_args(job: str, argv: list[str] | None, doc: str | None = None) -> Config:
    parser = OneLineParser(prog=f"jobs/{job}.py", description=doc)
    parser.add_argument("--config", action="append", default=[], metavar="FILE", help="YAML merged over the job's defaults (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides", help="override one key, e.g. --set optim.lr=0.01 (repeatable)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    args = parser.parse_args(argv)
    cfg = load_config(job_defaults(job), args.config, args.overrides)
    if args.print_config:
        import yaml

        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
        sys.exit(0)
    return cfg


def connect(cfg: Config) -> str:
    """Join the named cluster (run.address or RAY_ADDRESS), else start a local Ray instance sized for the job."""
    import ray

    address = cfg.run.address or os.environ.get("RAY_ADDRESS", "")
    if address:
        check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=True)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise RaydistError(f"cannot connect to Ray at {address}: {str(e).splitlines()[0]}") from None
        return address
    needed = cfg.scaling.num_workers * cfg.scaling.cpus_per_worker
    # The embedded default: a private instance that ends with this process; oversubscribing a small
    # machine is fine for CPU training, refusing to start is not.
    # address="local": a new instance even when /tmp/ray/ray_current_cluster names another (maybe dead) one.
    # Loopback only: nothing outside this machine can reach (or needs) a private instance.
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, int(needed + 0.999)), include_dashboard=True,
             dashboard_host="127.0.0.1",
             _node_ip_address="127.0.0.1")
    return "local"


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, with one line, when a named cluster does not answer: ray.init would retry for minutes."""
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise RaydistError(f"Ray address must be host:port or ray://host:port (got {address!r})")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise RaydistError(f"cannot reach Ray at {address}: {e.strerror or e}") from None


def build_trainer(cfg: Config, train_fn: Callable[[dict[str, Any]], None]):
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    return TorchTrainer(
        train_loop_per_worker=train_fn,
        train_loop_config=cfg.to_dict(),
        scaling_config=ScalingConfig(
            num_workers=cfg.scaling.num_workers,
            use_gpu=cfg.scaling.use_gpu,
            resources_per_worker={"CPU": cfg.scaling.cpus_per_worker, **({"GPU": 1} if cfg.scaling.use_gpu else {})},
        ),
        torch_config=TorchConfig(backend=cfg.scaling.resolved_backend),
        run_config=RunConfig(
            name=cfg.run.name,
            storage_path=cfg.run.storage_dir,
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.checkpoint.keep),
            failure_config=FailureConfig(max_failures=cfg.scaling.max_failures),
        ),
    )


def run_job(strategy: str, cfg: Config, train_fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Fit on Ray and return the job's summary (the JSON line every job ends with)."""
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    # Ray Train holds one pending report per worker and drains it on each controller poll (2 s by
    # default), so a report every epoch of a small model would stall training; poll faster instead
    # (at 0.1 s the loop runs at 0.98x the steps/s of plain torchrun, 0.54x at 0.2 s; see benchmarks/).
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
    # Without this Ray Train echoes every worker print a second time through its logger.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    start = time.perf_counter()
    check_fits(cfg, len(load_splits(cfg.data).train))  # a bad batch size is exit 2 here, not a failed worker later
    where = connect(cfg)
    trainer = build_trainer(cfg, train_fn)
    from ray.train import TrainingFailedError

    try:
        result = trainer.fit()
    except TrainingFailedError as e:
        raise RaydistError(f"training failed: {last_error_line(e)}") from None
    metrics = result.metrics or {}
    return {
        "strategy": strategy,
        "run_name": cfg.run.name,
        "ray": where,
        "workers": cfg.scaling.num_workers,
        "steps": metrics.get("step"),
        "wall_s": round(time.perf_counter() - start, 3),
        "test_accuracy": metrics.get("test_accuracy"),
        "test_loss": metrics.get("test_loss"),
        "final_loss": metrics.get("loss"),
        "samples_per_s": metrics.get("samples_per_s"),
        "steps_per_s": metrics.get("steps_per_s"),
        "resumed_from_step": metrics.get("resumed_from_step"),
        "checkpoint": result.checkpoint.path if result.checkpoint else None,
        "metrics_file": os.path.join(cfg.run.run_dir, "metrics.jsonl"),
        # A strategy's own summary fields (e.g. bytes_per_worker, wait_s_per_worker), from its final report.
        **(metrics.get("summary_extra") or {}),
    }


def last_error_line(e: BaseException) -> str:
    """The line of a (possibly wrapped) remote error that says what went wrong: the innermost cause's last."""
    cause = e
    while cause.__cause__ is not None:
        cause = cause.__cause__
    lines = [ln for ln in str(cause).splitlines() if ln.strip()]
    return lines[-1] if lines else type(cause).__name__


@exits_cleanly
def job_main(strategy: str, job: str, train_fn: Callable[[dict[str, Any]], None], doc: str | None = None,
             argv: list[str] | None = None) -> int:
    cfg = parse_job_args(job, argv, doc)
    summary = run_job(strategy, cfg, train_fn)
    print(json.dumps(summary), flush=True)
    return 0
