"""Forking a warm interpreter's child (a rank, a Ray worker, a Ray job's server), which must never run the
server's signal handlers, and must die with it."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

HANDLED = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD}
"""The signals the server handles itself: blocked across a fork until the child has handlers of its own."""
PR_SET_PDEATHSIG = 1


def fork(server_pid: int) -> int:
    """os.fork, with the server's handled signals blocked in the child, where they stay pending until it
    unblocks them (SLURM's SIGTERM reaches every process of the step, a fresh child's too)."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:
        return os.fork()
    finally:
        if os.getpid() == server_pid:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)


def unblock() -> None:
    """In a child: the signals blocked across its fork are delivered now, to the handlers it has set."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)


def die_with_parent(sig: int) -> None:
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, sig)


def dies_with_server(server_pid: int) -> None:
    """In a child: killed when the server ends, as PR_SET_PDEATHSIG gives a rank started the cold way its agent."""
    die_with_parent(signal.SIGKILL)
    if os.getppid() != server_pid:
        os._exit(1)  # the server died before the death signal was set: nobody would end this child
