"""Ending the embedded Ray instance once the job's result is safe, without waiting on Ray's slowest daemon.

`ray.shutdown()` stops the instance's processes one by one, each given a second to exit after SIGTERM: the raylet,
the GCS, then the autoscaler's monitor. The monitor's SIGTERM handler reports "the autoscaler failed" to the GCS,
which is gone by then, so it always used its whole second before Ray killed it (the wait after a script's last
step: docs/data/footprint_before_yielding.json and footprint.json). Killed first, it is gone at once, as Ray's shutdown
would leave it a second later; a SIGTERM while the GCS is up would instead print that error on the user's terminal.
An embedded instance has no autoscaling, so nothing of the monitor's is lost. Checked with Ray 2.58 and 2.60.
"""

from __future__ import annotations

import signal

import psutil

MONITOR_SCRIPT = "/autoscaler/_private/monitor.py"


def is_monitor(argv: list[str]) -> bool:
    """Whether a process with this command line is Ray's autoscaler monitor (python -u .../monitor.py ...)."""
    return bool(argv) and "python" in argv[0].rsplit("/", 1)[-1] and any(a.endswith(MONITOR_SCRIPT) for a in argv[1:3])


def stop_monitor() -> int | None:
    """Kill the autoscaler monitor that this process's `ray.init` started (a direct child); its pid, or None."""
    for child in psutil.Process().children():
        try:
            if is_monitor(child.cmdline()):
                child.send_signal(signal.SIGKILL)
                child.wait(timeout=5)
                return child.pid
        except (psutil.Error, OSError):
            continue
    return None


def end_local() -> None:
    """Shut the embedded instance down: the monitor first, then everything else through `ray.shutdown()`."""
    import ray

    if not ray.is_initialized():
        return
    stop_monitor()
    ray.shutdown()
