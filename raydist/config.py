"""The one typed config system: dataclasses whose fields carry their help and bounds, loaded from YAML and --set.

The run config (`Config`, below) and the SLURM cluster config (`raydist.slurm.settings.ClusterConfig`) are both
declared with `opt(...)`, read by `_apply`, checked by `validate` and documented by `reference_markdown`: a bound
or a help text is written once, and the loader, the error messages and docs/configuration.md all follow it.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import operator
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Literal, get_args, get_origin, get_type_hints

import yaml

from raydist import registry
from raydist.errors import ConfigError

CONFIG_DIR = registry.CONFIG_DIR
_BOUNDS = ("ge", "gt", "le", "lt")
_COMPARE = {"ge": operator.ge, "gt": operator.gt, "le": operator.le, "lt": operator.lt}
_SYMBOL = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def opt(
    default: Any,
    help: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    special: dict[Any, str] | None = None,
    parse: Callable[[Any, str], Any] | None = None,
    shown: str = "",
) -> Any:
    """A config field: its default, its one-line help, and what values it takes.

    ge/gt/le/lt: bounds `validate` enforces on numbers; special: values allowed outside them, with their meaning
    ({-1: "unbounded"}); parse: (value, key) -> value, for fields a plain type cannot describe (sizes, host maps),
    run on every value read from YAML or --set; shown: the type as the reference names it, for parsed fields.
    """
    bounds = {name: value for name, value in zip(_BOUNDS, (ge, gt, le, lt)) if value is not None}
    metadata = {"help": help, "bounds": bounds, "special": special or {}, "parse": parse, "shown": shown}
    if isinstance(default, (dict, list)):  # mutable: each instance gets its own copy
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def internal(default: Any) -> Any:
    """A field the program sets, not the user: refused as a key, left out of the reference."""
    return field(default=default, metadata={"internal": True})


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


# ---- per-field parsers: rules a bound cannot say --------------------------------------------------------


def _run_name(value: str, key: str) -> str:
    # The name is a directory under storage_path: a '/', '.' or '..' would put the run somewhere else.
    _check("/" not in value, key, f"must not contain '/' (got {value!r})")
    _check(value not in (".", ".."), key, f"must name a directory under run.storage_path (got {value!r})")
    _no_control_characters(value, key)
    return value


def _no_control_characters(value: str, key: str) -> None:
    # A NUL cannot be in a path at all; other control characters make paths no one can type.
    _check(value.isprintable(), key, f"must not contain control characters (got {value!r})")


def _shared_path(value: str, key: str) -> str:
    _check(bool(value.strip()), key, "must not be empty")
    _no_control_characters(value, key)
    # Workers on other nodes open it as a path; a URL would need a filesystem layer raydist does not set up.
    _check("://" not in value, key, f"must be a local or shared filesystem path (got {value!r})")
    return value


def _strategy_names(value: str, key: str) -> str:
    names = [s.strip() for s in value.split(",") if s.strip()]
    known = registry.names()
    _check(bool(names), key, "must name at least one strategy")
    for name in names:
        _check(name in known, key, f"unknown strategy {name!r} (choose from {', '.join(known)})")
    _check(len(set(names)) == len(names), key, f"names a strategy twice ({value!r})")
    return value


def _worker_count(value: Any, key: str) -> int | str:
    """N (a fixed count) or 'MIN-MAX' (elastic): kept as written, read through ScalingConfig's properties."""
    if isinstance(value, int) and not isinstance(value, bool):
        _check(value >= 1, key, f"must be >= 1 (got {value})")
        return value
    text = str(value).strip()
    low, sep, high = text.partition("-")
    if not sep and low.isdigit():
        return _worker_count(int(low), key)
    _check(bool(sep) and low.strip().isdigit() and high.strip().isdigit(), key,
           f"must be a worker count N or a range MIN-MAX such as 2-4 (got {value!r})")
    lo, hi = int(low), int(high)
    _check(1 <= lo < hi, key, f"range must have 1 <= MIN < MAX (got {value!r})")
    return f"{lo}-{hi}"


# ---- the run config ------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    """Which network to train; input and output sizes come from the data set."""

    name: Literal["simple", "mlp", "cnn", "transformer"] = opt(
        "mlp", "simple: the seeds' SimpleModel (in -> 50 -> out); mlp: `depth` hidden layers; cnn: small CNN (image "
        "data only); transformer: `depth` pre-norm encoder layers over the input cut into `tokens` pieces"
    )
    hidden: int = opt(128, "width of the MLP's hidden layers, or the transformer's model width", ge=1)
    params: int = opt(
        0, "mlp, transformer: size the model by parameter count instead (e.g. 10000000 on data.name=synthetic): the "
        "width that comes closest at this depth replaces `hidden`; 0 = use `hidden`", ge=0, special={0: "use hidden"})
    depth: int = opt(2, "number of hidden layers of the MLP, or of the transformer's encoder layers", ge=1)
    dropout: float = opt(0.0, "dropout probability after each hidden layer (mlp, cnn, transformer)", ge=0, lt=1)
    tokens: int = opt(8, "transformer: the input features are cut into this many equal tokens (digits: 8 rows)", ge=1)
    heads: int = opt(4, "transformer: attention heads; the width must be a multiple", ge=1)


@dataclass
class DataConfig:
    """The data set: real offline digits, or synthetic samples for throughput work."""

    name: Literal["digits", "synthetic"] = opt(
        "digits", "digits: scikit-learn's 8x8 handwritten digits (1797 images, 10 classes, ships in the wheel); synthetic: random features labelled by a fixed random teacher"
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

    name: Literal["constant", "cosine", "linear"] = opt("cosine", "shape after warm-up: constant, cosine decay or linear decay")
    warmup_steps: int = opt(10, "linear warm-up steps from 0 to optim.lr", ge=0)
    min_lr_ratio: float = opt(0.0, "final learning rate as a fraction of optim.lr (cosine, linear)", ge=0, le=1)


@dataclass
class TrainConfig:
    """The training loop: batch, length, precision, clipping, accumulation, logging."""

    batch_size: int = opt(32, "samples per worker per micro-step", ge=1)
    epochs: int = opt(20, "passes over the training split (ignored when max_steps > 0)", ge=1)
    max_steps: int = opt(0, "optimizer steps in total; 0 lets `epochs` decide", ge=0)
    grad_accum: int = opt(1, "micro-steps per optimizer step; the all-reduce runs on the last one only", ge=1)
    grad_clip: float = opt(0.0, "clip the global gradient norm to this value; 0 = off (the norm is still reported)", ge=0)
    mixed_precision: Literal["auto", "bf16", "off"] = opt(
        "auto", "auto: bf16 autocast on GPU, fp32 on CPU; bf16: autocast always; off: fp32"
    )
    seed: int = opt(0, "seed of model init, data order and dropout")
    report_every_s: float = opt(
        1.0, "report step metrics to Ray Train (and, with run.verbose, print them on rank 0) about this often, in seconds; every step goes to metrics.jsonl", ge=0
    )
    stop_at_step: int = opt(
        0, "end the run after this step and its checkpoint, as a preemption would; 0 = off (for resume tests)", ge=0
    )


class WorkerRange:
    """For a config whose `COUNT_FIELD` holds a worker count N or an elastic range 'MIN-MAX' (`_worker_count`)."""

    COUNT_FIELD: ClassVar[str] = "num_workers"

    @property
    def elastic(self) -> bool:
        return isinstance(getattr(self, self.COUNT_FIELD), str)

    @property
    def max_workers(self) -> int:
        """The worker count the run is sized for (the fixed count, or the top of the range)."""
        return int(str(getattr(self, self.COUNT_FIELD)).rpartition("-")[2])

    @property
    def min_workers(self) -> int:
        return int(str(getattr(self, self.COUNT_FIELD)).partition("-")[0])


@dataclass
class ScalingConfig(WorkerRange):
    """How many workers, on what hardware, talking over which collective backend."""

    num_workers: int | str = opt(
        2, "training workers (one process each): N, or MIN-MAX for an elastic run that continues on as few as MIN "
        "workers when nodes are lost and grows back to MAX when they return (sync, local_sgd)",
        parse=_worker_count, shown="N or MIN-MAX")
    use_gpu: bool = opt(False, "one GPU per worker")
    backend: Literal["auto", "nccl", "gloo"] = opt("auto", "torch.distributed backend; auto: nccl with GPUs, gloo without")
    cpus_per_worker: float = opt(1.0, "Ray CPUs reserved per worker", gt=0)
    max_failures: int = opt(
        3, "worker-group restarts from the latest checkpoint before the run fails; -1 = unlimited", ge=0, special={-1: "unlimited"}
    )
    max_preemptions: int = opt(
        -1, "restarts after a node was preempted (drained, then gone) before the run fails; -1 = unlimited",
        ge=0, special={-1: "unlimited"})
    node_loss_timeout_s: float = opt(
        120.0, "fixed num_workers: after a worker group fails, the run fails if its N workers cannot be placed again "
        "within this many seconds (a lost node), naming the dead node(s)", gt=0)
    resize_check_s: float = opt(
        30.0, "elastic num_workers: how often a running elastic run checks whether more workers fit again", gt=0)

    def check(self, prefix: str) -> None:
        _check(not (self.backend == "nccl" and not self.use_gpu), f"{prefix}backend",
               "nccl needs GPUs: set scaling.use_gpu=true or backend=gloo")

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
        "", "run name; '' = <job>-<data.name>, e.g. sync-digits; re-running with the same name and storage_path resumes from its latest checkpoint",
        parse=_run_name,
    )
    storage_path: str = opt(
        "~/raydist_runs", "directory for checkpoints and metrics, on a filesystem every node shares (absolute or ~)",
        parse=_shared_path,
    )
    address: str = opt(
        "", "Ray cluster to use: '' = RAY_ADDRESS if set (as under `ray job submit`), else start a local Ray instance"
    )
    verbose: bool = opt(
        False, "console detail: true adds Ray Train's per-report and per-checkpoint INFO lines and every report's "
        "metrics from rank 0 (`--verbose` on a job's command line); false shows one progress bar per run. Ray's log "
        "files keep everything either way",
    )
    tensorboard: bool = opt(
        True, "write TensorBoard event files to tensorboard/ in the run directory from the same records as "
        "metrics.jsonl (per-step and per-evaluation scalars, the config as text; docs/running.md#tensorboard); "
        "false: metrics.jsonl only",
    )

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
        1.0, "that worker runs this many times slower: after each step it sleeps (slowdown - 1) x its own step time", ge=1
    )
    pause_at_step: int = opt(0, "that worker pauses once, after its own step N; 0 = never", ge=0)
    pause_s: float = opt(0.0, "length of that pause in seconds", ge=0)


@dataclass
class FaultsConfig:
    """What bounds a hang, and how replicas that should agree are checked (faults inside a run)."""

    hang_timeout_s: float = opt(
        60.0, "a worker process that answers no health check for this long (stopped, frozen), or an async PS worker "
        "or server that makes no step or answers nothing that long, fails the run or restarts it within "
        "scaling.max_failures; the failure names it and its node", gt=0)
    collective_timeout_s: float = opt(
        300.0, "process-group start-up and every gloo/NCCL collective give up after this many seconds (a peer that "
        "is alive but never joins)", gt=0)
    desync_every_steps: int = opt(
        100, "every N steps all ranks compare fingerprints (parameter checksum, gradient norms); 0 = never", ge=0)
    desync_tolerance: float = opt(
        1e-6, "relative difference of two ranks' parameter checksums that counts as a desync (replicas that should "
        "be identical)", ge=0)
    grad_norm_tolerance: float = opt(
        0.0, "also warn when a rank's local gradient norm (before the all-reduce) differs from the median by more "
        "than this fraction; 0 = only non-finite norms (small batches differ by more than 10% routinely)", ge=0)
    on_desync: Literal["warn", "stop", "restart"] = opt(
        "stop", "on a desync: warn = one line and go on; stop = fail the run (exit 1) keeping the last good "
        "checkpoint; restart = restart the workers from the last checkpoint (counts against scaling.max_failures)")
    inject_desync_rank: int = opt(
        -1, "testing: this rank perturbs one parameter after step inject_desync_step; -1 = never", ge=0,
        special={-1: "never"})
    inject_desync_step: int = opt(1, "testing: the step after which inject_desync_rank perturbs its parameters", ge=1)


@dataclass
class LocalSGDConfig:
    """jobs/local_sgd.py: workers step on their own and average parameters every `sync_every` steps."""

    sync_every: int = opt(8, "local steps between two averagings (H)", ge=1)
    averaging: Literal["allreduce", "ring"] = opt(
        "allreduce", "allreduce: every worker takes the mean of all; ring: each mixes in its left neighbour's parameters (Polyak, `alpha`)"
    )
    alpha: float = opt(0.5, "ring: weight of the neighbour's parameters, p <- (1 - alpha) p + alpha p_left", gt=0, le=1)
    warmup_sync_steps: int = opt(
        0, "fully synchronous steps (gradients all-reduced every step) before local SGD starts (post-local SGD)", ge=0
    )


@dataclass
class AsyncPSConfig:
    """jobs/async.py: Downpour SGD against parameter-server actors."""

    num_servers: int = opt(
        1, "parameter-server actors; the flat parameter vector is split into this many contiguous slices", ge=1
    )
    n_fetch: int = opt(
        1, "a worker fetches fresh parameters every this many of its steps (in between it applies its own gradients locally)", ge=1
    )
    max_staleness: int = opt(
        -1, "bound on an update's staleness (server versions); -1 = unbounded", ge=0, special={-1: "unbounded"}
    )
    on_stale: Literal["wait", "drop"] = opt(
        "wait", "with a bound: wait = a worker waits before a step that could exceed it; drop = the server discards gradients past it"
    )
    staleness_lr: bool = opt(False, "divide the learning rate of each update by max(1, its staleness)")
    cpus_per_server: float = opt(
        0.0, "Ray CPUs reserved per server actor; 0 = none (a server mostly waits for messages)", ge=0
    )
    server_placement: Literal["spread", "default"] = opt(
        "spread", "spread = one server shard per node as far as the nodes go, nodes without workers first, so that "
        "the workers' pushes fan in over several links, not one (docs/benchmarks.md); with cpus_per_server > 0, Ray's "
        "SPREAD over nodes with free CPUs; default = Ray's own choice, which may pack actors that reserve no CPU onto "
        "one node"
    )


@dataclass
class FSDPConfig:
    """jobs/fsdp.py: fully sharded data parallel (FSDP2); each worker holds 1/W of the parameters and optimizer state."""

    reshard_after_forward: bool = opt(
        True, "free each layer's gathered parameters after its forward and gather them again in backward (least "
        "memory, 1.5x sync's communication); false keeps them until backward (sync's communication, more memory)")


@dataclass
class CompareConfig:
    """jobs/compare.py: run several strategies on one setting and report them side by side."""

    strategies: str = opt(
        ",".join(registry.compared()),
        f"comma-separated strategies to run, in this order; any of: {', '.join(registry.names())}",
        parse=_strategy_names,
    )
    target_accuracy: float = opt(
        0.95, "test accuracy whose first reaching is timed (the table's time-to-target)", gt=0, le=1
    )
    output_dir: str = opt("", "where results.json, results.md and plot.png go; '' = <run.storage_path>/<run.name>")
    plot_width: int = opt(1200, "width of plot.png in pixels", ge=200)
    plot_height: int = opt(500, "height of plot.png in pixels", ge=150)

    @property
    def strategy_list(self) -> list[str]:
        return [s.strip() for s in self.strategies.split(",") if s.strip()]


@dataclass
class Config:
    """A whole run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    run: RunConfig = field(default_factory=RunConfig)
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    local_sgd: LocalSGDConfig = field(default_factory=LocalSGDConfig)
    async_ps: AsyncPSConfig = field(default_factory=AsyncPSConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)

    def check(self, prefix: str) -> None:
        _check(not (self.model.name == "cnn" and self.data.name != "digits"), "model.name",
               "cnn needs image data: set data.name=digits")
        _check(not (self.model.params and self.model.name not in ("mlp", "transformer")), "model.params",
               f"sizes the mlp and the transformer only (model.name={self.model.name})")
        if self.model.name == "transformer":
            features = 64 if self.data.name == "digits" else self.data.synthetic_features
            _check(features % self.model.tokens == 0, "model.tokens",
                   f"must divide the {features} input features into equal tokens (got {self.model.tokens})")
            _check(self.model.params or self.model.hidden % self.model.heads == 0, "model.hidden",
                   f"must be a multiple of model.heads={self.model.heads} (got {self.model.hidden})")
        _check(self.straggler.worker < self.scaling.max_workers, "straggler.worker",
               f"must be below scaling.num_workers={self.scaling.max_workers} (got {self.straggler.worker})")
        _check(self.faults.inject_desync_rank < self.scaling.max_workers, "faults.inject_desync_rank",
               f"must be below scaling.num_workers={self.scaling.max_workers} (got {self.faults.inject_desync_rank})")

    def validate(self) -> "Config":
        return validate(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Config":
        cfg = cls()
        _apply(cfg, data)
        return validate(cfg)


# ---- validation ----------------------------------------------------------------------------------------


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _within(value: float, bounds: dict[str, float]) -> bool:
    return all(_COMPARE[name](value, limit) for name, limit in bounds.items())


def _range_text(bounds: dict[str, float]) -> str:
    """'>= 1', '> 0', 'in [0, 1)': how messages and the reference state a field's bounds."""
    low = {name: v for name, v in bounds.items() if name in ("ge", "gt")}
    high = {name: v for name, v in bounds.items() if name in ("le", "lt")}
    if low and high:
        (lo_name, lo), (hi_name, hi) = *low.items(), *high.items()
        return f"in {'[' if lo_name == 'ge' else '('}{_num(lo)}, {_num(hi)}{']' if hi_name == 'le' else ')'}"
    return " and ".join(f"{_SYMBOL[name]} {_num(v)}" for name, v in bounds.items())


def _check_bounds(value: Any, meta: Any, key: str) -> None:
    bounds, special = meta.get("bounds"), meta.get("special", {})
    if not bounds or value is None or value in special:
        return
    if not _within(value, bounds):
        notes = "".join(f", or {_num(v)} for {why}" for v, why in special.items())
        raise ConfigError(f"{key}: must be {_range_text(bounds)}{notes} (got {value})")


def validate(obj: Any, prefix: str = "") -> Any:
    """Check every field's declared bounds, depth first, then each dataclass's own `check(prefix)` hook.

    Hooks are for rules across fields (nccl needs GPUs); a rule on one field belongs in its `opt(...)`."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            validate(value, f"{prefix}{f.name}.")
        else:
            _check_bounds(value, f.metadata, f"{prefix}{f.name}")
    if hasattr(obj, "check"):
        obj.check(prefix)
    return obj


# ---- loading ---------------------------------------------------------------------------------


def _coerce(value: Any, typ: Any, key: str) -> Any:
    """Check `value` against a field's type; numbers written as strings (YAML reads '1e-3' as a string) convert."""
    if get_origin(typ) is Literal:
        choices = get_args(typ)
        _check(value in choices, key, f"must be one of {', '.join(map(str, choices))} (got {value!r})")
        return value
    if typ is bool:
        _check(isinstance(value, bool), key, f"must be true or false (got {value!r})")
        return value
    if typ is int:
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                pass
        _check(isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer (got {value!r})")
        return value
    if typ is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        _check(isinstance(value, (int, float)) and not isinstance(value, bool), key, f"must be a number (got {value!r})")
        return float(value)
    if typ is str:
        _check(isinstance(value, str), key, f"must be a string (got {value!r})")
        return value
    raise TypeError(f"unsupported config type {typ} for {key}: give the field a parse=")  # a bug, not user input


def _plain(typ: Any) -> bool:
    return typ in (bool, int, float, str) or get_origin(typ) is Literal


def _settable(obj: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(obj) if not f.metadata.get("internal")]


def _unknown(key: str, known: list[str]) -> ConfigError:
    section, _, leaf = key.rpartition(".")
    close = difflib.get_close_matches(leaf, known, n=1)
    if close:
        return ConfigError(f"unknown key '{key}' (did you mean '{section + '.' if section else ''}{close[0]}'?)")
    return ConfigError(f"unknown key '{key}'; known: {', '.join(known)}")


def _apply(obj: Any, data: dict[str, Any], prefix: str = "") -> None:
    """Merge a nested mapping into dataclass `obj`, checking each key and type (bounds wait for `validate`)."""
    hints = get_type_hints(type(obj))
    known = _settable(obj)
    fields = {f.name: f for f in dataclasses.fields(obj)}
    for name, value in data.items():
        key = f"{prefix}{name}"
        if name not in known:
            raise _unknown(key, known)
        current = getattr(obj, name)
        if dataclasses.is_dataclass(current):
            _check(isinstance(value, dict), key, f"must be a mapping of {', '.join(_settable(current))}")
            _apply(current, value, key + ".")
            continue
        typ, parse = hints[name], fields[name].metadata.get("parse")
        if _plain(typ) or not parse:  # a parser of a plain-typed field gets the typed value
            value = _coerce(value, typ, key)
        setattr(obj, name, parse(value, key) if parse else value)


def read_yaml(path: Path, what: str = "sections (model, data, ...)", kind: str = "config") -> dict[str, Any]:
    """A YAML file that must hold a mapping; every way it can fail is one ConfigError naming the file."""
    if not path.is_file():
        raise ConfigError(f"{kind} file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise ConfigError(f"cannot parse {path}{at}: {problem}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping of {what}, got {type(data).__name__}")
    return data


def parse_override(text: str) -> dict[str, Any]:
    """'train.lr=0.1' -> {'train': {'lr': 0.1}}; the value is read as YAML so 'true', '3' and '[1]' get their types."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set needs key.path=value (got {text!r})")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    nested: dict[str, Any] = {}
    node = nested
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return nested


def merge(cfg: Any, files: Iterable[str | Path] = (), overrides: Iterable[str] = (), *,
          what: str = "sections (model, data, ...)", kind: str = "config") -> Any:
    """Apply each YAML file, then each --set, to dataclass `cfg` in order (later wins); not yet validated.

    A file's errors start with its path: with several files and overrides, the key alone would not say where."""
    for path in map(Path, files):
        data = read_yaml(path, what, kind)
        try:
            _apply(cfg, data)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
    for text in overrides:
        _apply(cfg, parse_override(text))
    return cfg


def load_config(
    defaults: str | Path | None = None,
    files: Iterable[str | Path] = (),
    overrides: Iterable[str] = (),
    job: str | None = None,
) -> Config:
    """Build a run config: dataclass defaults, then the job's default YAML, each --config file, each --set; validate.

    An empty run.name becomes '<job>-<data.name>' when `job` is given, after every override, so that
    `--set data.name=synthetic` names the run sync-synthetic."""
    cfg = merge(Config(), ([defaults] if defaults else []) + list(files), overrides)
    if job and not cfg.run.name:
        cfg.run.name = f"{job}-{cfg.data.name}"
    return validate(cfg)


def job_defaults(job: str) -> Path | None:
    """The YAML holding the keys where `job`'s defaults differ from the dataclass defaults; None if they do not."""
    if job in registry.names():
        return registry.get(job).defaults
    path = CONFIG_DIR / f"{job}.yaml"  # a job that is not a strategy (registry.OTHER_JOBS)
    return path if path.is_file() else None


# ---- reference ---------------------------------------------------------------------------------


def _type_text(typ: Any, meta: Any) -> str:
    name = meta.get("shown") or (" | ".join(map(str, get_args(typ))) if get_origin(typ) is Literal else typ.__name__)
    limits = _range_text(meta.get("bounds") or {})
    extra = "".join(f" or {_num(v)}" for v in meta.get("special", {}))
    return f"{name} {limits}{extra}" if limits else name


def _default_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if value == "":
        return "''"
    return str(value)


def _cell(text: str) -> str:
    """Text safe in a markdown table cell: '|' escaped; '<' too, outside `code` (where markdown would show '&lt;')."""
    parts = text.split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts)).replace("|", "\\|")


def _rows(obj: Any, prefix: str = "") -> Iterable[str]:
    hints = get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.metadata.get("internal"):
            continue
        if dataclasses.is_dataclass(value):
            yield from _rows(value, f"{prefix}{f.name}.")
            continue
        yield (f"| `{prefix}{f.name}` | {_cell(_type_text(hints[f.name], f.metadata))} | `{_default_text(value)}` "
               f"| {_cell(f.metadata.get('help', ''))} |")


def reference_markdown(cls: type = Config) -> str:
    """The reference of config class `cls` as a markdown table, generated from its fields (docs/configuration.md)."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|", *_rows(cls())]
    return "\n".join(rows) + "\n"
