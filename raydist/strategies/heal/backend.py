"""Ray Train's torchft backend for the heal strategy's workers (it runs in Ray Train's controller)."""

from __future__ import annotations

from ray.exceptions import RayActorError, RayTaskError
from ray.train.v2.torch.torchft_config import TorchftConfig, _TorchftBackend

from raydist.config import Config


class _Backend(_TorchftBackend):
    def on_shutdown(self, worker_group, backend_config) -> None:
        # A replaced replica group holds the dead worker: its process group cannot be shut down gracefully, and Ray
        # would log that with a traceback on the user's console after every heal.
        try:
            super().on_shutdown(worker_group, backend_config)
        except (RayActorError, RayTaskError):
            pass


class HealTorchftConfig(TorchftConfig):
    @property
    def backend_cls(self):
        return _Backend


def torchft_config(cfg: Config) -> TorchftConfig:
    """One replica group per worker, each with a process group of its own; the lighthouse (torchft's quorum
    server) an actor on the node of Ray Train's controller. Ray 2.60 carries this backend but does not export it
    (ray/train/v2/torch/torchft_config.py). min_replicas=1: one survivor may go on alone."""
    return HealTorchftConfig(lighthouse_kwargs={"min_replicas": 1}, backend=cfg.scaling.resolved_backend,
                             timeout_s=max(1, round(cfg.faults.collective_timeout_s)))
