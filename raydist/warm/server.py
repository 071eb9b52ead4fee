"""A node's warm interpreter: a Python process with torch imported that forks a rank's process on request.

Started per node by the SLURM bring-up beside `ray start` (raydist.slurm.bringup), listening on a Unix socket in
the job's private temp dir. A rank's agent (raydist.launcher.agent) asks it to run `python script.py ...` or
`python -m module ...`; the forked child becomes that script with its own environment, working directory, argv,
sys.path and output pipe, without paying torch's import again (about as long as the rest of a small script's
start-up together). Anything it cannot run exactly as a fresh interpreter would (another Python, interpreter
options, PYTHON* variables that act at start-up, a preloaded library of its own) it declines, and the agent starts
a fresh interpreter as before.

Run by path, not as a module: it imports nothing of raydist's as a package, so that the script imports raydist (or
its own copy, from a job's working dir) afresh; its own modules (this directory's) it imports under a package name
of its own, and the child drops them. It must stay single-threaded while it forks; torch's import starts no thread
that matters here (OpenBLAS's pool re-forms in the child).

The parts: the protocol (wire.py), a request and its checks (request.py), the imports made before forking and what
they read of the environment (preload.py), the loop (loop.py; the node's: node.py), forking (forking.py), the
child's turning into the script (child.py), and Ray's workers, forked by a server of their Ray job (rayjob.py). A
child dies with the server (PR_SET_PDEATHSIG); SIGTERM ends the server only once no child of its is left.

    python raydist/warm/server.py SOCKET_PATH [--parent PID]
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import sys

PACKAGE = "raydist_warm_server"
"""raydist/warm/ under a name of its own, in this process only: a raydist in sys.modules would be every forked
script's (not the one in a job's working dir), and the server starts where raydist is not installed."""


def _own_modules(*names: str) -> list:
    spec = importlib.util.spec_from_loader(PACKAGE, None, is_package=True)
    spec.submodule_search_locations = [os.path.dirname(os.path.abspath(__file__))]
    sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)
    return [importlib.import_module(f"{PACKAGE}.{name}") for name in names]


child, forking, loop, node, preload = _own_modules("child", "forking", "loop", "node", "preload")


def main(argv: list[str]):
    """The node's server, serving until a request is this process's own: in the forked child, which has become
    that request's script, it is returned."""
    if len(argv) not in (2, 4) or (len(argv) == 4 and (argv[2] != "--parent" or not argv[3].isdigit())):
        print("usage: python raydist/warm/server.py SOCKET_PATH [--parent PID]", file=sys.stderr)
        sys.exit(2)
    if len(argv) == 4:  # the embedded Ray instance's: it ends with the job's process
        forking.die_with_parent(signal.SIGTERM)
        if os.getppid() != int(argv[3]):
            sys.exit(0)
    env_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path[1:] if p not in env_path]
    if os.path.exists(argv[1]):
        os.unlink(argv[1])  # a socket left by a server of this job that was killed
    # Listening before the imports: a request that comes meanwhile waits in the backlog, not the cold way.
    server = node.NodeServer(argv[1])
    preload.import_torch()
    server.handle_stop_signals()
    print(f"warm interpreter: pid {os.getpid()}, torch imported, listening on {argv[1]}", flush=True)
    request = loop.serve(server)
    child.become(request, base_path)
    return request


if __name__ == "__main__":
    child.run(main(sys.argv))
