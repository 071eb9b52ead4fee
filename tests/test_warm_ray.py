"""Ray's own worker processes forked by the warm interpreter (raydist.warm.worker_exec, scaling.warm_python): on
the embedded instance every actor of a job (Ray Train's controller, helpers and workers alike) is forked by the
job's server under the warm interpreter, with torch imported, and set up without Ray's setup_worker.py; a worker
whose settings differ from that server's starts the cold way and works the same; a killed forked worker is seen
dead by Ray; Ray starts no default workers ahead for such a job, which could not use them (warm.NO_PRESTART).

One driver process per test, as a user's job is one: the embedded instance it starts ends with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

from tests.support.jobutil import REPO, clean_env

pytestmark = pytest.mark.slow

DRIVER = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    import ray
    from raydist.driver.session import prepare_ray_environment, start_local

    ray_set_up = set()  # Ray's own setup_worker.py processes (a fresh interpreter importing Ray, per worker)

    def parent(pid):
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])

    def started_by_raylet(matches):  # this instance's only (its raylet is this driver's child), not other tests' Ray
        found = set()
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if matches(f.read().split(b"\\0")) and parent(parent(pid)) == os.getpid():
                        found.add(pid)
            except (OSError, ValueError, IndexError):
                continue
        return found

    def watch():
        while True:
            ray_set_up.update(started_by_raylet(lambda argv: len(argv) > 1 and argv[1].endswith(b"setup_worker.py")))
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    prepare_ray_environment()
    start_local(4, warm=sys.argv[1] == "warm")
    time.sleep(2)  # a driver's registration makes the raylet start its prestarted workers at once
    # Ray's default workers started before any task asked for one (each retitles itself ray::IDLE once it is up)
    ahead = len(started_by_raylet(lambda argv: argv[0].startswith(b"ray::IDLE") or b"default_worker.py" in argv[1:2]))

    @ray.remote(num_cpus=0)
    class Probe:
        def where(self):
            with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
                parent = f.read().replace(b"\\0", b" ").decode()
            torch = sys.modules.get("torch")
            return {"pid": os.getpid(), "parent": parent, "torch": torch is not None,
                    "ray_train": "ray.train" in sys.modules,
                    "threads": torch.get_num_threads() if torch else None,
                    "nice": os.getpriority(os.PRIO_PROCESS, 0),
                    "job": ray.get_runtime_context().get_job_id(), "dedup": os.environ.get("RAY_DEDUP_LOGS"),
                    "random_id": ray.ObjectRef.from_random().hex()}

    probes = [Probe.remote() for _ in range(3)]
    wheres = ray.get([p.where.remote() for p in probes])
    first = probes[0]
    # Another setting of Ray's read at its import than the job's server has (that server took the settings of the
    # job's first worker on the node, hence after the others): this one starts the cold way.
    other = Probe.options(runtime_env={"env_vars": {"RAY_DEDUP_LOGS": "0"}}).remote()
    out = {"first": wheres[0], "probes": wheres, "other": ray.get(other.where.remote()), "driver": os.getpid(),
           "driver_nice": os.getpriority(os.PRIO_PROCESS, 0),
           "ray_set_up": len(ray_set_up), "prestarted": ahead}
    os.kill(out["first"]["pid"], signal.SIGKILL)
    try:
        ray.get(first.where.remote(), timeout=60)
        out["killed"] = "answered"
    except ray.exceptions.RayActorError:
        out["killed"] = "dead"
    with open(sys.argv[2], "w") as f:  # a file, not stdout, which Ray's log thread shares
        json.dump(out, f)
""")


def _drive(mode: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        result = os.path.join(d, "result.json")
        proc = subprocess.run(
            [sys.executable, "-c", DRIVER, mode, result],
            cwd=REPO,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0 and os.path.exists(result), (proc.stdout[-2000:], proc.stderr[-3000:])
        with open(result) as f:
            return json.load(f) | {"stderr": proc.stderr}


def test_the_embedded_instance_forks_its_ray_workers_with_torch_imported():
    out = _drive("warm")
    first, other = out["first"], out["other"]
    # Forked by the job's server, a child of the warm interpreter: torch came with the fork.
    assert all("warm/server.py" in w["parent"] and w["torch"] for w in out["probes"]), out["probes"]
    # And Ray Train, which Ray Train's own actors import next (this Probe imports none of it).
    assert all(w["ray_train"] for w in out["probes"]), out["probes"]
    # With the one thread Ray gives a worker that holds one CPU or none, as torch imported after Ray set
    # OMP_NUM_THREADS would have: not one per CPU of the warm interpreter's (two workers would fight over them).
    assert first["threads"] == 1, first
    # At the driver's priority, as torchrun's and srun's ranks run at their caller's, forked or started cold: not at
    # the niceness 15 Ray gives its workers by default (RAY_worker_niceness), where any process at the caller's
    # priority beside them preempted the training (raydist.driver.session.prepare_ray_environment).
    assert {w["nice"] for w in [*out["probes"], other]} == {out["driver_nice"]}, out
    # Ray's IDs are random per process, forked or not: two workers that drew the same would send tasks under the
    # same IDs, and Ray Train's synchronization actor crashes on that (raydist.warm.rayjob.RAY_JOB_PRELOAD).
    assert len({w["random_id"] for w in out["probes"]}) == 3, out["probes"]
    assert first["job"] == other["job"]
    # Each worker's runtime_env set up by raydist.warm.worker_exec, without Ray's setup_worker.py (a fresh
    # interpreter importing Ray per worker, the "other" one's included): the instance runs it through
    # raydist.warm.ray_python.
    assert out["ray_set_up"] == 0, out
    # No default worker started ahead for the driver: this job's workers come from the warm interpreter, which
    # Ray's prestarted ones (one per CPU, without the job's runtime_env) could never serve (warm.NO_PRESTART).
    assert out["prestarted"] == 0, out
    # Its RAY_DEDUP_LOGS differs from the job server's, which Ray read at its import: a fresh Python instead,
    # named on the worker's stderr (Ray shows it on the driver's console).
    assert "warm/server.py" not in other["parent"] and not other["torch"] and other["dedup"] == "0", other
    assert "starts without the warm interpreter: RAY_DEDUP_LOGS differs" in out["stderr"], out["stderr"][-2000:]
    assert out["killed"] == "dead"
    # The warm interpreter's private directory (its socket) went with the driver.
    assert not [d for d in os.listdir(tempfile.gettempdir()) if d.startswith(f"raydist-warm-{out['driver']}-")]


@pytest.mark.long
def test_warm_python_off_starts_every_ray_worker_as_ray_does():
    out = _drive("cold")
    assert "warm/server.py" not in out["first"]["parent"] and not out["first"]["torch"], out["first"]
    assert "warm interpreter" not in out["stderr"], out["stderr"][-3000:]
    assert out["ray_set_up"] >= 4, out  # the job's runtime_env set up by Ray, as without raydist
    assert out["prestarted"] >= 1, out  # Ray's own default: workers started ahead, which cold jobs may use
