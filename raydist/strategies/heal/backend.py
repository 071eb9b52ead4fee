"""Ray Train's torchft backend for the heal strategy's workers (it runs in Ray Train's controller)."""

from __future__ import annotations

import os
import socket

import ray

from raydist.config import Config
from raydist.engines.raytrain_backend import PlainVersions, QuietController, QuietShutdown, driver_shutdown_timeout_s
from raydist.private_api import ReplicaGroup, TorchftConfig, torchft_backend_class

LIGHTHOUSE_LOG = "lighthouse.log"


class ReplicaNodeLost(RuntimeError):
    """A failed replica group's node is gone: Ray Train cannot replace the group in place."""


class _Backend(QuietController, PlainVersions, QuietShutdown, torchft_backend_class()):
    def on_shutdown(self, group, backend_config) -> None:
        """Ray Train shuts a failed replica group down right before it starts the replacement on the group's own
        slot, and waits for that worker without a limit: when the slot's node is gone and no other node has room,
        for ever. A node that is gone refuses the replacement here; Ray Train's controller then fails the run, and
        raydist starts it again on the workers that fit (an elastic range) or ends it naming the node
        (`raydist.engines.raytrain`)."""
        if isinstance(group, ReplicaGroup):
            lost = _dead_nodes_of(group)
            if lost:
                raise ReplicaNodeLost(
                    f"the failed replica's node {', '.join(lost)} is gone: it cannot be replaced in place"
                )
        super().on_shutdown(group, backend_config)

    def lighthouse_address(self, backend_config) -> str:
        """Ray's lighthouse (torchft's quorum server) on this node, as Ray's backend places it, but taking no CPU:
        Ray's asks for one, and where the workers hold every CPU of the controller's node (or it has none, as a
        head started with --num-cpus=0) it never starts. Its address has this node's Ray address, not its host
        name (torchft's `address()`): on a SLURM node that is the interface raydist chose, and another node need
        not resolve the name. Its log goes to the backend config's `log_path` (see `Lighthouse`)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self.lighthouse_actor is None:
            here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
            kwargs = {"bind": "[::]:0"} | backend_config.lighthouse_kwargs
            level = {"env_vars": {"RUST_LOG": backend_config.rust_log}}
            self.lighthouse_actor = LighthouseActor.options(
                num_cpus=0,
                scheduling_strategy=here,
                runtime_env=level,
            ).remote(lighthouse_kwargs=kwargs, log_path=backend_config.log_path)
        address = ray.get(self.lighthouse_actor.address.remote())  # read again: the actor may have restarted
        scheme, _, rest = address.rpartition("//")
        port = rest.rsplit(":", 1)[1]
        return f"{scheme}//{_bracketed(ray.util.get_node_ip_address())}:{port}"


class Lighthouse:
    """Ray's LighthouseServerActor (torchft's quorum server), with torchft's log in a file of its own. torchft logs
    to the process's stderr, which Ray copies to the driver's console: at its default level every quorum (ten a
    second per replica), and at every level the error "failed to send quorum channel closed" for each replica that
    leaves (a killed worker, a lost node), which raydist reports itself in one line. torchft knows no level "off"."""

    def __init__(self, lighthouse_kwargs: dict, log_path: str | None = None):
        if log_path:  # before torchft sets up its logging, on import
            try:
                fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            except OSError:  # a run directory this node cannot write: the log stays Ray's
                fd = None
            if fd is not None:
                os.dup2(fd, 2)
                os.close(fd)
        from torchft.coordination import LighthouseServer

        self.lighthouse = LighthouseServer(**lighthouse_kwargs)

    def address(self) -> str:
        return self.lighthouse.address()


LighthouseActor = ray.remote(Lighthouse)


class HealTorchftConfig(TorchftConfig):
    def __init__(self, lighthouse_kwargs, rust_log: str = "warn", log_path: str | None = None, **kwargs):
        super().__init__(lighthouse_kwargs, **kwargs)
        self.rust_log = rust_log
        """The lighthouse's RUST_LOG (torchft reads error, warn, info, debug or trace)."""
        self.log_path = log_path
        """Where the lighthouse's log goes (the run directory's lighthouse.log); None: to Ray, and so the console."""
        self.shutdown_timeout_s = driver_shutdown_timeout_s()
        """The driver's wait for a group to leave its process group (raydist.engines.raytrain_backend.QuietShutdown)."""

    @property
    def backend_cls(self):
        return _Backend


def torchft_config(cfg: Config) -> TorchftConfig:
    """One replica group per worker, each with a process group of its own; the lighthouse (torchft's quorum
    server) an actor on the node of Ray Train's controller. Ray 2.60 carries this backend but does not export it
    (ray/train/v2/torch/torchft_config.py). min_replicas=1: one survivor may go on alone; a dead replica leaves
    the quorum heal.heartbeat_timeout_s after its last heartbeat (torchft's default: 5 s)."""
    lighthouse = {"min_replicas": 1, "heartbeat_timeout_ms": max(1, round(cfg.heal.heartbeat_timeout_s * 1000))}
    # run.verbose: its log on the console, every quorum included; else warnings and errors in the run directory
    verbose = cfg.run.verbose
    return HealTorchftConfig(
        lighthouse_kwargs=lighthouse,
        rust_log="info" if verbose else "warn",
        log_path=None if verbose else os.path.join(cfg.run.run_dir, LIGHTHOUSE_LOG),
        backend=cfg.scaling.resolved_backend,
        timeout_s=max(1, round(cfg.faults.collective_timeout_s)),
    )


def _bracketed(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def _dead_nodes_of(group, probe_s: float = 2.0) -> list[str]:
    """Host names (with addresses) of the group's workers whose node is gone: Ray no longer counts it alive, or its
    raylet does not answer. Ray learns of a dead node only after several missed health checks (seconds), and a
    replacement sent to the node's slot in that time may never be placed, so the raylet is asked directly."""
    import ray

    nodes = {n["NodeID"]: n for n in ray.nodes()}
    lost = set()
    for w in group.get_workers():
        node = nodes.get(w.metadata.node_id)
        if (
            node is None
            or not node["Alive"]
            or not _answers(node["NodeManagerAddress"], node["NodeManagerPort"], probe_s)
        ):
            lost.add(f"{w.metadata.hostname} ({w.metadata.node_ip})")
    return sorted(lost)


def _answers(address: str, port: int, timeout_s: float) -> bool:
    try:
        socket.create_connection((address, port), timeout=timeout_s).close()
        return True
    except OSError:
        return False
