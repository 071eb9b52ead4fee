"""A warm interpreter's forked child turning into `python script.py args` (or `python -m module args`, or Ray's
`default_worker.py`) as a fresh interpreter would start it: signals, streams, environment, directory, argv,
sys.path, __main__, thread count, fresh random state; then running it, with the same traceback and exit code."""

from __future__ import annotations

import os
import signal
import sys
import types

from . import forking, preload
from .request import Request, ray_job_of

RETURNED_ENV = "RAYDIST_RETURNED_FILE"
"""Where a rank of raydist launch notes that its script has returned (raydist.launcher.agent reads it): what
follows is its way out, and a fault there is not a failed training run."""
_returned_file = ""
_server_modules: list[types.ModuleType] = []
"""The server's own modules, out of sys.modules in the child but kept: their functions still run."""


def fresh_signals() -> None:
    """Right after the fork: the server's signal handling undone, as a fresh interpreter has it; what came
    meanwhile (blocked across the fork: forking.fork) is delivered now."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    forking.unblock()


def become(request: Request, base_path: list[str]) -> None:
    """Once the child has left the server's loop: it turns into the script (its streams, environment, directory,
    sys.path, argv, __main__, threads, random state)."""
    if request.niceness is not None:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, int(request.niceness))
        except OSError:
            pass
    _own_streams(request.out_fds)
    global _returned_file
    _returned_file = request.env.pop(RETURNED_ENV, "")  # the agent's, not the script's
    os.environ.clear()
    os.environ.update(request.env)
    for key, value in preload.SET_AT_IMPORT.items():
        os.environ.setdefault(key, value)
    os.chdir(request.cwd)
    sys.dont_write_bytecode = bool(request.env.get("PYTHONDONTWRITEBYTECODE"))
    if request.env.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable()
    first = os.path.dirname(os.path.realpath(request.script)) if request.script else os.getcwd()
    extra = [p for p in request.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *base_path]
    sys.argv = [request.script or "-m", *request.args]
    sys.orig_argv = list(request.argv)
    _fresh_modules()
    _fresh_numpy_and_threads(request.env, ray_worker=ray_job_of(request) is not None)
    _ray_settings_from_environment()


def _own_streams(out_fds: list[int]) -> None:
    """stdin from /dev/null, stdout and stderr to the fds the agent sent, unbuffered as under `python -u`."""
    import io

    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_fds[0], 1)
    os.dup2(out_fds[-1], 2)
    for fd in (null, *(fd for fd in out_fds if fd > 2)):
        try:
            os.close(fd)
        except OSError:
            pass
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace"
    )


def _fresh_modules() -> None:
    """The script's own __main__, not the server's; and none of the server's modules (this package, under the
    server's own name: raydist/warm/server.py), which would not be in a fresh interpreter's sys.modules."""
    package = __spec__.parent
    _server_modules.append(sys.modules["__main__"])
    _server_modules.extend(
        sys.modules.pop(name) for name in list(sys.modules) if name == package or name.startswith(package + ".")
    )
    sys.modules["__main__"] = types.ModuleType("__main__")


def _fresh_numpy_and_threads(env: dict[str, str], ray_worker: bool) -> None:
    import multiprocessing

    import numpy
    import torch

    numpy.random.seed()  # `random` reseeds itself in a forked child; numpy's global generator does not
    multiprocessing.current_process().authkey = os.urandom(32)  # made at import: the server's, on every rank
    torch.set_num_threads(_torch_threads(env, ray_worker))  # read at the OpenMP runtime's load: the server's


def _torch_threads(env: dict[str, str], ray_worker: bool) -> int:
    """The threads torch would have started with in a fresh process: OMP_NUM_THREADS, else one per CPU this
    process may use. A Ray worker gets its OMP_NUM_THREADS from Ray only when its first task starts (the CPUs the
    task holds, 1 when it holds none or one: ray._private.utils.set_omp_num_threads_if_unset), before that task
    imports torch: 1 here, the common case; raydist's training loop applies a larger value itself."""
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        return int(threads)
    return 1 if ray_worker else max(1, len(os.sched_getaffinity(0)))


def _ray_settings_from_environment() -> None:
    """In a worker forked by a Ray job's server: Ray's C++ side reads its settings again from this worker's
    environment, as ray.init does after setting one (ray._private.authentication), and forgets a cached token."""
    preload.private_api.reread_ray_settings()


def _run_script(script: str) -> None:
    """As `python script.py` does: a fresh `__main__` whose __file__ is absolute (3.9+); argv[0] stays as given."""
    import builtins
    import importlib.machinery

    path = os.path.abspath(script)
    main = sys.modules["__main__"]
    main.__dict__.update(
        __file__=path,
        __cached__=None,
        __builtins__=builtins,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
    )
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def _note_returned() -> None:
    if _returned_file:
        try:
            with open(_returned_file, "w"):
                pass
        except OSError:
            pass


def run(request: Request) -> None:
    """The script, as `python` runs it; its traceback shows its own frames only."""
    import runpy

    try:
        if request.module:
            runpy._run_module_as_main(request.module, alter_argv=True)
        else:
            _run_script(request.script)
        _note_returned()
    except SystemExit:
        _note_returned()  # as a fresh interpreter's rank_site notes it: sys.exit() ends the script too
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None and (
            tb.tb_frame.f_code in (run.__code__, _run_script.__code__)
            or tb.tb_frame.f_globals.get("__name__") == "runpy"
        ):
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        sys.exit(1)
