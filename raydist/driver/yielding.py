"""What runs beside the training on the embedded Ray instance (and on a SLURM node with the cluster's opt-in
yield_daemons) yields the CPU to it: Ray's daemons and the actors that only serve the dashboard run at idle priority
(SCHED_IDLE, nice 19; the GCS and Ray Train's controller and helper actors only niced), so that on a machine whose
cores the ranks fill they take what the ranks leave instead of a share of it, and give a core up at once when a rank
wakes (docs/running.md#what-runs-beside-the-training).

Only processes that never start a training process are lowered: a child inherits its parent's priority, and an
unprivileged process cannot raise it back. So not the raylet, which starts Ray's workers, nor an idle Ray worker
(`ray::IDLE`), which may become a rank's agent or a training worker, nor the warm interpreter, which forks them.
The processes are this driver's (or the node's bring-up's) descendants, found by the titles Ray gives them (Ray
2.58-2.60); one Ray does not know yet is left as it is. The ranks' own priority is never lowered; a Ray worker Ray
started below its raylet's takes the raylet's where it may (`match_raylet_priority`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import threading
import time

LOWEST = 19

# By the first word of the process's command line (Ray sets the titles of its workers and dashboard modules).
YIELDING_TITLES = (
    "ray::StandIn",  # raydist launch: a rank's actor in the dashboard's run list, idle
    "ray::TrainStateActor",  # Ray Train's run list for the dashboard
    "ray::DashboardAgent",
    "ray::RuntimeEnvAgent",
    "ray::_StatsActor",
    "ray-dashboard-",  # the dashboard's modules
)
# By a script Ray runs under python
YIELDING_SCRIPTS = (
    "/dashboard/dashboard.py",
    "/dashboard/agent.py",
    "/_private/log_monitor.py",
    "/_private/monitor.py",
)
YIELDING_EXECUTABLES = ("gcs_server",)
# Niced only, not idle: each answers the training within a poll or a step (Ray Train's controller drains its
# workers' reports every 0.1 s, its synchronization actor holds their barriers, the coordinator its resource asks),
# so starved at idle priority it would hold the ranks up. None of them starts a process. At nice 19 they still run
# in the ranks' gaps: jobs/sync.py's loop at 1.04 (0.99-1.13)x (docs/data/footprint_ab_helpers.json).
NICED_TITLES = ("ray::TrainController", "ray::SynchronizationActor", "ray::_AutoscalingCoordinatorActor")

# Scans at these seconds after the start, then every EVERY_S: Ray starts its daemons with the instance, the
# dashboard's actors once the run registers, and a restart's stand-ins later.
SCHEDULE_S = (0.0, 1.0, 3.0, 6.0, 12.0, 25.0)
EVERY_S = 30.0
# After `soon()`: actors being created now start their processes within these seconds, and spend them importing
# Ray (about a second of CPU each): lowered at once, that CPU comes from what the ranks leave.
SOON_S = (0.1, 0.3, 0.6, 1.0, 2.0, 4.0)
_wake = threading.Event()


def yields(argv: list[str]) -> bool:
    """Whether a process with this command line is one that yields to the training."""
    if not argv:
        return False
    first = argv[0]
    if first.startswith(YIELDING_TITLES + NICED_TITLES):
        return True
    if os.path.basename(first.split()[0]) in YIELDING_EXECUTABLES:
        return True
    return "python" in os.path.basename(first) and any(a.endswith(YIELDING_SCRIPTS) for a in argv[1:3])


def niced_only(argv: list[str]) -> bool:
    """The GCS answers the raylets' health checks: starved by busy ranks, it would have Ray declare the node dead; Ray
    Train's controller and helpers answer the workers (NICED_TITLES). They run at the lowest niceness, not at idle
    priority."""
    return bool(argv) and (os.path.basename(argv[0].split()[0]) == "gcs_server" or argv[0].startswith(NICED_TITLES))


def lower_beside_training(root: int, done: set[int]) -> int:
    """Lower every yielding descendant of `root` not in `done` (then added to it); how many were lowered."""
    import psutil  # here: the ranks import this module for their priority, and need none of psutil

    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return 0
    lowered = 0
    for child in children:
        if child.pid in done:
            continue
        try:
            # Checked at every scan until it yields: an idle Ray worker takes its actor's title when it becomes one.
            argv = child.cmdline()
            if yields(argv):
                os.setpriority(os.PRIO_PROCESS, child.pid, LOWEST)
                if not niced_only(argv):
                    # A SCHED_IDLE task gives the core up at once when a rank wakes, where a niced one may first
                    # finish its time slice (milliseconds, at every collective).
                    os.sched_setscheduler(child.pid, os.SCHED_IDLE, os.sched_param(0))
                done.add(child.pid)
                lowered += 1
        except (psutil.Error, OSError):
            continue
    return lowered


def raylet_niceness() -> int:
    """The niceness of this node's raylet (RAY_RAYLET_PID, which Ray sets in its workers): the priority srun would
    have given a rank there. 0 where it cannot be read."""
    try:
        return os.getpriority(os.PRIO_PROCESS, int(os.environ.get("RAY_RAYLET_PID", "0")))
    except (OSError, ValueError):
        return 0


def match_raylet_priority() -> None:
    """Give this Ray worker its raylet's priority where Ray started it lower: Ray's niceness 15 on a cluster started
    without RAY_worker_niceness=0 (docs/dev/decisions/workers-at-the-callers-priority.md). Raising a priority needs
    root or RLIMIT_NICE; without them the worker keeps Ray's."""
    target = raylet_niceness()
    if os.getpriority(os.PRIO_PROCESS, 0) > target:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, target)
        except OSError:
            pass


def idle_runtime_env() -> dict[str, str]:
    """A runtime_env whose Ray worker runs at idle priority from its start: its interpreter under `chrt --idle` and
    `nice` (Ray execs `py_executable` as a shell command), so that the second of CPU it spends importing Ray comes from
    what the ranks leave, which a scan can only give it once it has its title. For actors that never start a training
    process (a child inherits its parent's priority). Empty where chrt or nice is missing."""
    chrt, nice = shutil.which("chrt"), shutil.which("nice")
    if not chrt or not nice:
        return {}
    return {"py_executable": shlex.join([chrt, "--idle", "0", nice, "-n", str(LOWEST), sys.executable])}


def start(root: int | None = None) -> None:
    """Lower the yielding processes of the embedded instance this process started, now and as they appear, in a
    daemon thread (it ends with the process)."""
    root = root or os.getpid()
    done: set[int] = set()
    _wake.clear()

    def scan() -> None:
        waited = 0.0
        for at in SCHEDULE_S:
            if _wake.wait(at - waited):
                burst(root, done)
            waited = at
            lower_beside_training(root, done)
        while True:
            if _wake.wait(EVERY_S):
                burst(root, done)
            lower_beside_training(root, done)

    threading.Thread(target=scan, name="raydist-yield", daemon=True).start()


def burst(root: int, done: set[int]) -> None:
    _wake.clear()
    waited = 0.0
    for at in SOON_S:
        time.sleep(at - waited)
        waited = at
        lower_beside_training(root, done)


def soon() -> None:
    """Actors that yield are being created (the dashboard's registration): scan for them often for a few seconds.
    Does nothing where `start` was not called (no embedded instance)."""
    _wake.set()
