"""Ending a job's process without tearing down the interpreter.

After a job's last line, Python's own exit frees every module it imported, one object at a time: with torch, Ray and
Ray Train loaded that took about a second of CPU at the end of every job on the test machines (a second of the whole
command, docs/dev/startup-changes.md). Besides freeing memory, which the operating system does at once, that
teardown flushes files left open; a job's driver leaves none (its summary, metrics and rank logs are closed or
line-buffered before this). `exit_now` does what Python's exit does that matters before it: it waits for the threads
that are not daemons, runs the exit hooks (Ray's, the warm interpreter's, logging's) and flushes stdout and stderr,
and then ends the process.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """`sys.exit(code)` for a process whose work is done, without the interpreter's teardown."""
    run_exit_hooks = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_hooks is None:  # another Python: the usual exit
        sys.exit(code)
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    run_exit_hooks()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed, a reader gone, or replaced by None
            pass
    os._exit(code)
