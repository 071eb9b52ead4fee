"""The Python a Ray node starts its processes with: the real interpreter, except for Ray's worker set-up.

Ray starts each worker of a job that has a runtime_env (raydist's jobs have one: its `py_executable` is
raydist.warm.worker_exec) as `python setup_worker.py default_worker.py ARGS`: a fresh interpreter that imports
Ray to read the runtime_env's context, sets its variables and execs the `py_executable`. Measured on 2 cores that
import is 0.3-0.4 s of CPU per worker, on the path of every link of Ray Train's chain (controller, state actor,
workers, synchronization actor). The raylet takes the interpreter for that command from `sys.executable` of the
process that starts the node (ray/_private/services.py builds `--python_worker_command` from it), so a node started
with `sys.executable` set to the small script written here runs `setup_worker.py` through warm_exec, which does
what it does for raydist's context without importing Ray (warm_exec.setup_worker) and hands any other context to
Ray's own. Every other process Ray starts with that interpreter (its dashboard, agents, monitors) is exec'd as
the real interpreter at once: same pid, same arguments.

    python -m raydist.warm.ray_python SCRIPT ray start ...   # Ray's command line with that interpreter
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from pathlib import Path

SCRIPT_NAME = "ray-python"


def write(directory: str | os.PathLike, stand_in: str) -> Path:
    """The interpreter script in `directory` (private to this user: it runs what the warm interpreter forks);
    `stand_in` is the command of raydist.warm.worker_exec (raydist.warm.client.py_executable)."""
    path = Path(directory) / SCRIPT_NAME
    path.write_text(
        "#!/bin/sh\n"
        f'case "$1" in */setup_worker.py) exec {stand_in} "$@";; esac\n'
        f'exec {shlex.quote(sys.executable)} "$@"\n'
    )
    path.chmod(0o700)
    return path


@contextlib.contextmanager
def starting_ray_with(script: str | os.PathLike | None):
    """Ray's processes started meanwhile (ray.init of a new instance) with `script` as their interpreter; with
    None, as Ray starts them."""
    if script is None:
        yield
        return
    real = sys.executable
    sys.executable = str(script)
    try:
        yield
    finally:
        sys.executable = real


def command(script: str | os.PathLike, ray_cmd: list[str]) -> list[str]:
    """`ray_cmd` (`ray start ...`) run so that the node it starts has `script` as its interpreter: Ray's
    command-line tool, run in this interpreter; any other command (a stand-in for Ray in a test) as it is."""
    if not ray_cmd or os.path.basename(ray_cmd[0]) != "ray":
        return list(ray_cmd)
    return [sys.executable, "-m", __name__, str(script), *ray_cmd]


def main(argv: list[str]) -> int:
    script, ray_cmd = argv[0], argv[1:]
    from ray.scripts.scripts import main as ray_main

    sys.argv = ["ray", *ray_cmd[1:]]
    with starting_ray_with(script):
        return ray_main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
