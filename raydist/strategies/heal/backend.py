"""Ray Train's torchft backend for the heal strategy's workers (it runs in Ray Train's controller)."""

from __future__ import annotations

from ray.train.v2.torch.torchft_config import TorchftConfig, _TorchftBackend

from raydist.config import Config
from raydist.train.backend import PlainVersions, QuietShutdown


class _Backend(PlainVersions, QuietShutdown, _TorchftBackend):
    def _maybe_create_lighthouse_actor(self, backend_config) -> str:
        """The lighthouse's address with this node's Ray address, not its host name (torchft's `address()`): on a
        SLURM node that is the interface raydist chose, and another node need not resolve the name. The lighthouse
        runs on this node (Ray places it beside the controller)."""
        import ray

        address = super()._maybe_create_lighthouse_actor(backend_config)
        scheme, _, rest = address.rpartition("//")
        port = rest.rsplit(":", 1)[1]
        return f"{scheme}//{_bracketed(ray.util.get_node_ip_address())}:{port}"


class HealTorchftConfig(TorchftConfig):
    @property
    def backend_cls(self):
        return _Backend


def torchft_config(cfg: Config) -> TorchftConfig:
    """One replica group per worker, each with a process group of its own; the lighthouse (torchft's quorum
    server) an actor on the node of Ray Train's controller. Ray 2.60 carries this backend but does not export it
    (ray/train/v2/torch/torchft_config.py). min_replicas=1: one survivor may go on alone; a dead replica leaves
    the quorum heal.heartbeat_timeout_s after its last heartbeat (torchft's default: 5 s)."""
    lighthouse = {"min_replicas": 1, "heartbeat_timeout_ms": max(1, round(cfg.heal.heartbeat_timeout_s * 1000))}
    return HealTorchftConfig(lighthouse_kwargs=lighthouse, backend=cfg.scaling.resolved_backend,
                             timeout_s=max(1, round(cfg.faults.collective_timeout_s)))


def _bracketed(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip
