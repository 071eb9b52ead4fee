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


def _pickle_torch_version_as_str() -> None:
    """In a worker: `torch.__version__` (a TorchVersion, a str subclass) pickles as a plain str from now on."""
    import copyreg

    from torch.torch_version import TorchVersion

    copyreg.pickle(TorchVersion, lambda v: (str, (str(v),)))


class PlainVersions:
    """Ray Train 2.60 sends rank 0's `torch.__version__` to its controller and state actor (the run's framework
    versions). Unpickling a TorchVersion imports torch: the state actor, which needs no torch, spent 2.5 s of CPU on
    it while the workers started (seen in its `-X importtime` log) and held 380 MB. Registered on the workers
    before Ray Train asks (its backend callback runs before its state callback), the version arrives as a str."""

    def on_start(self, worker_group, backend_config) -> None:
        worker_group.execute(_pickle_torch_version_as_str)
        super().on_start(worker_group, backend_config)


class _Backend(PlainVersions, QuietShutdown, _TorchBackend):
    pass


class QuietTorchConfig(TorchConfig):
    @property
    def backend_cls(self):
        return _Backend
