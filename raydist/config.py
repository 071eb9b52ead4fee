"""The run config: what every job reads (`Config`), with each strategy's own section taken from the registry.

The engine that loads, checks and documents it is raydist.typedconfig; this module only declares the sections every
job shares and puts them together with the sections the registry's entries name (`StrategySpec.config`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, Literal

from raydist import registry
from raydist.typedconfig import (
    WorkerRange,
    apply,
    check,
    experiment_name,
    free,
    import_path,
    merge,
    opt,
    run_name,
    shared_path,
    validate,
    worker_count,
)

# ---- the run config ------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    """Which network to train: yours (`factory`), or a built-in one whose input and output sizes come from the data."""

    factory: str = opt(
        "",
        "your model: 'package.module:function' returning a torch.nn.Module, called with model.args as keyword "
        "arguments (and `data=`, the loaded data set, if it takes a `data` parameter); '' = the built-in model.name "
        "(docs/your-code.md)",
        parse=import_path,
    )
    args: dict[str, Any] = free("model.factory's keyword arguments, your own keys (e.g. {layers: 4, width: 256})")

    name: Literal["simple", "mlp", "cnn", "transformer"] = opt(
        "mlp",
        "simple: the seeds' SimpleModel (in -> 50 -> out); mlp: `depth` hidden layers; cnn: small CNN (image "
        "data only); transformer: `depth` pre-norm encoder layers over the input cut into `tokens` pieces",
    )
    hidden: int = opt(128, "width of the MLP's hidden layers, or the transformer's model width", ge=1)
    params: int = opt(
        0,
        "mlp, transformer: size the model by parameter count instead (e.g. 10000000 on data.name=synthetic): the "
        "width that comes closest at this depth replaces `hidden`; 0 = use `hidden`",
        ge=0,
        special={0: "use hidden"},
    )
    depth: int = opt(2, "number of hidden layers of the MLP, or of the transformer's encoder layers", ge=1)
    dropout: float = opt(0.0, "dropout probability after each hidden layer (mlp, cnn, transformer)", ge=0, lt=1)
    tokens: int = opt(8, "transformer: the input features are cut into this many equal tokens (digits: 8 rows)", ge=1)
    heads: int = opt(4, "transformer: attention heads; the width must be a multiple", ge=1)


@dataclass
class DataConfig:
    """The data set: yours (`factory`), real offline digits, or synthetic samples for throughput work."""

    factory: str = opt(
        "",
        "your data: 'package.module:function' returning (train, test), two torch Datasets of (input tensor, "
        "target) pairs, called with data.args as keyword arguments; '' = the built-in data.name (docs/your-code.md)",
        parse=import_path,
    )
    args: dict[str, Any] = free("data.factory's keyword arguments, your own keys (e.g. {samples: 4096})")

    name: Literal["digits", "synthetic"] = opt(
        "digits",
        "digits: scikit-learn's 8x8 handwritten digits (1797 images, 10 classes, ships in the wheel); synthetic: random features labelled by a fixed random teacher",
    )
    test_fraction: float = opt(
        0.2, "share of the data held out as the test split (stratified, fixed by `split_seed`)", gt=0, lt=1
    )
    split_seed: int = opt(0, "seed of the train/test split (kept apart from train.seed so runs compare on one split)")
    synthetic_samples: int = opt(20000, "synthetic: number of samples", ge=10)
    synthetic_features: int = opt(10, "synthetic: input features", ge=1)
    synthetic_classes: int = opt(2, "synthetic: number of classes", ge=2)


@dataclass
class OptimConfig:
    """The optimizer each worker steps (sync DDP, local SGD) or the parameter server applies (async)."""

    name: Literal["sgd", "adam", "adamw", "adagrad"] = opt("adamw", "optimizer")
    lr: float = opt(0.003, "peak learning rate", gt=0)
    momentum: float = opt(0.9, "momentum (sgd only)", ge=0, lt=1)
    weight_decay: float = opt(0.0, "weight decay", ge=0)


@dataclass
class ScheduleConfig:
    """Learning-rate schedule over the run's optimizer steps."""

    name: Literal["constant", "cosine", "linear"] = opt(
        "cosine", "shape after warm-up: constant, cosine decay or linear decay"
    )
    warmup_steps: int = opt(10, "linear warm-up steps from 0 to optim.lr", ge=0)
    min_lr_ratio: float = opt(0.0, "final learning rate as a fraction of optim.lr (cosine, linear)", ge=0, le=1)


@dataclass
class TrainConfig:
    """The training loop: batch, length, precision, clipping, accumulation, logging."""

    batch_size: int = opt(32, "samples per worker per micro-step", ge=1)
    epochs: int = opt(20, "passes over the training split (ignored when max_steps > 0)", ge=1)
    max_steps: int = opt(0, "optimizer steps in total; 0 lets `epochs` decide", ge=0)
    grad_accum: int = opt(1, "micro-steps per optimizer step; the all-reduce runs on the last one only", ge=1)
    grad_clip: float = opt(
        0.0, "clip the global gradient norm to this value; 0 = off (the norm is still reported)", ge=0
    )
    mixed_precision: Literal["auto", "bf16", "off"] = opt(
        "auto", "auto: bf16 autocast on GPU, fp32 on CPU; bf16: autocast always; off: fp32"
    )
    loss: str = opt(
        "",
        "'package.module:function' (output, target) -> the batch's mean loss, a scalar tensor; '' = cross-entropy "
        "of the output's last dimension (class scores) against integer targets",
        parse=import_path,
    )
    seed: int = opt(0, "seed of model init, data order and dropout")
    report_every_s: float = opt(
        1.0,
        "report step metrics to Ray Train (and, with run.verbose, print them on rank 0) about this often, in seconds; every step goes to metrics.jsonl",
        ge=0,
    )
    stop_at_step: int = opt(
        0, "end the run after this step and its checkpoint, as a preemption would; 0 = off (for resume tests)", ge=0
    )


@dataclass
class ScalingConfig(WorkerRange):
    """How many workers, on what hardware, talking over which collective backend."""

    num_workers: int | str = opt(
        2,
        "training workers (one process each): N, or MIN-MAX for an elastic run that continues on as few as MIN "
        "workers when nodes are lost and grows back to MAX when they return (a strategy that cannot says so before "
        "anything starts)",
        parse=worker_count,
        shown="N or MIN-MAX",
    )
    use_gpu: bool = opt(False, "one GPU per worker")
    engine: Literal["ray_train", "launch"] = opt(
        "ray_train",
        "what starts and watches the workers: ray_train, Ray Train with the torch backend (a controller, its "
        "helper actors and one actor per worker); launch, one plain process per worker started by raydist launch's "
        "agents, as torchrun would (docs/launch.md: the whole group restarts from the newest checkpoint after a "
        "failure, a hang is named with every rank's stack, the stop signal at the time limit), with fewer "
        "processes to start before the first step (docs/benchmarks.md). launch runs "
        + ", ".join(s.name for s in registry.STRATEGIES.values() if s.runs_as_processes),
    )
    backend: Literal["auto", "nccl", "gloo"] = opt(
        "auto", "torch.distributed backend; auto: nccl with GPUs, gloo without"
    )
    warm_python: bool = opt(
        True,
        "fork the job's Ray worker processes (Ray Train's controller, helper actors and workers) from a warm "
        "interpreter with torch imported: each node's on a cluster the SLURM bring-up started, one started for "
        "the embedded instance (docs/running.md); false = each a fresh Python, as Ray starts them",
    )
    cpus_per_worker: float = opt(1.0, "Ray CPUs reserved per worker", gt=0)
    max_failures: int = opt(
        3,
        "worker-group restarts from the latest checkpoint before the run fails; -1 = unlimited",
        ge=0,
        special={-1: "unlimited"},
    )
    max_preemptions: int = opt(
        -1,
        "restarts after a node was preempted (drained, then gone) before the run fails; -1 = unlimited",
        ge=0,
        special={-1: "unlimited"},
    )
    node_loss_timeout_s: float = opt(
        120.0,
        "fixed num_workers: after a worker group fails, the run fails if its N workers cannot be placed again "
        "within this many seconds (a lost node), naming the dead node(s)",
        gt=0,
    )
    resize_check_s: float = opt(
        30.0, "elastic num_workers: how often a running elastic run checks whether more workers fit again", gt=0
    )

    def check(self, prefix: str) -> None:
        check(
            not (self.backend == "nccl" and not self.use_gpu),
            f"{prefix}backend",
            "nccl needs GPUs: set scaling.use_gpu=true or backend=gloo",
        )

    @property
    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if self.use_gpu else "gloo"


@dataclass
class CheckpointConfig:
    """When to checkpoint, how many to keep, and how to upload."""

    every_steps: int = opt(0, "checkpoint every N optimizer steps; 0 = at the end of each epoch", ge=0)
    keep: int = opt(2, "checkpoints kept in storage (the newest)", ge=1)
    async_upload: bool = opt(False, "upload checkpoints in the background while training goes on")


@dataclass
class RunConfig:
    """Where a run lives: its name, its storage, the Ray cluster it uses."""

    name: str = opt(
        "",
        "run name; '' = <job>-<data.name>, e.g. sync-digits (with data.factory: <job>-<its top package>); re-running with the same name and storage_path resumes from its latest checkpoint",
        parse=run_name,
    )
    storage_path: str = opt(
        "~/raydist_runs",
        "directory for checkpoints and metrics, on a filesystem every node shares (absolute or ~)",
        parse=shared_path,
    )
    address: str = opt(
        "", "Ray cluster to use: '' = RAY_ADDRESS if set (as under `ray job submit`), else start a local Ray instance"
    )
    verbose: bool = opt(
        False,
        "console detail: true adds Ray Train's per-report and per-checkpoint INFO lines and every report's "
        "metrics from rank 0 (`--verbose` on a job's command line); false shows one progress bar per run. Ray's log "
        "files keep everything either way",
    )
    tensorboard: bool = opt(
        True,
        "write TensorBoard event files to tensorboard/ in the run directory from the same records as "
        "metrics.jsonl (per-step and per-evaluation scalars, the config as text; docs/running.md#tensorboard); "
        "false: metrics.jsonl only",
    )
    mlflow: bool = opt(
        False,
        "log the run to MLflow when a session ends: the config as params, every step's metrics from metrics.jsonl, "
        "the summary's numbers, and the run directory but its checkpoints as artifacts (docs/running.md#mlflow); "
        "also on when MLFLOW_TRACKING_URI is set, which names the store (default: <storage_path>/mlruns)",
    )
    mlflow_experiment: str = opt("raydist", "the MLflow experiment the run is logged in", parse=experiment_name)

    @property
    def storage_dir(self) -> str:
        """storage_path made absolute on the driver, so every worker agrees on it."""
        return os.path.abspath(os.path.expanduser(self.storage_path))

    @property
    def run_dir(self) -> str:
        return os.path.join(self.storage_dir, self.name)


@dataclass
class StragglerConfig:
    """Slow one worker down on purpose, the same way in every strategy (for experiments)."""

    worker: int = opt(-1, "rank of the worker to slow down; -1 = none", ge=0, special={-1: "none"})
    slowdown: float = opt(
        1.0,
        "that worker runs this many times slower: after each step it sleeps (slowdown - 1) x its own step time",
        ge=1,
    )
    pause_at_step: int = opt(0, "that worker pauses once, after its own step N; 0 = never", ge=0)
    pause_s: float = opt(0.0, "length of that pause in seconds", ge=0)


@dataclass
class FaultsConfig:
    """What bounds a hang, and how replicas that should agree are checked (faults inside a run)."""

    hang_timeout_s: float = opt(
        60.0,
        "a worker process that answers no health check for this long (stopped, frozen), or an async PS worker "
        "or server that makes no step or answers nothing that long, fails the run or restarts it within "
        "scaling.max_failures; the failure names it and its node",
        gt=0,
    )
    collective_timeout_s: float = opt(
        300.0,
        "process-group start-up and every gloo/NCCL collective give up after this many seconds (a peer that "
        "is alive but never joins)",
        gt=0,
    )
    desync_every_steps: int = opt(
        100, "every N steps all ranks compare fingerprints (parameter checksum, gradient norms); 0 = never", ge=0
    )
    desync_tolerance: float = opt(
        1e-6,
        "relative difference of two ranks' parameter checksums that counts as a desync (replicas that should "
        "be identical)",
        ge=0,
    )
    grad_norm_tolerance: float = opt(
        0.0,
        "also warn when a rank's local gradient norm (before the all-reduce) differs from the median by more "
        "than this fraction; 0 = only non-finite norms (small batches' norms routinely differ widely)",
        ge=0,
    )
    on_desync: Literal["warn", "stop", "restart"] = opt(
        "stop",
        "on a desync: warn = one line and go on; stop = fail the run (exit 1) keeping the last good "
        "checkpoint; restart = restart the workers from the last checkpoint (counts against scaling.max_failures)",
    )
    inject_desync_rank: int = opt(
        -1,
        "testing: this rank perturbs one parameter after step inject_desync_step; -1 = never",
        ge=0,
        special={-1: "never"},
    )
    inject_desync_step: int = opt(1, "testing: the step after which inject_desync_rank perturbs its parameters", ge=1)


class RunSchema:
    """What `Config` adds to its sections: the checks across them, and (de)serialising a whole run."""

    def check(self, prefix: str) -> None:
        check(
            not self.model.args or self.model.factory, "model.args", "are model.factory's arguments: set model.factory"
        )
        check(not self.data.args or self.data.factory, "data.args", "are data.factory's arguments: set data.factory")
        if not (self.model.factory or self.data.factory):  # yours are checked by calling them (raydist.factories)
            self._check_builtins()
        check(
            self.straggler.worker < self.scaling.max_workers,
            "straggler.worker",
            f"must be below scaling.num_workers={self.scaling.max_workers} (got {self.straggler.worker})",
        )
        check(
            self.faults.inject_desync_rank < self.scaling.max_workers,
            "faults.inject_desync_rank",
            f"must be below scaling.num_workers={self.scaling.max_workers} (got {self.faults.inject_desync_rank})",
        )

    def _check_builtins(self) -> None:
        check(
            not (self.model.name == "cnn" and self.data.name != "digits"),
            "model.name",
            "cnn needs image data: set data.name=digits",
        )
        check(
            not (self.model.params and self.model.name not in ("mlp", "transformer")),
            "model.params",
            f"sizes the mlp and the transformer only (model.name={self.model.name})",
        )
        if self.model.name == "transformer":
            features = 64 if self.data.name == "digits" else self.data.synthetic_features
            check(
                features % self.model.tokens == 0,
                "model.tokens",
                f"must divide the {features} input features into equal tokens (got {self.model.tokens})",
            )
            check(
                self.model.params or self.model.hidden % self.model.heads == 0,
                "model.hidden",
                f"must be a multiple of model.heads={self.model.heads} (got {self.model.hidden})",
            )

    def validate(self) -> Config:
        return validate(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Config:
        cfg = cls()
        apply(cfg, data)
        return validate(cfg)


COMMON_SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "schedule": ScheduleConfig,
    "train": TrainConfig,
    "scaling": ScalingConfig,
    "checkpoint": CheckpointConfig,
    "run": RunConfig,
    "straggler": StragglerConfig,
    "faults": FaultsConfig,
}
"""The sections every job reads, in the order the reference lists them."""


def _sections() -> dict[str, type]:
    """Every section: the shared ones, then each registry entry's own (strategies first, then other jobs)."""
    own = {spec.section: spec.load("config") for spec in registry.all_specs() if spec.section}
    return {**COMMON_SECTIONS, **own}


def _section_field(cls: type) -> Any:
    return field(default_factory=cls)


Config = make_dataclass(
    "Config",
    [(name, cls, _section_field(cls)) for name, cls in _sections().items()],
    bases=(RunSchema,),
    namespace={"__doc__": "A whole run: the shared sections and every registered job's own."},
)
Config.__module__ = __name__


def strategy_sections() -> list[str]:
    """The sections registry entries own (each strategy's, compare's)."""
    return [spec.section for spec in registry.all_specs() if spec.section]


def load_config(
    defaults: str | Path | None = None,
    files: Iterable[str | Path] = (),
    overrides: Iterable[str] = (),
    job: str | None = None,
) -> Config:
    """Build a run config: dataclass defaults, then the job's default YAML, each --config file, each --set; validate.

    An empty run.name becomes '<job>-<data.name>' when `job` is given, after every override, so that
    `--set data.name=synthetic` names the run sync-synthetic (with data.factory: '<job>-<its top package>')."""
    cfg = merge(Config(), ([defaults] if defaults else []) + list(files), overrides)
    return named(cfg, job)


def named(cfg: Config, job: str | None) -> Config:
    """`cfg` validated, its empty run.name made '<job>-<the data's name>'."""
    if job and not cfg.run.name:
        data = cfg.data.factory.partition(":")[0].partition(".")[0] if cfg.data.factory else cfg.data.name
        cfg.run.name = f"{job}-{data}"
    return validate(cfg)


def job_defaults(job: str) -> Path | None:
    """The YAML holding the keys where `job`'s defaults differ from the dataclass defaults; None if they do not."""
    return registry.get(job).defaults
