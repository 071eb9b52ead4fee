"""The typed-config engine: dataclasses whose fields carry their help and bounds, loaded from YAML and --set.

Every settings class raydist has (the run config `raydist.config.Config`, `raydist launch`'s `LaunchConfig`, the
SLURM side's `ClusterConfig`, each strategy's section) is declared with `opt(...)`, read by `apply`/`merge`,
checked by `validate` and documented by `reference_markdown`: a bound or a help text is written once, and the
loader, the error messages and docs/configuration.md all follow it. The public API: `opt`, `internal`, `check`,
`apply`, `merge`, `validate`, `read_yaml`, `parse_override`, `reference_markdown`, `free` (a mapping of the
user's own keys), the shared field parsers (`run_name`, `shared_path`, `worker_count`, `import_path`, `mapping`)
and `WorkerRange`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import operator
from collections.abc import Callable, Iterable
from dataclasses import field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args, get_origin, get_type_hints

import yaml

from raydist.errors import ConfigError

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


def free(help: str, parse: Callable[[Any, str], Any] | None = None) -> Any:
    """A mapping of the user's own keys, passed through unchecked (or as `parse` checks them) to what reads them (a
    factory's arguments). A file or `--set section.args.KEY=VALUE` adds or replaces keys; the keys already there
    stay."""
    metadata = {"help": help, "bounds": {}, "special": {}, "parse": parse or mapping, "shown": "mapping", "merge": True}
    return field(default_factory=dict, metadata=metadata)


def internal(default: Any) -> Any:
    """A field the program sets, not the user: refused as a key, left out of the reference."""
    return field(default=default, metadata={"internal": True})


def check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


# ---- per-field parsers: rules a bound cannot say --------------------------------------------------------


def run_name(value: str, key: str) -> str:
    # The name is a directory under storage_path: a '/', '.' or '..' would put the run somewhere else.
    check("/" not in value, key, f"must not contain '/' (got {value!r})")
    check(value not in (".", ".."), key, f"must name a directory under run.storage_path (got {value!r})")
    no_control_characters(value, key)
    return value


def experiment_name(value: str, key: str) -> str:
    check(bool(value.strip()), key, "must not be empty")
    no_control_characters(value, key)
    return value


def no_control_characters(value: str, key: str) -> None:
    # A NUL cannot be in a path at all; other control characters make paths no one can type.
    check(value.isprintable(), key, f"must not contain control characters (got {value!r})")


def shared_path(value: str, key: str) -> str:
    check(bool(value.strip()), key, "must not be empty")
    no_control_characters(value, key)
    # Workers on other nodes open it as a path; a URL would need a filesystem layer raydist does not set up.
    check("://" not in value, key, f"must be a local or shared filesystem path (got {value!r})")
    return value


def mapping(value: Any, key: str) -> dict[str, Any]:
    check(isinstance(value, dict), key, f"must be a mapping of names to values (got {value!r})")
    for name in value:
        check(
            isinstance(name, str) and name.isidentifier(),
            key,
            f"keys must be Python identifiers, passed as keyword arguments (got {name!r})",
        )
    return value


def import_path(value: str, key: str) -> str:
    """'' or 'package.module:attribute' (checked for form here; whether it imports is checked before Ray starts)."""
    if not value:
        return value
    module, sep, attribute = value.partition(":")
    parts = module.split(".") + attribute.split(".")
    check(
        bool(sep) and all(p.isidentifier() for p in parts),
        key,
        f"must be an import path 'package.module:function' (got {value!r})",
    )
    return value


def worker_count(value: Any, key: str) -> int | str:
    """N (a fixed count) or 'MIN-MAX' (elastic): kept as written, read through ScalingConfig's properties."""
    if isinstance(value, int) and not isinstance(value, bool):
        check(value >= 1, key, f"must be >= 1 (got {value})")
        return value
    text = str(value).strip()
    low, sep, high = text.partition("-")
    if not sep and low.isdigit():
        return worker_count(int(low), key)
    check(
        bool(sep) and low.strip().isdigit() and high.strip().isdigit(),
        key,
        f"must be a worker count N or a range MIN-MAX such as 2-4 (got {value!r})",
    )
    lo, hi = int(low), int(high)
    check(1 <= lo < hi, key, f"range must have 1 <= MIN < MAX (got {value!r})")
    return f"{lo}-{hi}"


class WorkerRange:
    """For a config whose `COUNT_FIELD` holds a worker count N or an elastic range 'MIN-MAX' (`worker_count`)."""

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
        if isinstance(value, bool):  # YAML 1.1 reads off/on/no/yes as booleans: `mixed_precision: off` means "off"
            value = next((c for c in choices if isinstance(c, str) and yaml.safe_load(c) is value), value)
        check(value in choices, key, f"must be one of {', '.join(map(str, choices))} (got {value!r})")
        return value
    if typ is bool:
        check(isinstance(value, bool), key, f"must be true or false (got {value!r})")
        return value
    if typ is int:
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                pass
        check(isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer (got {value!r})")
        return value
    if typ is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        check(isinstance(value, (int, float)) and not isinstance(value, bool), key, f"must be a number (got {value!r})")
        return float(value)
    if typ is str:
        check(isinstance(value, str), key, f"must be a string (got {value!r})")
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


def apply(obj: Any, data: dict[str, Any], prefix: str = "") -> None:
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
            check(isinstance(value, dict), key, f"must be a mapping of {', '.join(_settable(current))}")
            apply(current, value, key + ".")
            continue
        typ, parse = hints[name], fields[name].metadata.get("parse")
        if _plain(typ) or not parse:  # a parser of a plain-typed field gets the typed value
            value = _coerce(value, typ, key)
        value = parse(value, key) if parse else value
        setattr(obj, name, {**current, **value} if fields[name].metadata.get("merge") else value)


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


def merge(
    cfg: Any,
    files: Iterable[str | Path] = (),
    overrides: Iterable[str] = (),
    *,
    what: str = "sections (model, data, ...)",
    kind: str = "config",
) -> Any:
    """Apply each YAML file, then each --set, to dataclass `cfg` in order (later wins); not yet validated.

    A file's errors start with its path: with several files and overrides, the key alone would not say where."""
    for path in map(Path, files):
        data = read_yaml(path, what, kind)
        try:
            apply(cfg, data)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
    for text in overrides:
        apply(cfg, parse_override(text))
    return cfg


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
        yield (
            f"| `{prefix}{f.name}` | {_cell(_type_text(hints[f.name], f.metadata))} | `{_default_text(value)}` "
            f"| {_cell(f.metadata.get('help', ''))} |"
        )


def reference_markdown(cls: type) -> str:
    """The reference of config class `cls` as a markdown table, generated from its fields (docs/configuration.md)."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|", *_rows(cls())]
    return "\n".join(rows) + "\n"
