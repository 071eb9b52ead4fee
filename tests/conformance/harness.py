"""Run one conformance script the way each launcher runs it, and read its CONFORMANCE line: torchrun on this machine,
`raydist launch` (the embedded instance, or a cluster's Ray), and srun on the emulated SLURM hosts, each host picking
its interface in a `case` as hand-written sbatch scripts do (examples/srun_before.sbatch). Used by
tests/test_conformance.py (short) and benchmarks/conformance.py (the whole matrix)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BIN = Path(sys.executable).parent
SCRIPTS = {"ddp_slurm": [], "lightning_trainer": [], "hf_trainer": ["{work}/hf"], "fsdp2_dcp": ["{work}/snap"]}
"""Each script and its arguments ({work}: a directory of the run's own)."""


def script_argv(name: str, work: Path, python: str = "python") -> list[str]:
    return [python, str(HERE / f"{name}.py"), *(a.format(work=work) for a in SCRIPTS[name])]


def result(output: str) -> dict:
    """The script's CONFORMANCE line, parsed; AssertionError with the output's tail when there is none."""
    lines = [ln.split("CONFORMANCE ", 1)[1] for ln in output.splitlines() if "CONFORMANCE " in ln]
    assert lines, f"no CONFORMANCE line:\n{output[-3000:]}"
    return json.loads(lines[-1])


def same(a: dict, b: dict) -> bool:
    """Equal training: the same steps, loss (to the printed digits) and parameters' checksum."""
    return all(a[k] == b[k] for k in ("world", "steps", "loss", "checksum"))


EXIT_FAULT_SIGNS = (
    "every rank's script returned, but",  # raydist launch's exit fault (docs/launch.md)
    "Signal 6 (SIGABRT) received by PID",  # torchrun's line for a rank that aborted
    "terminate called without an active exception",
)  # gloo's teardown race, under any launcher
"""A rank that died on its way out after the script's last line: gloo's teardown race aborts a finished DDP
process now and then under torchrun and srun too (pytorch#107298). The training's result stands."""


def finished(returncode: int, output: str) -> dict:
    """The result of a run that completed its training: exit 0, or an exit fault after the CONFORMANCE line
    (`exit_fault` says which); AssertionError with the output's tail otherwise."""
    got = result(output)
    fault = returncode != 0 and any(sign in output for sign in EXIT_FAULT_SIGNS)
    assert returncode == 0 or fault, f"exit {returncode}:\n{output[-3000:]}"
    return {**got, "exit_fault": fault}


def torchrun(name: str, work: Path, n: int, env: dict[str, str], timeout: float = 300) -> dict:
    argv = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(n), *script_argv(name, work)[1:]]
    r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    return finished(r.returncode, r.stdout + r.stderr)


def launch_argv(name: str, work: Path, n: int, run: str, *options: str) -> list[str]:
    return [
        str(BIN / "raydist"),
        "launch",
        "--workers",
        str(n),
        "--name",
        run,
        "--storage",
        str(work / "runs"),
        *options,
        "--",
        *script_argv(name, work),
    ]


def srun_argv(name: str, work: Path, job_id: int, hosts: list, port: int) -> list[str]:
    """One `srun --overlap` step in the job, one task per host, each picking its interface and exporting torchrun's
    variables from srun's, as a hand-written sbatch script does."""
    cases = " ".join(f"{h.name}) IF={h.iface};;" for h in hosts)
    script = (
        f"case $(hostname) in {cases} esac; export GLOO_SOCKET_IFNAME=$IF NCCL_SOCKET_IFNAME=$IF "
        f"MASTER_ADDR={hosts[0].ip} MASTER_PORT={port} RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS "
        f"LOCAL_RANK=$SLURM_LOCALID LOCAL_WORLD_SIZE=1 OMP_NUM_THREADS=1; exec " + " ".join(script_argv(name, work))
    )
    # --job-name: a step started outside the batch shell is named after its program ("bash" here), which Lightning
    # takes for an interactive session and then ignores SLURM's variables; in a batch script it is the job's name.
    return [
        "srun",
        f"--jobid={job_id}",
        "--overlap",
        f"--nodes={len(hosts)}",
        "--ntasks-per-node=1",
        f"--job-name={name}",
        "bash",
        "-c",
        script,
    ]
