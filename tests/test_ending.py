"""How the embedded Ray instance ends once a job's result is safe (raydist.driver.ending): Ray's autoscaler monitor,
which otherwise used a whole second of every command's end, is told apart by the command line Ray 2.58-2.60 gives
it, and nothing of the instance is left when `end_local` returns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

from raydist.driver.ending import is_monitor

MONITOR = "/venv/lib/python3.11/site-packages/ray/autoscaler/_private/monitor.py"


@pytest.mark.parametrize(
    "argv",
    [
        ["/venv/bin/python", "-u", MONITOR, "--logs-dir=/tmp/ray/session_x/logs"],
        ["/usr/bin/python3.11", MONITOR],
    ],
)
def test_rays_autoscaler_monitor_is_recognised(argv):
    assert is_monitor(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["/venv/bin/python", "-u", "/venv/lib/python3.11/site-packages/ray/_private/log_monitor.py", "--x"],
        ["/venv/bin/python", "/venv/lib/python3.11/site-packages/ray/dashboard/dashboard.py"],
        ["/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server", "--log_dir=/tmp/ray"],
        ["python", "train.py", "--out", "runs/monitor.py"],  # a user's script, whatever its arguments
        ["ray::StandIn"],
        [],
    ],
)
def test_nothing_else_is_taken_for_the_monitor(argv):
    assert not is_monitor(argv)


@pytest.mark.slow
def test_ending_the_embedded_instance_kills_its_monitor_and_leaves_none_of_its_processes():
    code = textwrap.dedent(
        """
        import json, logging, sys, psutil, ray
        from raydist.driver.ending import end_local, is_monitor
        ray.init(num_cpus=1, include_dashboard=False, logging_level=logging.ERROR)
        children = psutil.Process().children()
        monitors = [c.pid for c in children if is_monitor(c.cmdline())]
        end_local()
        left = [c.pid for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        print(json.dumps({"monitors": monitors, "children": len(children), "left": left}))
        """
    )
    with tempfile.TemporaryDirectory(prefix="rd-end-", dir="/tmp") as tmp:  # Ray's socket paths must be short
        env = {**os.environ, "TMPDIR": tmp, "RAY_USAGE_STATS_ENABLED": "0"}
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(got["monitors"]) == 1 and got["children"] >= 3
    assert got["left"] == []
    assert "autoscaler failed" not in r.stderr  # a monitor told to stop would report its own end as a failure
