"""Drive cluster/ray_up.slurm on the emulated cluster: a test config, submit, wait for ready, find leftovers."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import yaml

from tests.support.cluster.emucluster import REPO, EmulatedCluster, shared_tmp_paths

DAEMONS = ("munged", "slurmd", "slurmctld", ": slurmscriptd")
SLURM_PORTS = {6817, 6818}
# For a bring-up whose nodes run no training (or a batch command that fails at once): no warm interpreter, whose
# torch import, per node and start, costs the 2-core suite more CPU than the rest of such a bring-up.
NO_TORCH = {"warm_python": False}


def write_config(cluster: EmulatedCluster, name: str, **changes) -> Path:
    """The shipped cluster/cluster.yaml with test-sized settings and `changes`, as a file every host sees."""
    data = yaml.safe_load((REPO / "cluster" / "cluster.yaml").read_text())
    data.update(
        object_store_memory="200MB",
        job_dir=str(cluster.shared / "jobs"),
        timeouts={"ready": 120, "head_reachable": 30, "teardown": 10},
    )
    data.update(changes)
    path = cluster.shared / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@dataclasses.dataclass
class RayUpJob:
    cluster: EmulatedCluster
    job_id: int
    config: Path
    output: Path
    submitted_at: float

    def text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    @property
    def job_dir(self) -> Path:
        return Path(yaml.safe_load(self.config.read_text())["job_dir"]) / str(self.job_id)

    def wait_for(self, needle: str, timeout: float) -> float:
        """Seconds since sbatch until `needle` shows in the job output; raises if the job ends first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text():
                return time.monotonic() - self.submitted_at
            state = self.cluster.job_state(self.job_id)
            if state not in ("PENDING", "RUNNING", "CONFIGURING"):
                if needle in self.text():
                    return time.monotonic() - self.submitted_at
                raise AssertionError(f"job {self.job_id} ended ({state}) before {needle!r}:\n{self.text()}")
            time.sleep(0.2)
        raise AssertionError(f"job {self.job_id}: no {needle!r} after {timeout:.0f}s:\n{self.text()}")

    def env(self, **extra: str) -> dict[str, str]:
        """A login-node shell after `eval "$(raydist env --job ID)"`."""
        conn = self.job_dir / "connection.env"
        values = dict(line.split("=", 1) for line in conn.read_text().splitlines() if line and not line.startswith("#"))
        values = {k: v.strip("'") for k, v in values.items()}
        return self.cluster.env(
            RAY_ADDRESS=values["RAY_ADDRESS"],
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN_PATH=values["RAY_AUTH_TOKEN_PATH"],
            RAYDIST_CONNECTION=str(conn),
            RAYDIST_CLUSTER_CONFIG=str(self.config),
            **extra,
        )


def submit(
    cluster: EmulatedCluster, config: Path, *sbatch_args: str, nodes: int = 3, command: tuple[str, ...] = ()
) -> RayUpJob:
    """sbatch cluster/ray_up.slurm (batch mode when `command` is given); output appended across requeues."""
    output = cluster.shared / "ray-up-%j.out"
    t = time.monotonic()
    job = cluster.sbatch(
        f"--output={output}",
        "--open-mode=append",
        f"--nodes={nodes}",
        *sbatch_args,
        "cluster/ray_up.slurm",
        *command,
        env=cluster.env(RAYDIST_CLUSTER_CONFIG=str(config)),
    )
    return RayUpJob(cluster, job, config, Path(str(output).replace("%j", str(job))), t)


# Where the repo is mounted into a host's private /tmp (when it lives under /tmp): not a leftover.
MOUNT_POINTS = {p.relative_to("/tmp").parts[0] for p in shared_tmp_paths()}
# torch's own compile cache (DDP imports torch._dynamo), left by a user's script run under plain srun
# (examples/srun_before.sbatch in tests/test_slurm_launch.py), as on any machine torch runs on: not raydist's.
TORCH_CACHES = ("torchinductor_",)


def leftovers(cluster: EmulatedCluster, job_id: int) -> dict[str, list[str]]:
    """Anything of job `job_id` still on a host: processes beyond the SLURM daemons, temp dirs, listening ports."""
    found: dict[str, list[str]] = {}
    for host in cluster.hosts:
        issues = [
            f"process {pid}: {args[:120]}" for pid, args in cluster.processes(host) if not args.startswith(DAEMONS)
        ]
        issues += [
            f"temp dir /tmp/{p.name}"
            for p in (cluster.host_dir(host) / "tmp").iterdir()
            if p.name not in MOUNT_POINTS and not p.name.startswith(TORCH_CACHES)
        ]
        issues += [f"port {p} listening" for p in sorted(cluster.listening_ports(host) - SLURM_PORTS)]
        if issues:
            found[host] = issues
    return found


def job_leftovers(cluster: EmulatedCluster, job_id: int) -> dict[str, list[str]]:
    """Only job `job_id`'s traces: processes tagged with its id, its temp dir."""
    probe = (
        "import glob,sys\nfor f in glob.glob('/proc/[0-9]*/environ'):\n"
        "    try: env=open(f,'rb').read().split(b'\\0')\n    except OSError: continue\n"
        f"    if any(e.startswith(b'RAYDIST_RAY_TAG={job_id}@') for e in env): print(f.split('/')[2])"
    )
    found: dict[str, list[str]] = {}
    for host in cluster.hosts:
        r = cluster.run(host, ["python3", "-c", probe], check=True)
        issues = [f"process {pid}" for pid in r.stdout.split()]
        if (cluster.host_dir(host) / "tmp" / f"raydist-{job_id}").exists():
            issues.append(f"temp dir /tmp/raydist-{job_id}")
        if issues:
            found[host] = issues
    return found


def wait_no_leftovers(cluster: EmulatedCluster, job_id: int, timeout: float = 40) -> dict[str, list[str]]:
    deadline = time.monotonic() + timeout
    while True:
        left = leftovers(cluster, job_id)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def memory_mib(cluster: EmulatedCluster) -> float:
    """Proportional set size of every process on every host (shared pages counted once), in MiB."""
    probe = (
        "import glob\nt=0\nfor f in glob.glob('/proc/[0-9]*/smaps_rollup'):\n"
        "    try: t+=sum(int(l.split()[1]) for l in open(f) if l.startswith('Pss:'))\n"
        "    except OSError: pass\nprint(t)"
    )
    total_kib = 0
    for host in cluster.hosts:
        r = cluster.run(host, ["python3", "-c", probe], check=True)
        total_kib += int(r.stdout.strip())
    return total_kib / 1024


def kill_node_ray(cluster: EmulatedCluster, host: str, job_id: int) -> None:
    """SIGKILL job `job_id`'s whole Ray on `host`, as a crash would. Again while any is left: a process forked
    while the list was taken (a raylet starting a worker) escapes one pass."""
    for _ in range(20):
        pids = tagged_pids(cluster, host, job_id)
        if not pids:
            return
        cluster.run(host, ["kill", "-9", *pids])  # some may be gone by now
    left = tagged_pids(cluster, host, job_id)
    raise AssertionError(f"job {job_id}'s Ray on {host} survived 20 rounds of SIGKILL: {left}")


def tagged_pids(cluster: EmulatedCluster, host: str, job_id: int) -> list[str]:
    """PIDs on `host` of job `job_id`'s Ray (tagged by bring-up): what killing that node's Ray means."""
    probe = (
        "import glob\nfor f in glob.glob('/proc/[0-9]*/environ'):\n"
        "    try: env=open(f,'rb').read().split(b'\\0')\n    except OSError: continue\n"
        f"    if any(e.startswith(b'RAYDIST_RAY_TAG={job_id}@') for e in env): print(f.split('/')[2])"
    )
    return cluster.run(host, ["python3", "-c", probe], check=True).stdout.split()


def job_json(stdout: str) -> dict:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{") and '"strategy"' in ln]
    assert lines, f"no JSON summary in:\n{stdout[-4000:]}"
    return json.loads(lines[-1])
