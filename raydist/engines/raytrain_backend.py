"""Ray Train's torch backend as the loop strategies use it, without torch in Ray Train's controller.

Ray's own `TorchConfig` lives in a module that imports torch, and Ray Train unpickles the backend config in its
controller: 1.2 s of the controller's set-up, on the path to the first step (its `-X importtime` log), for a
process that never touches a tensor. `QuietTorchConfig` is the same configuration in a module without torch: the
controller orchestrates, and what needs torch runs on the workers, through Ray's own worker-side functions
(`ray.train.torch.config`), imported there. Only `init_method="env"`, the default, and gloo or NCCL: the backends
raydist offers. Quiet on the shutdown of a group with a dead worker, and with `torch.__version__` sent as a str.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.train.backend import Backend, BackendConfig

# Ray's TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S (raydist.driver.session sets it); Ray's default when unset.
SHUTDOWN_TIMEOUT_VAR, SHUTDOWN_TIMEOUT_DEFAULT_S = "TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S", 30


def driver_shutdown_timeout_s() -> int:
    """The driver's TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S, for the controller. Ray Train reads it in its controller
    but does not pass it on from the driver (it is not among the variables Ray Train V2 propagates): on a cluster the
    controller has its node's environment, and after a hung worker the run waited Ray's 30 s where the driver said 5."""
    try:
        return int(os.environ.get(SHUTDOWN_TIMEOUT_VAR, SHUTDOWN_TIMEOUT_DEFAULT_S))
    except ValueError:
        return SHUTDOWN_TIMEOUT_DEFAULT_S


class QuietShutdown:
    """A worker group that holds a dead worker cannot shut its process group down gracefully; Ray Train logs that,
    with a traceback, on the user's console at every restart. raydist says in one line what happened instead. The
    wait for the group to leave its process group is the driver's (`shutdown_timeout_s` of the backend config)."""

    def on_shutdown(self, worker_group, backend_config) -> None:
        timeout_s = getattr(backend_config, "shutdown_timeout_s", None)
        if timeout_s is not None:  # the controller is this run's own process: Ray's backends read the variable
            os.environ[SHUTDOWN_TIMEOUT_VAR] = str(timeout_s)
        try:
            super().on_shutdown(worker_group, backend_config)
        except (RayActorError, RayTaskError):
            pass


class QuietController:
    """Ray Train's controller logs a worker group it could not place or replace with a traceback on the user's
    console; raydist's driver says in one line what happens next (`quiet_controller_logs`). And at its start it
    trips over Ray Data's own deprecation (two lines of Ray's business; the embedded instance's processes skip it
    through PYTHONWARNINGS, a cluster's do not). The backend travels to the controller pickled, before the
    controller starts: unpickling it there quiets both."""

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_quiet_controller": True}  # a state at all, so that __setstate__ runs

    def __setstate__(self, state: dict) -> None:
        from raydist.driver.session import DEPRECATION_SKIPPED
        from raydist.observability.console import quiet_controller_logs

        state.pop("_quiet_controller", None)
        self.__dict__.update(state)
        quiet_controller_logs()
        warnings.filterwarnings("ignore", message=re.escape(DEPRECATION_SKIPPED))


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


# ---- on the workers: Ray's own torch set-up, imported there ----------------------------------------------------


def _address_and_port() -> tuple[str, int]:
    from raydist.private_api import get_address_and_port

    return get_address_and_port()


def _torch_environment(addr: str, port: int) -> None:
    """MASTER_ADDR/PORT, then what torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, ...), before the process group."""
    from raydist.private_api import set_torch_distributed_env_vars as _set_torch_distributed_env_vars

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
    _set_torch_distributed_env_vars()


def _init_process_group(backend: str, rank: int, world_size: int, timeout_s: int) -> None:
    from raydist.private_api import setup_torch_process_group as _setup_torch_process_group

    _setup_torch_process_group(
        backend=backend, world_rank=rank, world_size=world_size, init_method="env://", timeout_s=timeout_s
    )


def _shutdown(destroy_process_group: bool) -> None:
    from raydist.private_api import shutdown_torch as _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy_process_group)


# ---- in the controller --------------------------------------------------------------------------------------------


class _TorchBackend(Backend):
    """What Ray's `_TorchBackend` does for a Ray Train V2 worker group, gloo or NCCL, `env://`."""

    def on_start(self, worker_group, backend_config: QuietTorchConfig) -> None:
        backend = backend_config.backend or (
            "nccl" if worker_group.get_resources_per_worker().get("GPU", 0) > 0 else "gloo"
        )
        addr, port = worker_group.execute_single(0, _address_and_port)
        worker_group.execute(_torch_environment, addr, port)
        n = len(worker_group)
        ray.get(
            [
                worker_group.execute_single_async(i, _init_process_group, backend, i, n, backend_config.timeout_s)
                for i in range(n)
            ]
        )

    def on_shutdown(self, worker_group, backend_config) -> None:
        futures = worker_group.execute_async(_shutdown, len(worker_group) > 1)
        try:
            ray.get(futures, timeout=int(os.environ.get(SHUTDOWN_TIMEOUT_VAR, SHUTDOWN_TIMEOUT_DEFAULT_S)))
        except GetTimeoutError:
            pass  # as Ray's: the group is torn down either way


class _Backend(QuietController, PlainVersions, QuietShutdown, _TorchBackend):
    pass


class CudaDeviceContext:
    """Ray's `TorchConfigContextManager` (the worker's default CUDA device), entered on each worker around the training
    function; defined here, without torch, so that the driver that pickles it imports none."""

    def __enter__(self):
        from ray.train.torch.config import TorchConfigContextManager

        TorchConfigContextManager().__enter__()

    def __exit__(self, *exc) -> bool:
        return False  # exceptions propagate, as with Ray's


@dataclass
class QuietTorchConfig(BackendConfig):
    """`ray.train.torch.TorchConfig` with `init_method="env"`, for raydist.engines.raytrain_trainer.torch_trainer(torch_config=...)."""

    backend: str | None = None
    timeout_s: int = 1800
    shutdown_timeout_s: int = field(default_factory=driver_shutdown_timeout_s)

    def to_dict(self) -> dict:
        # what the dashboard's run settings show, as for Ray's TorchConfig (the base class gives {})
        return {"backend": self.backend, "init_method": "env", "timeout_s": self.timeout_s}

    @property
    def backend_cls(self):
        return _Backend

    @property
    def train_func_context(self):
        # Read in the driver as `fit()` builds the workers' function, before the controller is asked for: Ray's own
        # context's module imports torch, which took the driver 1.8 s there.
        return CudaDeviceContext

    @property
    def framework(self):
        from raydist.private_api import TrainingFramework

        return TrainingFramework.TORCH
