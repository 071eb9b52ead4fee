"""Errors a user can act on, and the one place that turns them into a one-line message and an exit status.

Exit statuses, the same for every job and command:
  0  done
  1  a runtime failure: training failed, the cluster was lost or cannot be reached, a node did not join
  2  bad input: usage, config, or a request the cluster can never satisfy; refused before any work starts
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

F = TypeVar("F", bound=Callable[..., int | None])

RUNTIME_EXIT = 1
USAGE_EXIT = 2


class RaydistError(Exception):
    """A failure whose message is the whole story, one line; by itself a runtime failure (exit 1)."""

    exit_code = RUNTIME_EXIT


class UsageError(RaydistError):
    """Input that cannot work: a bad argument, a request the cluster cannot satisfy (exit 2)."""

    exit_code = USAGE_EXIT


class ConfigError(UsageError):
    """A config file or --set override that cannot be used."""


def fail(message: str, code: int = USAGE_EXIT) -> NoReturn:
    print(f"raydist: error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    sys.exit(code)


def exits_cleanly(main: F) -> F:
    """Run a command-line entry point so that a RaydistError becomes one line on stderr and its exit status."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except RaydistError as e:
            fail(str(e), code=e.exit_code)
        except KeyboardInterrupt:
            fail("interrupted", code=130)

    return wrapper  # type: ignore[return-value]


def last_error_line(e: BaseException) -> str:
    """The line of a (possibly wrapped) remote error that says what went wrong: the innermost cause's last."""
    cause = e
    while cause.__cause__ is not None:
        cause = cause.__cause__
    lines = [ln for ln in str(cause).splitlines() if ln.strip()]
    return lines[-1] if lines else type(cause).__name__
