"""A sweep's search space as the config writes it, checked before anything starts, and made Ray Tune's.

    tune:
      space:
        optim.lr: loguniform(1e-4, 1e-1)
        train.batch_size: choice([32, 64])

Each key is a run-config key a trial's job takes (`optim.lr`); each value one of DISTRIBUTIONS. Every value a
distribution can draw is checked against that key's own bounds (the same `validate` as a job's `--set`), so that a
trial never starts on a value its job would refuse. Pure: no Ray here but in `to_tune`.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from raydist.typedconfig import ConfigError, apply, check, validate

DISTRIBUTIONS = {
    "uniform": "uniform(low, high): a float drawn evenly between low and high",
    "loguniform": "loguniform(low, high): a float drawn evenly in log space, 0 < low < high",
    "randint": "randint(low, high): an integer from low to high - 1",
    "choice": "choice([a, b, ...]): one of the values, drawn at random",
    "grid": "grid([a, b, ...]): every value, each in its own trial (times tune.num_samples)",
}
# Sections a trial's job does not take from the space: where the sweep and its trials live, and the sweep itself.
NOT_SWEPT = ("run", "tune", "compare")
_FORM = re.compile(r"^\s*([a-z]+)\s*\((.*)\)\s*$", re.S)


@dataclass(frozen=True)
class Dimension:
    key: str  # 'optim.lr'
    kind: str  # a DISTRIBUTIONS key
    args: tuple[Any, ...]  # (low, high) or (values,)

    def ends(self) -> list[Any]:
        """The values whose acceptance stands for every value it can draw: a range's ends, or every listed value."""
        if self.kind in ("choice", "grid"):
            return list(self.args[0])
        low, high = self.args
        return [low, high - 1] if self.kind == "randint" else [low, high]


def parse(key: str, text: Any, where: str = "tune.space") -> Dimension:
    """One entry of the space: `optim.lr: loguniform(1e-4, 1e-1)`."""
    name = f"{where}.{key}"
    m = _FORM.match(text) if isinstance(text, str) else None
    check(
        m is not None and m.group(1) in DISTRIBUTIONS,
        name,
        f"must be one of {', '.join(k + '(...)' for k in DISTRIBUTIONS)} (got {text!r})",
    )
    kind, inner = m.group(1), m.group(2)
    try:
        args = yaml.safe_load(f"[{inner}]")
    except yaml.YAMLError:
        args = None
    check(isinstance(args, list), name, f"cannot read the arguments of {text!r}")
    args = [_number(a) for a in args]
    if kind in ("choice", "grid"):
        check(len(args) == 1 and isinstance(args[0], list) and args[0], name, f"{DISTRIBUTIONS[kind]} (got {text!r})")
        return Dimension(key, kind, (tuple(args[0]),))
    numbers = len(args) == 2 and all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args)
    check(numbers, name, f"{DISTRIBUTIONS[kind]} (got {text!r})")
    low, high = args
    check(math.isfinite(low) and math.isfinite(high) and low < high, name, f"needs low < high (got {text!r})")
    if kind == "loguniform":
        check(low > 0, name, f"needs 0 < low (got {text!r})")
    if kind == "randint":
        check(isinstance(low, int) and isinstance(high, int), name, f"needs integers (got {text!r})")
    return Dimension(key, kind, (low, high))


def _number(value: Any) -> Any:
    """YAML 1.1 reads 1e-3 (no dot) as a string: a number as Python writes it is one here too."""
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
    if isinstance(value, list):
        return [_number(v) for v in value]
    return value


def check_key(cfg: Any, dim: Dimension, where: str = "tune.space") -> None:
    """The key is one a trial's job takes, and each value the dimension can draw passes the key's own checks."""
    section = dim.key.split(".", 1)[0]
    check(
        "." in dim.key and section not in NOT_SWEPT,
        f"{where}.{dim.key}",
        f"must be a run-config key like optim.lr outside {', '.join(NOT_SWEPT)} (docs/configuration.md)",
    )
    for value in dim.ends():
        trial = copy.deepcopy(cfg)
        try:
            apply(trial, nested(dim.key, value))
            validate(trial)
        except ConfigError as e:
            raise ConfigError(f"{where}.{dim.key}: {value!r} is refused: {e}") from None


def nested(key: str, value: Any) -> dict[str, Any]:
    """'optim.lr', 0.1 -> {'optim': {'lr': 0.1}}."""
    out: Any = value
    for part in reversed(key.split(".")):
        out = {part: out}
    return out


def dimensions(cfg: Any, space: dict[str, Any]) -> list[Dimension]:
    """The whole space, checked against `cfg` (the trials' base config); at least one dimension."""
    check(bool(space), "tune.space", "must name at least one key to sweep, e.g. optim.lr: loguniform(1e-4, 1e-1)")
    dims = [parse(key, text) for key, text in space.items()]
    for dim in dims:
        check_key(cfg, dim)
    return dims


def to_tune(dims: list[Dimension]) -> dict[str, Any]:
    """Ray Tune's param_space: flat, keyed by the config key."""
    from ray import tune

    make = {
        "uniform": lambda a: tune.uniform(*a),
        "loguniform": lambda a: tune.loguniform(*a),
        "randint": lambda a: tune.randint(*a),
        "choice": lambda a: tune.choice(list(a[0])),
        "grid": lambda a: tune.grid_search(list(a[0])),
    }
    return {d.key: make[d.kind](d.args) for d in dims}


def grid_size(dims: list[Dimension]) -> int:
    return math.prod(len(d.args[0]) for d in dims if d.kind == "grid")


def overrides(values: dict[str, Any]) -> dict[str, Any]:
    """A trial's sampled values as one nested mapping for its config."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        node = out
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value.item() if hasattr(value, "item") else value  # numpy scalars from Tune's samplers
    return out
