"""Which processes of the embedded Ray instance yield the CPU to the training (raydist.driver.yielding), by the
titles Ray 2.58-2.60 gives them: never one that starts a training process, whose children would inherit it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from raydist.driver.yielding import LOWEST, idle_runtime_env, lower_beside_training, yields


@pytest.mark.parametrize(
    "argv",
    [
        ["ray::StandIn"],
        ["ray::TrainStateActor"],
        ["ray::DashboardAgent"],
        ["ray-dashboard-NodeHead-0 (/venv/bin/python -c ...)"],
        ["/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server", "--log_dir=/tmp/ray"],
        ["/venv/bin/python", "-u", "/venv/lib/python3.11/site-packages/ray/dashboard/dashboard.py", "--host=127.0.0.1"],
        ["/venv/bin/python", "-u", "/venv/lib/python3.11/site-packages/ray/_private/log_monitor.py", "--x"],
        ["/venv/bin/python", "-u", "/venv/lib/python3.11/site-packages/ray/autoscaler/_private/monitor.py"],
        ["ray::TrainController.run"],  # niced only: it drains the workers' reports every 0.1 s
        ["ray::SynchronizationActor"],
        ["ray::_AutoscalingCoordinatorActor"],
    ],
)
def test_rays_daemons_and_the_dashboards_actors_yield(argv):
    assert yields(argv)


@pytest.mark.parametrize(
    "argv",
    [
        [
            "/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet",
            "--raylet_socket_name=x",
        ],  # starts workers
        ["ray::IDLE"],  # may become a rank's agent or a training worker
        ["ray::RankAgent"],
        ["ray::RayTrainWorker"],
        ["/venv/bin/python", "train.py", "--epochs", "3"],  # a user's rank
        ["/venv/bin/python", "monitor.py"],  # a user's own script of that name
        [],
    ],
)
def test_what_starts_or_serves_training_keeps_its_priority(argv):
    assert not yields(argv)


def _titled(title: str) -> subprocess.Popen:
    """A child whose command line starts with `title`, as Ray's processes have their titles (exec -a)."""
    return subprocess.Popen(["bash", "-c", f"exec -a {title} {sys.executable} -c 'import time; time.sleep(30)'"])


def test_yielding_descendants_are_lowered_once_to_idle_priority_the_gcs_and_controller_only_niced_the_rest_left_alone():
    stand_in, gcs, controller = _titled("ray::StandIn"), _titled("gcs_server"), _titled("ray::TrainController")
    kept = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.5)  # each exec'd
        done: set[int] = set()
        assert lower_beside_training(os.getpid(), done) == 3 and done == {stand_in.pid, gcs.pid, controller.pid}
        assert {os.getpriority(os.PRIO_PROCESS, p.pid) for p in (stand_in, gcs, controller)} == {LOWEST}
        assert os.sched_getscheduler(stand_in.pid) == os.SCHED_IDLE
        # the GCS answers the raylets' health checks, the controller its workers' reports: niced, not idle
        assert os.sched_getscheduler(gcs.pid) == os.sched_getscheduler(controller.pid) == os.sched_getscheduler(0)
        assert os.getpriority(os.PRIO_PROCESS, kept.pid) == os.getpriority(os.PRIO_PROCESS, 0)
        assert os.sched_getscheduler(kept.pid) == os.sched_getscheduler(0)
        assert lower_beside_training(os.getpid(), done) == 0  # not again
    finally:
        for p in (stand_in, gcs, controller, kept):
            p.kill()
            p.wait()


def test_a_stand_ins_interpreter_runs_at_idle_priority_from_its_start():
    """raydist launch's stand-in actors start while the ranks train: Ray execs their runtime_env's `py_executable` as
    a shell command (ray/_private/runtime_env/context.py), and the interpreter it starts is idle before it imports
    anything."""
    command = idle_runtime_env()["py_executable"]
    probe = "import os; print(os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0), flush=True)"
    out = subprocess.run(["bash", "-c", f"exec {command} -c '{probe}'"], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(os.SCHED_IDLE), str(LOWEST)], out


def test_a_ray_worker_started_below_its_raylets_priority_takes_the_raylets():
    """Ray's niceness 15 on a cluster started without RAY_worker_niceness=0: a training worker takes its raylet's
    priority back where it may (root here), as srun would have started it."""
    script = (
        "import os\nos.setpriority(os.PRIO_PROCESS, 0, 15)\n"
        "from raydist.driver import yielding\nyielding.match_raylet_priority()\n"
        "print(os.getpriority(os.PRIO_PROCESS, 0))\n"
    )
    if os.geteuid() != 0:
        pytest.skip("raising a priority needs root (or RLIMIT_NICE)")
    raylet = subprocess.Popen(
        [sys.executable, "-c", "import os, time; os.nice(3); print('up', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert raylet.stdout.readline() == "up\n"
        env = {**os.environ, "RAY_RAYLET_PID": str(raylet.pid)}
        r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    finally:
        raylet.kill()
        raylet.wait()
    assert r.stdout.strip() == "3", r.stdout + r.stderr
