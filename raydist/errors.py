"""Errors a user can act on, and the one place that turns them into a one-line message and exit status 2."""

from __future__ import annotations

import functools
import sys
from typing import Callable, NoReturn, TypeVar

F = TypeVar("F", bound=Callable[..., int | None])

USAGE_EXIT = 2


class RaydistError(Exception):
    """A problem with the user's input or environment; its message is the whole story, one line."""


class ConfigError(RaydistError):
    """A config file or --set override that cannot be used."""


def fail(message: str, code: int = USAGE_EXIT) -> NoReturn:
    print(f"raydist: error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    sys.exit(code)


def exits_cleanly(main: F) -> F:
    """Run a command-line entry point so that a RaydistError becomes one line on stderr and exit 2."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except RaydistError as e:
            fail(str(e))
        except KeyboardInterrupt:
            fail("interrupted", code=130)

    return wrapper  # type: ignore[return-value]
