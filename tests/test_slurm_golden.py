"""Golden files for what bring-up hands `ray start` on each node: its arguments (ray_start_command) and its
environment (ray_environment), rendered from fixed inputs and compared with tests/golden/ (as submitit does for
its sbatch text), so that any change to either shows up in review as a diff of these files.

After an intended change: RAYDIST_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_slurm_golden.py
rewrites the files; read their diff before committing it."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from raydist.slurm import netif, ports
from raydist.slurm.bringup import ray_environment, ray_start_command
from raydist.slurm.jobdir import Plan
from raydist.slurm.nodes import Allocation

GOLDEN = Path(__file__).with_name("golden")
UPDATE_ENV = "RAYDIST_UPDATE_GOLDEN"

# One three-node job; nothing comes from this machine (hostnames, addresses, environment, time).
JOB = 4242
NODES = ("gpu-head", "gpu01", "gpu02")
HEAD_IP = "10.20.0.1"
BLOCK = ports.PortBlock(21000, 400)  # what the batch step picked for the head (plan.block_start, block_size)
WORKER_BLOCK = ports.PortBlock(21400, 400)  # a worker's own pick: the same job's next block, its slot being busy
# What the user's shell passed down through sbatch and srun: ordinary variables, and stale Ray ones.
BASE_ENV = {
    "HOME": "/home/ana",
    "PATH": "/home/ana/venv/bin:/usr/bin:/bin",
    "SLURM_JOB_ID": str(JOB),
    "RAY_ADDRESS": "http://10.99.0.1:8265",
    "RAY_AUTH_TOKEN": "stale-token-of-another-cluster",
    "RAY_API_SERVER_ADDRESS": "http://10.99.0.1:8265",
    "TMPDIR": "/scratch/ana",
}


def plan(**changes) -> Plan:
    fields = dict(
        job_id=JOB,
        nodes=NODES,
        head="gpu-head",
        head_ip=HEAD_IP,
        head_iface="ib0",
        head_why="cluster config",
        block_start=BLOCK.start,
        block_size=BLOCK.size,
        dashboard_host=HEAD_IP,
        temp_dir=f"/tmp/raydist-{JOB}",
        token_path=f"/home/ana/.raydist/slurm/{JOB}/token",
        object_store_memory=None,
        login_host="login1",
        config_source="cluster/cluster.yaml",
    )
    fields.update(changes)
    return Plan(**fields)


def alloc(node: str, cpus: int, gpus: int) -> Allocation:
    return Allocation(job_id=JOB, nodes=NODES, this_node=node, cpus=cpus, gpus=gpus, submit_host="login1", user="ana")


def start_case(title: str, p: Plan, node: str, choice: netif.Choice, block: ports.PortBlock, a: Allocation) -> str:
    cmd = ray_start_command(p, node, choice, block, a)
    # The executable is the venv's `ray` next to this Python, else PATH's: a path of this machine, not compared.
    assert Path(cmd[0]).name == "ray", cmd[0]
    return "\n".join([f"# {title}", "ray", *cmd[1:]])


def render_start_head() -> str:
    head = netif.Choice("ib0", HEAD_IP, "cluster config")
    return (
        "\n\n".join(
            [
                start_case(
                    "head, CPUs only: Ray's default object store, the dashboard on the cluster address",
                    plan(),
                    "gpu-head",
                    head,
                    BLOCK,
                    alloc("gpu-head", cpus=16, gpus=0),
                ),
                start_case(
                    "head with 4 GPUs, a 2 GiB object store and the dashboard on every address",
                    plan(object_store_memory=2 * 2**30, dashboard_host="0.0.0.0"),
                    "gpu-head",
                    head,
                    BLOCK,
                    alloc("gpu-head", cpus=32, gpus=4),
                ),
            ]
        )
        + "\n"
    )


def render_start_worker() -> str:
    return (
        "\n\n".join(
            [
                start_case(
                    "worker, CPUs only, on the interface of its route to the head, in the head's block",
                    plan(),
                    "gpu01",
                    netif.Choice("eth1", "10.20.0.11", "route to gpu-head"),
                    BLOCK,
                    alloc("gpu01", cpus=16, gpus=0),
                ),
                start_case(
                    "worker with 8 GPUs and a 2 GiB object store, in a block of its own",
                    plan(object_store_memory=2 * 2**30),
                    "gpu02",
                    netif.Choice("ib0", "10.20.0.12", "cluster config"),
                    WORKER_BLOCK,
                    alloc("gpu02", cpus=64, gpus=8),
                ),
            ]
        )
        + "\n"
    )


def env_case(title: str, p: Plan, node: str, iface: str, base: dict[str, str]) -> str:
    env = ray_environment(p, node, iface, base=base)
    return "\n".join([f"# {title}", *(f"{k}={v}" for k, v in sorted(env.items()))])


def render_environment() -> str:
    return (
        "\n\n".join(
            [
                env_case(
                    "head on ib0; the shell's RAY_ADDRESS, RAY_AUTH_TOKEN and RAY_API_SERVER_ADDRESS are dropped",
                    plan(),
                    "gpu-head",
                    "ib0",
                    BASE_ENV,
                ),
                env_case(
                    "worker on eth1; the user's own RAY_metrics_report_interval_ms is kept",
                    plan(),
                    "gpu01",
                    "eth1",
                    {**BASE_ENV, "RAY_metrics_report_interval_ms": "10000"},
                ),
                env_case("worker from an empty environment", plan(), "gpu02", "ib0", {}),
            ]
        )
        + "\n"
    )


CASES = {
    "ray_start_head.txt": render_start_head,
    "ray_start_worker.txt": render_start_worker,
    "ray_environment.txt": render_environment,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendering_matches_the_golden_file(name):
    path = GOLDEN / name
    got = CASES[name]()
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(got)
        return
    if not path.is_file():
        pytest.fail(f"{path} is missing: run with {UPDATE_ENV}=1 to write it")
    want = path.read_text()
    if got != want:
        diff = "".join(
            difflib.unified_diff(
                want.splitlines(keepends=True),
                got.splitlines(keepends=True),
                fromfile=f"{path} (golden)",
                tofile=f"{name} (rendered now)",
            )
        )
        pytest.fail(
            f"the rendering differs from {path}; if the change is intended, rewrite it with "
            f"{UPDATE_ENV}=1 and review the file's diff:\n{diff}",
            pytrace=False,
        )


def test_the_renderings_do_not_depend_on_this_process_environment(monkeypatch):
    """The environment is built from the `base` given, never from this process's: the golden files hold on any
    machine, whatever its shell exports."""
    before = {name: render() for name, render in CASES.items()}
    monkeypatch.setenv("RAY_metrics_report_interval_ms", "1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("TMPDIR", "/elsewhere")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert {name: render() for name, render in CASES.items()} == before
