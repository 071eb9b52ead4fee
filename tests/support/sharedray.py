"""One Ray head shared by the tests marked `shared_ray`: their jobs join it as a user's job joins a running cluster,
instead of each starting (and stopping) an embedded instance of its own. Started at the first such test, stopped
when the next test's module has none (conftest.py, which also runs those modules one after another).

The suite is CPU-bound on 2 cores, and an embedded instance's own processes (GCS, raylet, the dashboard and its
modules, agents) are a large part of a short job's CPU time (benchmarks/shared_head.py). Not marked, and so on an
instance of their own: what only the embedded instance does (its token, `make run`), tests that run two jobs at
once (the Ray processes a test signals are found under the head: `jobutil.ray_root`) and `raydist launch`.
"""

from __future__ import annotations

import contextlib

from tests.support.rayhead import Head, ray_head

_stack: contextlib.ExitStack | None = None
_head: Head | None = None
CPUS = 8
"""Logical CPUs: room for every marked test's job (an embedded instance declares what its job needs)."""


def head() -> Head:
    global _stack, _head
    if _head is None:
        _stack = contextlib.ExitStack()
        _head = _stack.enter_context(ray_head(num_cpus=CPUS))
    return _head


def job_env() -> dict[str, str]:
    return head().job_env()


def stop() -> None:
    global _stack, _head
    if _stack is not None:
        _stack.close()
    _stack = _head = None
