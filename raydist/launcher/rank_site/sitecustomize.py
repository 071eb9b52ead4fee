"""Loaded by `site` in each rank's process that `raydist launch` starts (its agent puts this directory first on
PYTHONPATH). It notes the moment the script has returned, so that a rank that then hangs or dies on its way out
(interpreter teardown, atexit, destructors) is reported as an exit fault, not restarted as a failed run.

Then it takes itself out of the way, so that the script sees what a fresh interpreter under srun would: its own
PYTHONPATH and sys.path, no variable of raydist's, and the `sitecustomize` next on the path (the virtualenv's or
the user's), imported in its place. It imports nothing of raydist: the script's Python may not have raydist.
"""

import os
import sys

RETURNED_ENV = "RAYDIST_RETURNED_FILE"  # where to note it (raydist.launcher.agent)
PID_ENV = "RAYDIST_RANK_PID"  # the rank's own process (its start shim's pid): not a process the script starts
PYTHONPATH_ENV = "RAYDIST_PYTHONPATH"  # the rank's own PYTHONPATH: '=' + its value, or '' when it had none


def _restore_environment(here):
    saved = os.environ.pop(PYTHONPATH_ENV, None)
    if saved is not None:
        if saved.startswith("="):
            os.environ["PYTHONPATH"] = saved[1:]
        else:
            os.environ.pop("PYTHONPATH", None)
    sys.path[:] = [p for p in sys.path if not p or os.path.realpath(p) != here]


def _note_when_returned(path, pid):
    """At the start of threading's shutdown, which Python runs right after the main module has ended (before
    non-daemon threads are joined, atexit and teardown). Not after an uncaught exception (sys.last_value)."""
    import threading

    def returned():
        if os.getpid() == pid and getattr(sys, "last_value", None) is None:
            try:
                with open(path, "w"):
                    pass
            except OSError:
                pass

    try:
        threading._register_atexit(returned)  # private, 3.9+: the one hook at that moment (raydist.private_api)
    except (AttributeError, RuntimeError):
        import atexit

        atexit.register(returned)


def _chain():
    """The next `sitecustomize` on the path, as site would have imported it had this one not been first (with none,
    this one stays: the import that is running needs a module under that name)."""
    this = sys.modules.pop("sitecustomize")
    try:
        import sitecustomize  # noqa: F401
    except ImportError as e:
        sys.modules["sitecustomize"] = this
        if e.name != "sitecustomize":
            raise


def _main():
    path = os.environ.pop(RETURNED_ENV, "")
    pid = os.environ.pop(PID_ENV, "")
    _restore_environment(os.path.dirname(os.path.realpath(__file__)))
    if path and pid == str(os.getpid()):
        _note_when_returned(path, int(pid))
    _chain()


_main()
