"""The launcher's environment contract: what each rank's process gets, as torchrun and srun would give it.

Pure functions, no Ray: `assign_ranks` turns where Ray placed the processes into ranks (each node's ranks together,
nodes in hostname order, as srun's block distribution and torchrun number them); `rank_environment` is the
variables one rank gets; `inherited` is what it keeps of the Ray worker's own environment; `exported` is what it
gets of the caller's (the shell that ran `raydist launch`), as srun's `--export` says; `merged` puts them together.
docs/launch.md has the table.

Both launchers' variables are set, consistent with each other, so a script or framework that looks for either
finds one coherent launcher. A Ray worker inherits the environment of the `srun ... ray start` step that started
its node; that step's task variables (SLURM_PROCID=0 on every node, SLURM_STEP_*, ...) describe another task and
are never passed on. What describes the node or the allocation (the node's NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME
chosen at bring-up, SLURM_JOB_ID, SLURMD_NODENAME) is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Allocation-wide SLURM variables: true of every process of the job, kept as inherited.
JOB_LEVEL_SLURM = frozenset(
    {
        "SLURM_JOB_ID",
        "SLURM_JOBID",
        "SLURM_JOB_NAME",
        "SLURM_JOB_USER",
        "SLURM_JOB_UID",
        "SLURM_JOB_GID",
        "SLURM_JOB_ACCOUNT",
        "SLURM_JOB_PARTITION",
        "SLURM_JOB_QOS",
        "SLURM_CLUSTER_NAME",
        "SLURM_SUBMIT_DIR",
        "SLURM_SUBMIT_HOST",
        "SLURM_CONF",
        "SLURM_RESTART_COUNT",
        "SLURM_JOB_START_TIME",
        "SLURM_JOB_END_TIME",
        "SLURMD_NODENAME",
    }
)
# Set by Ray for its own worker process, or by Ray's runtime_env for it: not the script's.
RAY_WORKER_ONLY = frozenset(
    {
        "RAY_JOB_ID",
        "RAY_RAYLET_PID",
        "RAY_CLIENT_MODE",
        "RAY_JOB_CONFIG_JSON_ENV_VAR",
        "RAY_WORKER_MODE",
        "RAY_LD_PRELOAD",
    }
)
# Torch launcher variables of an enclosing launcher (a driver started under torchrun): replaced, never mixed.
TORCH_LAUNCHER = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_USE_AGENT_STORE",
        "TORCHELASTIC_ERROR_FILE",
        "TORCHELASTIC_ENABLE_FILE_TIMER",
        "CUDA_VISIBLE_DEVICES",
    }
)


RAYDIST_SETTINGS = frozenset({"TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S"})
"""What raydist sets in its own process for its Ray Train workers (raydist.driver.session.prepare_ray_environment), which
the embedded instance's processes inherit: not taken from the node (a caller's own value is exported as any other)."""
RAYDIST_PLUMBING = frozenset({"RAYDIST_WARM_SOCKET", "RAYDIST_WARM_EXEC"})
"""Where a node's warm interpreter listens (set by the SLURM bring-up, and in a client's shell): never a script's."""
CALLER_PROCESS = frozenset(
    {
        "HOSTNAME",
        "HOST",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
        "SSH_CLIENT",
        "SSH_CONNECTION",
        "SSH_TTY",
        "SSH_AUTH_SOCK",
        "TMUX",
        "TMUX_PANE",
        "STY",
        "WINDOW",
        "XDG_SESSION_ID",
        "RAYDIST_RESULT_FILE",
    }
)
"""What describes the caller's own process or host (its shell, terminal, login): never exported to the ranks. srun
would pass HOSTNAME and the like on too, and a script reading them would see the login node's."""
NODE_FIRST = frozenset({"TMPDIR", "XDG_RUNTIME_DIR", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"})
NODE_FIRST_PREFIXES = ("RAY_", "RAYDIST_")
"""Where the node has its own value, it wins over the caller's: its temp dir, the interface its bring-up chose
(the caller's NIC name may not exist on the node: the hang raydist replaces), its Ray's settings (auth token path,
addresses). The caller's is passed on where the node has none."""
CONTRACT = TORCH_LAUNCHER | {
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_NNODES",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NUM_NODES",
    "SLURM_JOB_NUM_NODES",
    "SLURM_TASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_STEP_NODELIST",
    "RAYDIST_STATUS_FILE",
    "TORCHELASTIC_ERROR_FILE",
}
"""The launcher's own variables (rank_environment and the agent's): set by raydist for each rank, not settable by
--env or --export (a rank that is told another RANK would not meet its peers)."""


def _launcher_owned(key: str) -> bool:
    """Another launcher's or step's variables: an enclosing torchrun's, the SLURM task's, Ray's worker's, and
    raydist's own plumbing."""
    return (
        (key.startswith(("SLURM_", "SLURMD_")) and key not in JOB_LEVEL_SLURM)
        or key in RAY_WORKER_ONLY
        or key in TORCH_LAUNCHER
        or key.startswith("PMI_")
        or key in RAYDIST_PLUMBING
    )


@dataclass(frozen=True)
class Export:
    """srun's --export: everything of the caller's (`all`), and/or the named variables, each with its caller's
    value (None) or a value given here."""

    all: bool = True
    named: tuple[tuple[str, str | None], ...] = ()

    @classmethod
    def parse(cls, spec: str) -> Export:
        """'ALL', 'NONE', or '[ALL,]NAME[=VALUE][,...]' as srun spells it. ValueError names what is wrong."""
        parts = [p for p in spec.split(",") if p.strip()] if spec.strip() else ["NONE"]
        if [p.strip().upper() for p in parts] == ["NONE"]:
            return cls(all=False)
        everything = parts[0].strip().upper() == "ALL"
        named = []
        for part in parts[1:] if everything else parts:
            name, sep, value = part.partition("=")
            name = name.strip()
            check_variable_name(name)
            named.append((name, value if sep else None))
        return cls(all=everything, named=tuple(named))


def check_variable_name(name: str) -> None:
    """ValueError unless `name` is a variable a user may set for the ranks."""
    if name.upper() in ("ALL", "NONE"):
        raise ValueError(f"{name} may only come first (ALL) or alone (NONE)")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"{name!r} is not an environment variable name")
    if name in CONTRACT:
        raise ValueError(f"{name} is set by raydist launch for each rank (docs/launch.md), not by you")


def exported(caller: dict[str, str], export: Export) -> dict[str, str]:
    """What the ranks get of the caller's whole environment: with ALL, all of it less its own process's and
    other launchers' variables; nothing with NONE or only names. No SLURM variable: the allocation's come from
    the node (the caller may be outside it, or in another one)."""
    if not export.all:
        return {}
    return {
        k: v
        for k, v in caller.items()
        if k not in CALLER_PROCESS and not _launcher_owned(k) and not k.startswith(("SLURM_", "SLURMD_"))
    }


def given(caller: dict[str, str], export: Export, env: dict[str, str]) -> dict[str, str]:
    """What the user named: --export NAME (the caller's value, where it has one), --export NAME=VALUE, then --env
    KEY=VALUE. These win over the node's own values too."""
    out = {
        name: caller[name] if value is None else value
        for name, value in export.named
        if value is not None or name in caller
    }
    return {**out, **env}


@dataclass(frozen=True)
class RankEnv:
    """What every rank gets of the caller's environment (`merged` puts it together with the node's on the rank's
    node): its exported variables, and those the user named (--env, --export NAME)."""

    caller: dict[str, str]
    named: dict[str, str]

    @classmethod
    def of(cls, caller: dict[str, str], export: str, env: dict[str, str]) -> RankEnv:
        """From the caller's environment and the run's `export` and `env` settings."""
        spec = Export.parse(export)
        return cls(exported(caller, spec), given(caller, spec, env))


@dataclass(frozen=True)
class Place:
    """Where Ray put one of the run's processes (one per Ray actor)."""

    node_id: str
    hostname: str
    ip: str
    gpu_ids: tuple[int, ...] = ()
    iface: str = ""  # the node's interface as bring-up chose it (GLOO_SOCKET_IFNAME of its Ray), '' if none


@dataclass(frozen=True)
class Slot:
    """One rank: its place and its numbers."""

    rank: int
    local_rank: int
    node_rank: int
    local_world_size: int
    place: Place


def assign_ranks(places: list[Place]) -> list[Slot]:
    """places[i] is where process i runs; returns process i's slot. Nodes are numbered in hostname order and a
    node's processes get consecutive ranks (block distribution), so rank 0 is on the first node."""
    nodes = sorted({(p.hostname, p.node_id) for p in places})
    by_node: dict[str, list[int]] = {node_id: [] for _, node_id in nodes}
    for i, p in enumerate(places):
        by_node[p.node_id].append(i)
    slots: list[Slot | None] = [None] * len(places)
    rank = 0
    for node_rank, (_, node_id) in enumerate(nodes):
        members = by_node[node_id]
        for local_rank, i in enumerate(members):
            slots[i] = Slot(rank, local_rank, node_rank, len(members), places[i])
            rank += 1
    return [s for s in slots if s is not None]


def tasks_per_node(slots: list[Slot]) -> str:
    """SLURM's compressed count list: '2(x3)' for three nodes of two, '2(x2),1' when the last has one."""
    counts = [s.local_world_size for s in sorted(slots, key=lambda s: s.rank) if s.local_rank == 0]
    parts: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        parts.append(f"{counts[i]}(x{j - i})" if j - i > 1 else str(counts[i]))
        i = j
    return ",".join(parts)


@dataclass(frozen=True)
class Group:
    """What every rank of one start of the group shares."""

    slots: tuple[Slot, ...]
    master_addr: str
    master_port: int
    run_id: str
    restart_count: int
    max_restarts: int
    job_name: str
    cpus_per_task: float

    @property
    def world_size(self) -> int:
        return len(self.slots)

    def hostnames(self) -> list[str]:
        return [s.place.hostname for s in sorted(self.slots, key=lambda s: s.rank) if s.local_rank == 0]


def visible_devices(slot: Slot, group: Group) -> str | None:
    """CUDA_VISIBLE_DEVICES: the GPUs of the node's ranks in local-rank order, so that device LOCAL_RANK is this
    rank's own GPU (what torchrun scripts select) and, with one GPU per node, device 0 is (what srun scripts
    use). None where the ranks have no GPUs."""
    if not slot.place.gpu_ids:
        return None
    mates = sorted((s for s in group.slots if s.place.node_id == slot.place.node_id), key=lambda s: s.local_rank)
    ids = [g for s in mates for g in s.place.gpu_ids[:1]]
    return ",".join(map(str, ids))


def rank_environment(slot: Slot, group: Group) -> dict[str, str]:
    """The launcher variables of one rank: torchrun's and srun's, describing the same ranks."""
    W, nodes = group.world_size, group.hostnames()
    env = {
        # torchrun (torch.distributed.elastic) names
        "RANK": slot.rank,
        "LOCAL_RANK": slot.local_rank,
        "WORLD_SIZE": W,
        "LOCAL_WORLD_SIZE": slot.local_world_size,
        "GROUP_RANK": slot.node_rank,
        "GROUP_WORLD_SIZE": len(nodes),
        "ROLE_RANK": slot.rank,
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": W,
        "MASTER_ADDR": group.master_addr,
        "MASTER_PORT": group.master_port,
        "TORCHELASTIC_RUN_ID": group.run_id,
        "TORCHELASTIC_RESTART_COUNT": group.restart_count,
        "TORCHELASTIC_MAX_RESTARTS": group.max_restarts,
        # srun's task names, for the same ranks
        "SLURM_PROCID": slot.rank,
        "SLURM_LOCALID": slot.local_rank,
        "SLURM_NODEID": slot.node_rank,
        "SLURM_NTASKS": W,
        "SLURM_NPROCS": W,
        "SLURM_NNODES": len(nodes),
        "SLURM_JOB_NUM_NODES": len(nodes),
        "SLURM_STEP_NUM_TASKS": W,
        "SLURM_STEP_NUM_NODES": len(nodes),
        "SLURM_TASKS_PER_NODE": tasks_per_node(list(group.slots)),
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node(list(group.slots)),
        "SLURM_NODELIST": ",".join(nodes),
        "SLURM_JOB_NODELIST": ",".join(nodes),
        "SLURM_STEP_NODELIST": ",".join(nodes),
        "SLURM_CPUS_PER_TASK": max(1, int(group.cpus_per_task)),
        "SLURM_JOB_NAME": group.job_name,
    }
    counts = {s.local_world_size for s in group.slots}
    if len(counts) == 1:  # srun sets it only for an even layout; Lightning needs it when SLURM_NTASKS > 1
        env["SLURM_NTASKS_PER_NODE"] = counts.pop()
    devices = visible_devices(slot, group)
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    return {k: str(v) for k, v in env.items()}


def inherited(env: dict[str, str]) -> dict[str, str]:
    """What a rank keeps of its Ray worker's environment: everything but the SLURM task variables of the step
    that started Ray, Ray's worker-only variables and an enclosing launcher's variables."""
    return {key: value for key, value in env.items() if not _launcher_owned(key) and key not in RAYDIST_SETTINGS}


def merged(
    worker_env: dict[str, str],
    launcher_env: dict[str, str],
    caller_env: dict[str, str] | None = None,
    named: dict[str, str] | None = None,
) -> dict[str, str]:
    """The whole environment of one rank's process, later winning: what it keeps of its Ray worker's (the node's),
    the caller's as exported (`exported`; the node's own temp dir, interface and Ray settings stay the node's),
    the values the user gave by name (--env, --export NAME=VALUE), then the launcher's. A job name the allocation
    has stays (Lightning reads 'bash'/'interactive' from it)."""
    node = inherited(worker_env)
    caller = {
        k: v
        for k, v in (caller_env or {}).items()
        if not (k in node and (k in NODE_FIRST or k.startswith(NODE_FIRST_PREFIXES)))
    }
    env = {**node, **caller, **(named or {}), **launcher_env}
    if "SLURM_JOB_NAME" in worker_env:
        env["SLURM_JOB_NAME"] = worker_env["SLURM_JOB_NAME"]
    return env


def script_environment(worker_env: dict[str, str], slot: Slot, group: Group) -> dict[str, str]:
    return merged(worker_env, rank_environment(slot, group))
