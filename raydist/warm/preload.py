"""What a warm interpreter imports before it forks, and what those imports read and set of the environment: a
request whose environment differs there is declined (raydist.warm.request), and a child gets what they set."""

from __future__ import annotations

import contextlib
import os
import types


def _load_private_api() -> types.ModuleType:
    """raydist/private_api.py (every private Ray or torch name raydist uses), loaded by path under a name of its own
    and left out of sys.modules: the server imports nothing of raydist's as a package, so that a forked script
    imports raydist afresh (its own copy, from a job's working dir), and the server starts where raydist is not
    installed. That module imports only the standard library at its import."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "private_api.py")
    spec = importlib.util.spec_from_file_location("raydist_warm_server_private_api", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


private_api = _load_private_api()

PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch.utils.data", private_api.DYNAMO_MODULE)
"""torch._dynamo too: DistributedDataParallel imports it as it is built, and torch's optimizers at their first step
(torch 2.13): about a second of a fresh process's imports (sympy, inductor's config) before its first step."""
RAY_DEPS_PRELOAD = (
    "pandas",
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.dataset",
    "pydantic",
    "grpc",
    "google.protobuf",
    "requests",
    "jsonschema",
    "yaml",
    "aiohttp",
    "msgpack",
    "click",
    "filelock",
)
"""What raydist.warm.rayjob.RAY_JOB_PRELOAD imports besides Ray itself: none of it reads the settings Ray gives its
workers, so the node's server imports it, once it is idle after torch (raydist.warm.node.IDLE_BEFORE_RAY_DEPS_S: a
rank asked for meanwhile is forked first), and each Ray job's server, its fork, then imports only Ray: about half of
what that server imported before its job's first worker on the node could start, on the path to a Ray Train run's
first step."""

ENV_BEFORE_IMPORT: dict[str, str] = {}
"""This server's environment before its preloaded modules were imported: a request's must equal it where
raydist.warm.request.acts_at_start says, as a fresh interpreter's would before the same imports."""
SET_AT_IMPORT: dict[str, str] = {}
"""What those imports put in os.environ (torch._dynamo's: TORCHINDUCTOR_CACHE_DIR, from the temp dir and the
user): a fresh interpreter's imports would put it there too, so a fork gets it where its request has none."""
READ_AT_IMPORT: set[str] = set()
"""The variables the preloaded modules read through os.environ while they were imported: in a fork they keep
the server's values."""


def import_torch() -> None:
    """The node's server's first imports (PRELOAD), with the environment recorded before and after them."""
    ENV_BEFORE_IMPORT.update(os.environ)
    with recording_reads(READ_AT_IMPORT):
        for name in PRELOAD:
            __import__(name)
    note_set_at_import()


def import_recorded(names: tuple[str, ...], around=contextlib.nullcontext) -> None:
    """Ray's or its dependencies' modules, recording the settings they read (READ_AT_IMPORT); one that is missing is
    skipped (pyarrow and pandas come with ray[data], not ray). `around` is entered inside the recording: what it
    imports itself (Ray, for raydist.warm.rayjob.actor_class_ids_from_urandom) is recorded too."""
    # fsspec unrecorded: it copies the whole environment at its import (to pick its FSSPEC_* settings out), which
    # would record every variable as read. Ray Data imports it.
    with contextlib.suppress(ImportError):
        __import__("fsspec")
    with recording_reads(READ_AT_IMPORT), around():
        for name in names:
            with contextlib.suppress(ImportError):
                __import__(name)
    note_set_at_import()


def note_set_at_import() -> None:
    SET_AT_IMPORT.update({k: v for k, v in os.environ.items() if ENV_BEFORE_IMPORT.get(k) != v})


@contextlib.contextmanager
def recording_reads(keys: set[str]):
    """Every environment variable read through os.environ (os.getenv too) meanwhile, into `keys`."""
    cls = os._Environ
    original = cls.__getitem__

    def recorded(self, key):
        keys.add(key)
        return original(self, key)

    cls.__getitem__ = recorded
    try:
        yield
    finally:
        cls.__getitem__ = original
