"""SLURM node lists and the allocation as a job step sees it (job id, nodes, this node, its CPUs and GPUs)."""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import shutil
import subprocess
from collections.abc import Mapping

from raydist.errors import RaydistError

_BRACKET = re.compile(r"\[([^\]]*)\]")


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets: 'a[1,3],b' -> ['a[1,3]', 'b']."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise RaydistError(f"bad SLURM hostlist {text!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise RaydistError(f"bad SLURM hostlist {text!r}: unbalanced '['")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _expand_range(spec: str, hostlist: str) -> list[str]:
    out = []
    for item in spec.split(","):
        lo, sep, hi = item.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise RaydistError(f"bad SLURM hostlist {hostlist!r}: cannot read range {item!r}")
        if not sep:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise RaydistError(f"bad SLURM hostlist {hostlist!r}: range {item!r} runs backwards")
        # Zero padding follows the lower bound, as in SLURM: node[08-10] -> node08 node09 node10.
        width = len(lo) if lo.startswith("0") else 0
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out


def expand_hostlist(hostlist: str) -> list[str]:
    """SLURM's compressed hostlist, expanded in order: 'master-node,node[01-02]' -> 3 names."""
    names: list[str] = []
    for part in _split_top_level(hostlist):
        pieces = _BRACKET.split(part)  # literal, range, literal, range, ..., literal
        choices = [[p] if i % 2 == 0 else _expand_range(p, hostlist) for i, p in enumerate(pieces)]
        names.extend("".join(combo) for combo in itertools.product(*choices))
    seen: set[str] = set()
    return [n for n in names if not (n in seen or seen.add(n))]


def hostnames(nodelist: str) -> list[str]:
    """Node names of a SLURM nodelist: `scontrol show hostnames` where SLURM is, this module's parser elsewhere."""
    if shutil.which("scontrol"):
        r = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.split():
            return r.stdout.split()
    return expand_hostlist(nodelist)


def _count_devices(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.strip()
    if value in ("", "NoDevFiles"):
        return 0
    return len([v for v in value.split(",") if v.strip()])


def gpus_from_env(env: Mapping[str, str]) -> int:
    """GPUs this step may use: what SLURM made visible, not what the node has (another job may own the rest)."""
    for key in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        n = _count_devices(env.get(key))
        if n is not None:
            return n
    for key in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        value = env.get(key, "").split(":")[-1]  # SLURM_GPUS_PER_NODE may read 'a100:2'
        if value.isdigit():
            return int(value)
    return 0


def cpus_from_env(env: Mapping[str, str]) -> int:
    """CPUs this task may use: --cpus-per-task if given, else the CPUs SLURM gave the job on this node."""
    for key in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
        value = env.get(key, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class Allocation:
    """What a process inside a SLURM job knows about the job."""

    job_id: int
    nodes: tuple[str, ...]
    this_node: str
    cpus: int
    gpus: int
    submit_host: str
    user: str

    @property
    def head(self) -> str:
        return self.nodes[0]

    @property
    def workers(self) -> tuple[str, ...]:
        return self.nodes[1:]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, expand=hostnames) -> Allocation:
        env = os.environ if env is None else env
        job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not job_id or not nodelist:
            raise RaydistError(
                "not inside a SLURM job (SLURM_JOB_ID / SLURM_JOB_NODELIST unset): "
                "run this from cluster/ray_up.slurm via sbatch"
            )
        if not job_id.isdigit():
            raise RaydistError(f"SLURM_JOB_ID is not a number: {job_id!r}")
        nodes = tuple(expand(nodelist))
        this = env.get("SLURMD_NODENAME") or os.uname().nodename
        return cls(
            job_id=int(job_id),
            nodes=nodes,
            this_node=this,
            cpus=cpus_from_env(env),
            gpus=gpus_from_env(env),
            submit_host=env.get("SLURM_SUBMIT_HOST", ""),
            user=env.get("SLURM_JOB_USER") or env.get("USER") or "",
        )
