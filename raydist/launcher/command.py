"""`raydist launch [options] -- COMMAND...`: run a torchrun- or srun-style script on every worker of the Ray cluster.

    raydist launch --workers 2 -- python train.py --epochs 5          # embedded Ray instance on this machine
    ray job submit --working-dir . -- raydist launch --workers 3 -- python train.py
    sbatch cluster/ray_up.slurm raydist launch --workers 3 -- python train.py   # SLURM batch mode

Every option is a key of `raydist.launcher.settings.LaunchConfig` (`--set key=value`, `--config FILE`); the flags
below are the common ones. docs/launch.md has the environment each rank gets, faults, output and status.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

from raydist.errors import RaydistError, UsageError

FLAGS = {  # flag -> (settings key, metavar, help)
    "--workers": ("workers", "N|MIN-MAX", "processes in all (WORLD_SIZE); MIN-MAX: elastic (default 2)"),
    "--procs-per-node": ("procs_per_node", "K", "processes per node (default: spread over the nodes)"),
    "--cpus-per-worker": ("cpus_per_worker", "C", "Ray CPUs reserved per process (default 1)"),
    "--max-restarts": ("max_restarts", "N", "restarts of the whole group after a failure (default 3)"),
    "--hang-timeout": ("hang_timeout_s", "S", "name a rank silent this long, dump every stack (default 300)"),
    "--signal": ("stop_signal", "SIG", "sent to every rank at the time limit or preemption (default SIGTERM)"),
    "--grace": ("grace_s", "S", "seconds the ranks have to exit after that signal (default 30)"),
    "--export": (
        "export",
        "ALL|NONE|[ALL,]NAME[=VALUE],...",
        "which of your environment every rank gets, as srun's --export (default ALL)",
    ),
    "--output": ("output", "rank0|all|none", "whose output the console shows (default rank0)"),
    "--name": ("name", "NAME", "run name (default launch-<script>)"),
    "--storage": ("storage_path", "DIR", "where the run directory goes (default ~/raydist_runs)"),
    "--address": ("address", "HOST:PORT", "Ray cluster (default: $RAY_ADDRESS, else a local instance)"),
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "launch",
        help="run your own torchrun- or srun-style training script on every worker of the "
        "Ray cluster, unmodified (docs/launch.md)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for flag, (key, metavar, help) in FLAGS.items():
        p.add_argument(flag, dest=key, metavar=metavar, help=help)
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="env",
        help="a variable every rank gets with this value (repeatable)",
    )
    p.add_argument("--gpu", dest="use_gpu", action="store_const", const="true", help="one GPU per process")
    p.add_argument("--config", action="append", default=[], metavar="FILE", help="YAML of launch settings")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="any launch setting, e.g. --set hang_timeout_s=60 (repeatable)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command every rank runs, after --")
    p.set_defaults(func=_launch)


def overrides(args: argparse.Namespace) -> list[str]:
    """The flags as --set overrides, before the explicit ones (which win)."""
    out = [f"{key}={getattr(args, key)}" for key, _, _ in FLAGS.values() if getattr(args, key) is not None]
    if args.use_gpu:
        out.append("use_gpu=true")
    for pair in args.env:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"raydist launch: --env needs KEY=VALUE (got {pair!r})")
        out.append(f"env.{name}={json.dumps(value)}")  # a YAML string as given: 'yes' stays 'yes', not true
    return out + list(args.overrides)


def check_command(command: list[str], cwd: str) -> None:
    """The command exists, and so does a Python script it names: one line and exit 2 before Ray starts."""
    if not command:
        raise UsageError(
            "raydist launch: give the command every rank runs after --, e.g. "
            "raydist launch --workers 2 -- python train.py"
        )
    program = command[0]
    if program.startswith("-"):
        raise UsageError(f"raydist launch: unknown option {program!r} (options go before --, the command after it)")
    if not (shutil.which(program) or (os.sep in program and os.access(program, os.X_OK))):
        raise UsageError(f"raydist launch: command not found: {program}")
    if os.path.basename(program).startswith("python"):
        script = _python_script(command[1:])
        if script is not None and not os.path.isfile(os.path.join(cwd, script)):
            where = "" if os.path.isabs(script) else f" (in {cwd})"
            raise UsageError(f"raydist launch: script not found: {script}{where}")


def _python_script(args: list[str]) -> str | None:
    """The script path a python command line runs; None for -m, -c or an interactive interpreter."""
    takes_value = {"-W", "-X", "--check-hash-based-pycs"}
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-m", "-c", "-") or a.startswith(("-m", "-c")):
            return None
        if a in takes_value:
            i += 2
            continue
        if not a.startswith("-"):
            return a
        i += 1
    return None


def cluster_address(cfg) -> str:
    """The GCS address to join; '' for the embedded instance (raydist.driver.preflight.join_address)."""
    from raydist.driver.preflight import join_address

    return join_address(cfg.address)


def check_before_ray(cfg) -> None:
    from raydist.driver.preflight import check_ray_target, check_writable, local_gpu_count

    check_writable(cfg.run_dir, "storage_path")
    from raydist.observability.tracking import check_available

    check_available(cfg.mlflow)
    address = cluster_address(cfg)
    check_ray_target(address)
    if cfg.use_gpu and not address and local_gpu_count() < cfg.min_workers:
        raise UsageError(
            f"raydist launch: --gpu with workers={cfg.workers} needs {cfg.min_workers} GPU(s) but this "
            f"machine has {local_gpu_count()}; leave out --gpu or start fewer workers"
        )


def check_cluster_gpus(cfg, address: str) -> None:
    """On joining a cluster: --gpu needs a GPU per process somewhere (else placing them would wait, then fail)."""
    import ray

    have = int(ray.cluster_resources().get("GPU", 0))
    if cfg.use_gpu and have < cfg.min_workers:
        raise UsageError(
            f"raydist launch: --gpu with workers={cfg.workers} needs {cfg.min_workers} GPU(s) but the "
            f"Ray cluster at {address} has {have}; leave out --gpu or start fewer workers"
        )


def connect(cfg) -> str:
    """Join the cluster (address or RAY_ADDRESS), else start the embedded instance sized for the run."""
    import logging

    import ray

    from raydist.driver.preflight import check_reachable
    from raydist.driver.session import prepare_ray_environment, start_local
    from raydist.warm.client import NO_PRESTART

    prepare_ray_environment()
    address = cluster_address(cfg)
    if address:
        check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise RaydistError(f"cannot connect to Ray at {address}: {str(e).splitlines()[0]}") from None
        check_cluster_gpus(cfg, address)
        return address
    # Its first start's ranks run outside Ray, and its Ray workers are only their stand-ins and a restart's agents:
    # none needs a worker started ahead of need (ray::IDLE, one per CPU), which took CPU beside the ranks for the
    # whole run (benchmarks/footprint.py). The ranks get the caller's environment, not this.
    for key, value in NO_PRESTART.items():
        os.environ.setdefault(key, value)
    # ERROR: Ray's start-up lines (and its token notice) would mix into the script's own output.
    start_local(
        max(os.cpu_count() or 1, int(cfg.max_workers * cfg.cpus_per_worker + 0.999)), logging.ERROR, notice=sys.stderr
    )
    print(
        f"[raydist] local Ray dashboard: {os.environ['RAY_API_SERVER_ADDRESS']} (the run is on its Train page)",
        file=sys.stderr,
        flush=True,
    )
    return "local"


class RankFailed(RaydistError):
    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def track(cfg, command: list[str], summary: dict | None, failed: str | None = None) -> None:
    """The run in MLflow, where tracking is on (raydist.observability.tracking)."""
    from raydist.launcher.output import say
    from raydist.launcher.settings import to_dict
    from raydist.observability import tracking

    if tracking.enabled(cfg.mlflow):
        tracking.log_as_a_view(
            say,
            cfg.name,
            cfg.storage_dir,
            experiment=cfg.mlflow_experiment,
            run_dir=cfg.run_dir,
            config={"command": " ".join(command), **to_dict(cfg)},
            summary=summary,
            tags={"raydist.strategy": "launch"},
            failed=failed,
            every_key=True,
        )


def _launch(args: argparse.Namespace) -> int:
    from raydist.launcher import settings

    started = time.perf_counter()
    caller = dict(os.environ)  # before raydist sets anything of its own: what the ranks get (--export)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    cwd = os.getcwd()
    cfg = settings.load(args.config, overrides(args), command)
    check_command(command, cwd)
    check_before_ray(cfg)
    from raydist.launcher.driver import LaunchRun
    from raydist.launcher.output import say

    try:
        summary = LaunchRun(
            cfg, command, cwd, started, connect, embedded=not cluster_address(cfg), caller_env=caller
        ).run()
    except Exception as e:
        track(cfg, command, None, failed=str(e).splitlines()[0] if str(e) else type(e).__name__)
        raise
    finally:
        from raydist.driver.ending import end_local

        end_local()  # now rather than at exit: half a second less (measured), and errors print after it
    track(cfg, command, summary.to_dict())
    if summary.status in ("failed", "exit_fault"):
        raise RankFailed(f"{cfg.name}: {summary.reason}", summary.exit_code)
    say(
        f"{cfg.name}: {summary.status} ({summary.reason}) after {summary.wall_s:.1f} s, {summary.restarts} "
        f"restart(s); summary {os.path.join(cfg.run_dir, 'summary.json')}"
    )
    return 0
