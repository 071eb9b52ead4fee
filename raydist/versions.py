"""The Ray and torch versions raydist runs with: those pyproject declares, which CI proves (`make test` at the
newest, `make test-min` at the oldest). Anything else is refused before anything starts, in one line, exit 2:
a Ray outside the range fails later with a traceback from an import (ray.train's LoggingConfig is new in 2.58).

The range is read from raydist's own installed metadata, so it is declared once (pyproject.toml). A checkout that is
not installed (`ray job submit --working-dir .` carries the source only) has no metadata: nothing is checked there,
as its driver's node was checked where it was submitted from."""

from __future__ import annotations

import re
from importlib import metadata

from raydist.errors import UsageError

CHECKED = ("ray", "torch")
_SPEC = re.compile(r"(>=|<=|==|!=|~=|<|>)\s*([0-9][0-9A-Za-z.*+!-]*)")


def release(version: str) -> tuple[int, ...]:
    """'2.13.0+cpu' -> (2, 13, 0); '2.58.0rc1' -> (2, 58, 0): the release numbers only."""
    numbers = re.match(r"\d+(?:\.\d+)*", version.split("!")[-1])
    return tuple(int(n) for n in numbers.group(0).split(".")) if numbers else ()


def _pad(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    n = max(len(a), len(b))
    return a + (0,) * (n - len(a)), b + (0,) * (n - len(b))


def satisfies(version: str, specifier: str) -> bool:
    """Whether `version` meets every clause of `specifier` ('>=2.58,<2.61'), by release numbers."""
    have = release(version)
    for op, wanted in _SPEC.findall(specifier):
        if wanted.endswith(".*"):  # ==2.13.* / !=2.13.*
            prefix = release(wanted[:-2])
            same = have[: len(prefix)] == prefix
            if (op == "==" and not same) or (op == "!=" and same):
                return False
            continue
        a, b = _pad(have, release(wanted))
        ok = {
            ">=": a >= b,
            "<=": a <= b,
            ">": a > b,
            "<": a < b,
            "==": a == b,
            "!=": a != b,
            "~=": a >= b and a[: len(release(wanted)) - 1] == b[: len(release(wanted)) - 1],
        }[op]
        if not ok:
            return False
    return True


def declared(requires: list[str] | None) -> dict[str, str]:
    """{'ray': '>=2.58,<2.61', ...} from Requires-Dist lines ('ray[default,train]<2.61,>=2.58'), for CHECKED."""
    out = {}
    for line in requires or []:
        if ";" in line:
            continue  # an extra's (test, heal): not what a run needs
        m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(\[[^\]]*\])?\s*(.*)", line)
        if m and m.group(1).lower() in CHECKED:
            out[m.group(1).lower()] = ",".join(sorted(m.group(3).replace(" ", "").split(","), reverse=True))
    return out


def refusal(name: str, version: str | None, specifier: str) -> str | None:
    """The one line that refuses `name` at `version` (None: not installed, a later import says so), or None."""
    if version is None or not specifier or satisfies(version, specifier):
        return None
    return (
        f"{name} {version} is installed; raydist needs {name}{specifier} (the versions its CI tests: "
        f"install one of them, e.g. pip install '{name}{specifier}')"
    )


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def check_versions() -> None:
    """UsageError (exit 2) when the installed Ray or torch is outside raydist's declared range."""
    try:
        wanted = declared(metadata.requires("raydist"))
    except metadata.PackageNotFoundError:
        return
    for name, specifier in wanted.items():
        line = refusal(name, _installed(name), specifier)
        if line:
            raise UsageError(line)
