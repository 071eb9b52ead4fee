"""`raydist launch`'s settings: declared, loaded and checked like the run config (raydist.config).

Every option of `raydist launch` is a field here; a command-line flag such as `--workers 2` is `--set workers=2`,
and `--config FILE` reads the same keys from YAML. docs/configuration.md's launch table is generated from these
fields (`raydist config reference --launch`).
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from raydist.typedconfig import (
    WorkerRange,
    check,
    experiment_name,
    free,
    merge,
    opt,
    run_name,
    shared_path,
    validate,
    worker_count,
)

WHAT = "launch settings (workers, max_restarts, ...)"


def _export(value: str, key: str) -> str:
    from raydist.launcher.environment import Export

    try:
        Export.parse(str(value))
    except ValueError as e:
        check(False, key, f"{e} (ALL, NONE or [ALL,]NAME[=VALUE],... as srun's --export; got {value!r})")
    return str(value)


def _variables(value: Any, key: str) -> dict[str, str]:
    from raydist.launcher.environment import check_variable_name

    check(isinstance(value, dict), key, f"must be a mapping of variable names to values (got {value!r})")
    out = {}
    for name, v in value.items():
        try:
            check_variable_name(str(name))
        except ValueError as e:
            check(False, key, str(e))
        check(not isinstance(v, (dict, list)), key, f"{name}: must be a string (got {v!r})")
        out[str(name)] = "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
    return out


def _signal_name(value: str, key: str) -> str:
    name = value.upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    check(
        name in signal.Signals.__members__ and name not in ("SIGKILL", "SIGSTOP"),
        key,
        f"must name a signal a script can handle, such as TERM, INT or USR1 (got {value!r})",
    )
    return name


@dataclass
class LaunchConfig(WorkerRange):
    """A script launched on every worker of the Ray cluster, torchrun- and srun-style."""

    COUNT_FIELD: ClassVar[str] = "workers"

    workers: int | str = opt(
        2,
        "processes running the script in all (WORLD_SIZE): N, or MIN-MAX for an elastic run that starts with "
        "as many as fit and restarts with fewer when nodes are lost",
        parse=worker_count,
        shown="N or MIN-MAX",
    )
    procs_per_node: int = opt(
        0,
        "processes per node (LOCAL_WORLD_SIZE), each node's ranks on one node together; 0 = as Ray places "
        "them, spread over the nodes as far as they go",
        ge=0,
    )
    cpus_per_worker: float = opt(1.0, "Ray CPUs reserved per process", gt=0)
    use_gpu: bool = opt(
        False, "one GPU per process; CUDA_VISIBLE_DEVICES lists its node's GPUs so that device LOCAL_RANK is its own"
    )
    export: str = opt(
        "ALL",
        "which of the caller's environment variables every rank gets, as srun's --export: ALL (the shell's "
        "that ran raydist launch, less what describes that shell itself; docs/launch.md), NONE (only the node's), "
        "or [ALL,]NAME[=VALUE],...",
        parse=_export,
        shown="ALL, NONE or [ALL,]NAME[=VALUE],...",
    )
    env: dict = free(
        "variables every rank gets with these values (--env KEY=VALUE), over the caller's and the node's",
        parse=_variables,
    )
    max_restarts: int = opt(
        3,
        "restarts of the whole group after a rank exited non-zero, died, hung or lost its node "
        "(TORCHELASTIC_RESTART_COUNT counts them); -1 = unlimited",
        ge=0,
        special={-1: "unlimited"},
    )
    hang_timeout_s: float = opt(
        300.0,
        "a rank that prints nothing and reports no step (raydist.hook.report) for this long is named with "
        "every rank's Python stack, and the group stops (then restarts within max_restarts); 0 = never",
        ge=0,
    )
    stop_signal: str = opt(
        "SIGTERM",
        "sent to every rank at the SLURM time-limit warning, on preemption (a drained node) and when "
        "raydist launch itself is interrupted",
        parse=_signal_name,
        shown="signal name",
    )
    grace_s: float = opt(
        30.0,
        "after stop_signal, how long the ranks have to exit (less when the cluster ends sooner) before they are killed",
        ge=0,
    )
    output: Literal["rank0", "all", "none"] = opt(
        "rank0",
        "which ranks' output the console shows, each line prefixed [rank N node]; every rank's is kept "
        "in <run dir>/logs/rank<N>.log",
    )
    warm: bool = opt(
        False,
        "on a cluster the SLURM bring-up started, fork each process from its node's warm interpreter, which "
        "has torch imported: a faster start, but the script shares that process's state (docs/launch.md); "
        "false = a fresh Python, as torchrun and srun start it",
    )
    exit_timeout_s: float = opt(
        60.0,
        "after a rank's script has returned, how long its process may stay silent without exiting "
        "(non-daemon threads, atexit, interpreter teardown, destructors) before its stack is dumped and it is "
        "killed: an exit fault, never a restart. Raise it for long silent work at exit (an upload in atexit)",
        gt=0,
    )
    start_timeout_s: float = opt(
        120.0,
        "how long placing the processes may take (at the start, and after a node was lost) before the run "
        "fails naming the dead nodes",
        gt=0,
    )
    name: str = opt(
        "",
        "run name: the run directory under storage_path and the dashboard's run; '' = launch-<script name>",
        parse=run_name,
    )
    storage_path: str = opt(
        "~/raydist_runs",
        "where the run directory goes (logs, stack dumps, summary.json); on the driver's node",
        parse=shared_path,
    )
    address: str = opt(
        "",
        "Ray cluster to use: '' = RAY_ADDRESS if set (as under `ray job submit` and in SLURM "
        "batch mode), else start a local Ray instance",
    )
    mlflow: bool = opt(
        False,
        "log the run to MLflow when it ends: these options as params, rank 0's values reported through the optional "
        "hook at each step the launcher saw (metrics.jsonl), the summary, the logs (docs/launch.md#mlflow); also on "
        "when MLFLOW_TRACKING_URI is set",
    )
    mlflow_experiment: str = opt("raydist", "the MLflow experiment the run is logged in", parse=experiment_name)

    def check(self, prefix: str) -> None:
        if self.procs_per_node:
            check(
                self.min_workers % self.procs_per_node == 0 and self.max_workers % self.procs_per_node == 0,
                f"{prefix}procs_per_node",
                f"must divide workers={self.workers} (got {self.procs_per_node})",
            )

    @property
    def storage_dir(self) -> str:
        return os.path.abspath(os.path.expanduser(self.storage_path))

    @property
    def run_dir(self) -> str:
        return os.path.join(self.storage_dir, self.name)


def default_name(command: list[str]) -> str:
    """launch-<script stem> (python train.py, python -m pkg.train: launch-train; ./run.sh: launch-run)."""
    args = command[1:]
    if "-m" in args[:-1]:
        script = args[args.index("-m") + 1].rpartition(".")[2]
    else:
        script = next((a for a in args if not a.startswith("-")), command[0] if command else "script")
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", os.path.splitext(os.path.basename(script))[0]).strip("-.")
    return f"launch-{stem or 'script'}"


def load(files: Iterable[str], overrides: Iterable[str], command: list[str]) -> LaunchConfig:
    cfg = merge(LaunchConfig(), files, overrides, what=WHAT, kind="launch config")
    if not cfg.name:
        cfg.name = default_name(command)
    return validate(cfg)


def to_dict(cfg: LaunchConfig) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(cfg)
