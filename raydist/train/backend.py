"""Ray Train's torch backend as the loop strategies use it: quiet when a worker group with a dead worker is shut
down."""

from __future__ import annotations

from ray.exceptions import RayActorError, RayTaskError
from ray.train.torch import TorchConfig
from ray.train.torch.config import _TorchBackend


class QuietShutdown:
    """A worker group that holds a dead worker cannot shut its process group down gracefully; Ray Train logs that,
    with a traceback, on the user's console at every restart. raydist says in one line what happened instead."""

    def on_shutdown(self, worker_group, backend_config) -> None:
        try:
            super().on_shutdown(worker_group, backend_config)
        except (RayActorError, RayTaskError):
            pass


class _Backend(QuietShutdown, _TorchBackend):
    pass


class QuietTorchConfig(TorchConfig):
    @property
    def backend_cls(self):
        return _Backend
