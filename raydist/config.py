"""The one typed run configuration: dataclasses with help text, loaded from YAML, overridden by --set, validated."""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml

from raydist.errors import ConfigError

CONFIG_DIR = Path(__file__).parent / "configs"


def opt(default: Any, help: str) -> Any:
    """A config field: its default and the one-line help shown in the config reference."""
    return field(default=default, metadata={"help": help})


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


@dataclass
class ModelConfig:
    """Which network to train; input and output sizes come from the data set."""

    name: Literal["simple", "mlp", "cnn"] = opt(
        "mlp", "simple: the seeds' SimpleModel (in -> 50 -> out); mlp: `depth` hidden layers; cnn: small CNN (image data only)"
    )
    hidden: int = opt(128, "width of the MLP's hidden layers")
    depth: int = opt(2, "number of hidden layers of the MLP")
    dropout: float = opt(0.0, "dropout probability after each hidden layer (mlp, cnn)")

    def validate(self, key: str) -> None:
        _check(self.hidden >= 1, f"{key}.hidden", f"must be >= 1 (got {self.hidden})")
        _check(self.depth >= 1, f"{key}.depth", f"must be >= 1 (got {self.depth})")
        _check(0.0 <= self.dropout < 1.0, f"{key}.dropout", f"must be in [0, 1) (got {self.dropout})")


@dataclass
class DataConfig:
    """The data set: real offline digits, or synthetic samples for throughput work."""

    name: Literal["digits", "synthetic"] = opt(
        "digits", "digits: scikit-learn's 8x8 handwritten digits (1797 images, 10 classes, ships in the wheel); synthetic: random features labelled by a fixed random teacher"
    )
    test_fraction: float = opt(0.2, "share of the data held out as the test split (stratified, fixed by `split_seed`)")
    split_seed: int = opt(0, "seed of the train/test split (kept apart from train.seed so runs compare on one split)")
    synthetic_samples: int = opt(20000, "synthetic: number of samples")
    synthetic_features: int = opt(10, "synthetic: input features")
    synthetic_classes: int = opt(2, "synthetic: number of classes")

    def validate(self, key: str) -> None:
        _check(0.0 < self.test_fraction < 1.0, f"{key}.test_fraction", f"must be in (0, 1) (got {self.test_fraction})")
        _check(self.synthetic_samples >= 10, f"{key}.synthetic_samples", f"must be >= 10 (got {self.synthetic_samples})")
        _check(self.synthetic_features >= 1, f"{key}.synthetic_features", f"must be >= 1 (got {self.synthetic_features})")
        _check(self.synthetic_classes >= 2, f"{key}.synthetic_classes", f"must be >= 2 (got {self.synthetic_classes})")


@dataclass
class OptimConfig:
    """The optimizer each worker steps (sync DDP, local SGD) or the parameter server applies (async)."""

    name: Literal["sgd", "adam", "adamw", "adagrad"] = opt("adamw", "optimizer")
    lr: float = opt(0.003, "peak learning rate")
    momentum: float = opt(0.9, "momentum (sgd only)")
    weight_decay: float = opt(0.0, "weight decay")

    def validate(self, key: str) -> None:
        _check(self.lr > 0, f"{key}.lr", f"must be > 0 (got {self.lr})")
        _check(0.0 <= self.momentum < 1.0, f"{key}.momentum", f"must be in [0, 1) (got {self.momentum})")
        _check(self.weight_decay >= 0, f"{key}.weight_decay", f"must be >= 0 (got {self.weight_decay})")


@dataclass
class ScheduleConfig:
    """Learning-rate schedule over the run's optimizer steps."""

    name: Literal["constant", "cosine", "linear"] = opt("cosine", "shape after warm-up: constant, cosine decay or linear decay")
    warmup_steps: int = opt(0, "linear warm-up steps from 0 to optim.lr")
    min_lr_ratio: float = opt(0.0, "final learning rate as a fraction of optim.lr (cosine, linear)")

    def validate(self, key: str) -> None:
        _check(self.warmup_steps >= 0, f"{key}.warmup_steps", f"must be >= 0 (got {self.warmup_steps})")
        _check(0.0 <= self.min_lr_ratio <= 1.0, f"{key}.min_lr_ratio", f"must be in [0, 1] (got {self.min_lr_ratio})")


@dataclass
class TrainConfig:
    """The training loop: batch, length, precision, clipping, accumulation, logging."""

    batch_size: int = opt(32, "samples per worker per micro-step")
    epochs: int = opt(10, "passes over the training split (ignored when max_steps > 0)")
    max_steps: int = opt(0, "optimizer steps in total; 0 lets `epochs` decide")
    grad_accum: int = opt(1, "micro-steps per optimizer step; the all-reduce runs on the last one only")
    grad_clip: float = opt(0.0, "clip the global gradient norm to this value; 0 = off (the norm is still reported)")
    mixed_precision: Literal["auto", "bf16", "off"] = opt(
        "auto", "auto: bf16 autocast on GPU, fp32 on CPU; bf16: autocast always; off: fp32"
    )
    seed: int = opt(0, "seed of model init, data order and dropout")
    report_every_s: float = opt(
        1.0, "report step metrics to Ray Train (and print them on rank 0) about this often, in seconds; every step goes to metrics.jsonl"
    )
    stop_at_step: int = opt(0, "end the run after this step and its checkpoint, as a preemption would; 0 = off (for resume tests)")

    def validate(self, key: str) -> None:
        _check(self.batch_size >= 1, f"{key}.batch_size", f"must be >= 1 (got {self.batch_size})")
        _check(self.epochs >= 1, f"{key}.epochs", f"must be >= 1 (got {self.epochs})")
        _check(self.max_steps >= 0, f"{key}.max_steps", f"must be >= 0 (got {self.max_steps})")
        _check(self.grad_accum >= 1, f"{key}.grad_accum", f"must be >= 1 (got {self.grad_accum})")
        _check(self.grad_clip >= 0, f"{key}.grad_clip", f"must be >= 0 (got {self.grad_clip})")
        _check(self.report_every_s >= 0, f"{key}.report_every_s", f"must be >= 0 (got {self.report_every_s})")
        _check(self.stop_at_step >= 0, f"{key}.stop_at_step", f"must be >= 0 (got {self.stop_at_step})")


@dataclass
class ScalingConfig:
    """How many workers, on what hardware, talking over which collective backend."""

    num_workers: int = opt(2, "training workers (one process each)")
    use_gpu: bool = opt(False, "one GPU per worker")
    backend: Literal["auto", "nccl", "gloo"] = opt("auto", "torch.distributed backend; auto: nccl with GPUs, gloo without")
    cpus_per_worker: float = opt(1.0, "Ray CPUs reserved per worker")
    max_failures: int = opt(3, "worker-group restarts from the latest checkpoint before the run fails; -1 = unlimited")

    def validate(self, key: str) -> None:
        _check(self.num_workers >= 1, f"{key}.num_workers", f"must be >= 1 (got {self.num_workers})")
        _check(self.cpus_per_worker > 0, f"{key}.cpus_per_worker", f"must be > 0 (got {self.cpus_per_worker})")
        _check(self.max_failures >= -1, f"{key}.max_failures", f"must be >= -1 (got {self.max_failures})")
        _check(
            not (self.backend == "nccl" and not self.use_gpu),
            f"{key}.backend",
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

    every_steps: int = opt(0, "checkpoint every N optimizer steps; 0 = at the end of each epoch")
    keep: int = opt(2, "checkpoints kept in storage (the newest)")
    async_upload: bool = opt(False, "upload checkpoints in the background while training goes on")

    def validate(self, key: str) -> None:
        _check(self.every_steps >= 0, f"{key}.every_steps", f"must be >= 0 (got {self.every_steps})")
        _check(self.keep >= 1, f"{key}.keep", f"must be >= 1 (got {self.keep})")


@dataclass
class RunConfig:
    """Where a run lives: its name, its storage, the Ray cluster it uses."""

    name: str = opt("sync-digits", "run name; re-running with the same name and storage_path resumes from its latest checkpoint")
    storage_path: str = opt(
        "~/raydist_runs", "directory for checkpoints and metrics, on a filesystem every node shares (absolute or ~)"
    )
    address: str = opt(
        "", "Ray cluster to use: '' = RAY_ADDRESS if set (as under `ray job submit`), else start a local Ray instance"
    )

    def validate(self, key: str) -> None:
        _check(bool(self.name.strip()), f"{key}.name", "must not be empty")
        _check("/" not in self.name, f"{key}.name", f"must not contain '/' (got {self.name!r})")
        _check(bool(self.storage_path.strip()), f"{key}.storage_path", "must not be empty")
        _check(
            "://" not in self.storage_path,
            f"{key}.storage_path",
            f"must be a local or shared filesystem path (got {self.storage_path!r})",
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

    worker: int = opt(-1, "rank of the worker to slow down; -1 = none")
    slowdown: float = opt(
        1.0, "that worker runs this many times slower: after each step it sleeps (slowdown - 1) x its own step time"
    )
    pause_at_step: int = opt(0, "that worker pauses once, after its own step N; 0 = never")
    pause_s: float = opt(0.0, "length of that pause in seconds")

    def validate(self, key: str) -> None:
        _check(self.worker >= -1, f"{key}.worker", f"must be a worker rank or -1 (got {self.worker})")
        _check(self.slowdown >= 1.0, f"{key}.slowdown", f"must be >= 1 (got {self.slowdown})")
        _check(self.pause_at_step >= 0, f"{key}.pause_at_step", f"must be >= 0 (got {self.pause_at_step})")
        _check(self.pause_s >= 0, f"{key}.pause_s", f"must be >= 0 (got {self.pause_s})")


@dataclass
class LocalSGDConfig:
    """jobs/local_sgd.py: workers step on their own and average parameters every `sync_every` steps."""

    sync_every: int = opt(8, "local steps between two averagings (H)")
    averaging: Literal["allreduce", "ring"] = opt(
        "allreduce", "allreduce: every worker takes the mean of all; ring: each mixes in its left neighbour's parameters (Polyak, `alpha`)"
    )
    alpha: float = opt(0.5, "ring: weight of the neighbour's parameters, p <- (1 - alpha) p + alpha p_left")
    warmup_sync_steps: int = opt(0, "fully synchronous steps (gradients all-reduced every step) before local SGD starts (post-local SGD)")

    def validate(self, key: str) -> None:
        _check(self.sync_every >= 1, f"{key}.sync_every", f"must be >= 1 (got {self.sync_every})")
        _check(0.0 < self.alpha <= 1.0, f"{key}.alpha", f"must be in (0, 1] (got {self.alpha})")
        _check(self.warmup_sync_steps >= 0, f"{key}.warmup_sync_steps", f"must be >= 0 (got {self.warmup_sync_steps})")


@dataclass
class AsyncPSConfig:
    """jobs/async.py: Downpour SGD against parameter-server actors."""

    num_servers: int = opt(1, "parameter-server actors; the flat parameter vector is split into this many contiguous slices")
    n_fetch: int = opt(1, "a worker fetches fresh parameters every this many of its steps (in between it applies its own gradients locally)")
    max_staleness: int = opt(-1, "bound on an update's staleness (server versions); -1 = unbounded")
    on_stale: Literal["wait", "drop"] = opt(
        "wait", "with a bound: wait = a worker waits before a step that could exceed it; drop = the server discards gradients past it"
    )
    staleness_lr: bool = opt(False, "divide the learning rate of each update by max(1, its staleness)")
    cpus_per_server: float = opt(0.0, "Ray CPUs reserved per server actor; 0 = none (a server mostly waits for messages)")

    def validate(self, key: str) -> None:
        _check(self.num_servers >= 1, f"{key}.num_servers", f"must be >= 1 (got {self.num_servers})")
        _check(self.n_fetch >= 1, f"{key}.n_fetch", f"must be >= 1 (got {self.n_fetch})")
        _check(self.max_staleness >= -1, f"{key}.max_staleness", f"must be >= 0, or -1 for unbounded (got {self.max_staleness})")
        _check(self.cpus_per_server >= 0, f"{key}.cpus_per_server", f"must be >= 0 (got {self.cpus_per_server})")


COMPARED = ("sync", "local_sgd", "async")


@dataclass
class CompareConfig:
    """jobs/compare.py: run several strategies on one setting and report them side by side."""

    strategies: str = opt("sync,local_sgd,async", "comma-separated strategies to run, in this order: sync, local_sgd, async")
    target_accuracy: float = opt(0.95, "test accuracy whose first reaching is timed (the table's time-to-target)")
    output_dir: str = opt("", "where results.json, results.md and plot.png go; '' = <run.storage_path>/<run.name>")
    plot_width: int = opt(1200, "width of plot.png in pixels")
    plot_height: int = opt(500, "height of plot.png in pixels")

    def validate(self, key: str) -> None:
        names = [s.strip() for s in self.strategies.split(",") if s.strip()]
        _check(bool(names), f"{key}.strategies", "must name at least one strategy")
        for name in names:
            _check(name in COMPARED, f"{key}.strategies", f"unknown strategy {name!r} (choose from {', '.join(COMPARED)})")
        _check(len(set(names)) == len(names), f"{key}.strategies", f"names a strategy twice ({self.strategies!r})")
        _check(0.0 < self.target_accuracy <= 1.0, f"{key}.target_accuracy", f"must be in (0, 1] (got {self.target_accuracy})")
        _check(self.plot_width >= 200, f"{key}.plot_width", f"must be >= 200 (got {self.plot_width})")
        _check(self.plot_height >= 150, f"{key}.plot_height", f"must be >= 150 (got {self.plot_height})")

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
    local_sgd: LocalSGDConfig = field(default_factory=LocalSGDConfig)
    async_ps: AsyncPSConfig = field(default_factory=AsyncPSConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)

    def validate(self) -> "Config":
        for f in dataclasses.fields(self):
            getattr(self, f.name).validate(f.name)
        _check(
            not (self.model.name == "cnn" and self.data.name != "digits"),
            "model.name",
            "cnn needs image data: set data.name=digits",
        )
        _check(
            self.straggler.worker < self.scaling.num_workers,
            "straggler.worker",
            f"must be below scaling.num_workers={self.scaling.num_workers} (got {self.straggler.worker})",
        )
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Config":
        cfg = cls()
        _apply(cfg, data)
        return cfg.validate()


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
    raise TypeError(f"unsupported config type {typ} for {key}")  # a bug in this file, not user input


def _unknown(key: str, known: list[str]) -> ConfigError:
    leaf = key.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(leaf, known, n=1)
    hint = f" (did you mean '{key.rsplit('.', 1)[0] + '.' if '.' in key else ''}{close[0]}'?)" if close else ""
    return ConfigError(f"unknown key '{key}'{hint}")


def _apply(obj: Any, data: dict[str, Any], prefix: str = "") -> None:
    """Merge a nested mapping into dataclass `obj`, checking each key and type."""
    hints = get_type_hints(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    for name, value in data.items():
        key = f"{prefix}{name}"
        if name not in names:
            raise _unknown(key, names)
        current = getattr(obj, name)
        if dataclasses.is_dataclass(current):
            _check(isinstance(value, dict), key, f"must be a mapping of {', '.join(f.name for f in dataclasses.fields(current))}")
            _apply(current, value, key + ".")
        else:
            setattr(obj, name, _coerce(value, hints[name], key))


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


def load_config(
    defaults: str | Path | None = None,
    files: list[str | Path] = (),  # type: ignore[assignment]
    overrides: list[str] = (),  # type: ignore[assignment]
    cls: type = Config,
) -> Any:
    """Build a config: dataclass defaults, then the job's default YAML, each --config file, each --set; validate."""
    cfg = cls()
    sources: list[Path] = ([Path(defaults)] if defaults else []) + [Path(f) for f in files]
    for path in sources:
        _apply(cfg, read_yaml(path))
    for text in overrides:
        _apply(cfg, parse_override(text))
    return cfg.validate()


def job_defaults(job: str) -> Path:
    """The YAML of defaults a job ships with (raydist/configs/<job>.yaml)."""
    return CONFIG_DIR / f"{job}.yaml"


# ---- reference ---------------------------------------------------------------------------------


def reference_markdown(cls: type = Config) -> str:
    """The config reference as a markdown table, generated from the dataclasses (README embeds it)."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    root = cls()
    for section in dataclasses.fields(root):
        sub = getattr(root, section.name)
        sub_hints = get_type_hints(type(sub))
        for f in dataclasses.fields(sub):
            typ = sub_hints[f.name]
            tname = " \\| ".join(map(str, get_args(typ))) if get_origin(typ) is Literal else typ.__name__
            default = getattr(sub, f.name)
            shown = "''" if default == "" else str(default).lower() if isinstance(default, bool) else str(default)
            help_text = f.metadata.get("help", "").replace("<", "&lt;").replace("|", "\\|")
            rows.append(f"| `{section.name}.{f.name}` | {tname} | `{shown}` | {help_text} |")
    return "\n".join(rows) + "\n"
