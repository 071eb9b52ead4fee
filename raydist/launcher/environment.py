"""The launcher's environment contract: what each rank's process gets, as torchrun and srun would give it.

Pure functions, no Ray: `assign_ranks` turns where Ray placed the processes into ranks (each node's ranks together,
nodes in hostname order, as srun's block distribution and torchrun number them); `rank_environment` is the
variables one rank gets; `inherited` is what it keeps of the Ray worker's own environment. docs/launch.md has the
table.

Both launchers' variables are set, consistent with each other, so a script or framework that looks for either
finds one coherent launcher. A Ray worker inherits the environment of the `srun ... ray start` step that started
its node; that step's task variables (SLURM_PROCID=0 on every node, SLURM_STEP_*, ...) describe another task and
are never passed on. What describes the node or the allocation (the node's NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME
chosen at bring-up, SLURM_JOB_ID, SLURMD_NODENAME) is.
"""

from __future__ import annotations

from dataclasses import dataclass

# Allocation-wide SLURM variables: true of every process of the job, kept as inherited.
JOB_LEVEL_SLURM = frozenset({
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_JOB_USER", "SLURM_JOB_UID", "SLURM_JOB_GID",
    "SLURM_JOB_ACCOUNT", "SLURM_JOB_PARTITION", "SLURM_JOB_QOS", "SLURM_CLUSTER_NAME", "SLURM_SUBMIT_DIR",
    "SLURM_SUBMIT_HOST", "SLURM_CONF", "SLURM_RESTART_COUNT", "SLURM_JOB_START_TIME", "SLURM_JOB_END_TIME",
    "SLURMD_NODENAME",
})
# Set by Ray for its own worker process, or by Ray's runtime_env for it: not the script's.
RAY_WORKER_ONLY = frozenset({"RAY_JOB_ID", "RAY_RAYLET_PID", "RAY_CLIENT_MODE", "RAY_JOB_CONFIG_JSON_ENV_VAR",
                             "RAY_WORKER_MODE", "RAY_LD_PRELOAD"})
# Torch launcher variables of an enclosing launcher (a driver started under torchrun): replaced, never mixed.
TORCH_LAUNCHER = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_ENABLE_FILE_TIMER", "CUDA_VISIBLE_DEVICES",
})


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
        "RANK": slot.rank, "LOCAL_RANK": slot.local_rank, "WORLD_SIZE": W,
        "LOCAL_WORLD_SIZE": slot.local_world_size, "GROUP_RANK": slot.node_rank, "GROUP_WORLD_SIZE": len(nodes),
        "ROLE_RANK": slot.rank, "ROLE_NAME": "default", "ROLE_WORLD_SIZE": W,
        "MASTER_ADDR": group.master_addr, "MASTER_PORT": group.master_port,
        "TORCHELASTIC_RUN_ID": group.run_id, "TORCHELASTIC_RESTART_COUNT": group.restart_count,
        "TORCHELASTIC_MAX_RESTARTS": group.max_restarts,
        # srun's task names, for the same ranks
        "SLURM_PROCID": slot.rank, "SLURM_LOCALID": slot.local_rank, "SLURM_NODEID": slot.node_rank,
        "SLURM_NTASKS": W, "SLURM_NPROCS": W, "SLURM_NNODES": len(nodes), "SLURM_JOB_NUM_NODES": len(nodes),
        "SLURM_STEP_NUM_TASKS": W, "SLURM_STEP_NUM_NODES": len(nodes),
        "SLURM_TASKS_PER_NODE": tasks_per_node(list(group.slots)),
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node(list(group.slots)),
        "SLURM_NODELIST": ",".join(nodes), "SLURM_JOB_NODELIST": ",".join(nodes),
        "SLURM_STEP_NODELIST": ",".join(nodes), "SLURM_CPUS_PER_TASK": max(1, int(group.cpus_per_task)),
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
    out = {}
    for key, value in env.items():
        if key.startswith(("SLURM_", "SLURMD_")) and key not in JOB_LEVEL_SLURM:
            continue
        if key in RAY_WORKER_ONLY or key in TORCH_LAUNCHER or key.startswith("PMI_"):
            continue
        out[key] = value
    return out


def merged(worker_env: dict[str, str], launcher_env: dict[str, str]) -> dict[str, str]:
    """The whole environment of one rank's process: what it keeps of its Ray worker's, then the launcher's. A job
    name the allocation has stays (Lightning reads 'bash'/'interactive' from it)."""
    env = {**inherited(worker_env), **launcher_env}
    if "SLURM_JOB_NAME" in worker_env:
        env["SLURM_JOB_NAME"] = worker_env["SLURM_JOB_NAME"]
    return env


def script_environment(worker_env: dict[str, str], slot: Slot, group: Group) -> dict[str, str]:
    return merged(worker_env, rank_environment(slot, group))
