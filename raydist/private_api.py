"""Every use raydist makes of a private Ray or torch API, in one place, each with why no public API does the job
and the versions it was checked against. Nothing else in raydist imports a private module or name
(tests/test_architecture.py checks it); the range pyproject declares is what CI runs (docs/running.md).

Names resolve on first use (PEP 562), as the imports they replace did: `from raydist.private_api import X` inside a
function imports X's module then, not when this module is imported (the driver stays without torch, a worker
without Ray Train's internals until it needs them).

Versions checked: ray 2.58.0 and 2.60.0 (`make test-min`, `make test`), torch 2.13.0.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> (module, attribute, why no public API does it)
PRIVATE: dict[str, tuple[str, str, str]] = {
    # ---- Ray core ----------------------------------------------------------------------------------------------
    "internal_kv_initialized": (
        "ray.experimental.internal_kv",
        "_internal_kv_initialized",
        "the cluster-wide stop request (raydist.cluster.preemption) is a key in the GCS's KV store; "
        "Ray's public KV is Ray Serve's or a named actor, which would need a process",
    ),
    "internal_kv_get": ("ray.experimental.internal_kv", "_internal_kv_get", "as internal_kv_initialized"),
    "internal_kv_put": ("ray.experimental.internal_kv", "_internal_kv_put", "as internal_kv_initialized"),
    "GcsClient": (
        "ray._raylet",
        "GcsClient",
        "draining a node (DrainNode, reason PREEMPTION) and asking the GCS once whether it takes the token "
        "before ray.init retries a refusal for 20 s: no public call does either",
    ),
    "autoscaler_pb2": ("ray.core.generated.autoscaler_pb2", None, "the DrainNode reason's enum, for GcsClient"),
    "global_state": (
        "ray._private.state",
        "state",
        "which nodes are being drained (get_draining_nodes): Ray Train's own PreemptionWatcher reads "
        "the same; no public call in 2.60",
    ),
    "ObjectRef": (
        "ray._raylet",
        "ObjectRef",
        "the warm interpreter checks that forked workers draw different random Ray IDs (from_random)",
    ),
    # ---- Ray Train -----------------------------------------------------------------------------------------
    "WorkerHealthCheckTimeoutError": (
        "ray.train.v2._internal.exceptions",
        "WorkerHealthCheckTimeoutError",
        "to name a hung worker from Ray Train's failure (the public error wraps it)",
    ),
    "get_or_create_autoscaling_coordinator": (
        "ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator",
        "get_or_create_autoscaling_coordinator",
        "started beside Ray Train's controller, which waits for it on the path to the first step (raydist.engines.raytrain)",
    ),
    "get_address_and_port": (
        "ray.train._internal.utils",
        "get_address_and_port",
        "rank 0's address for raydist's own process-group backend (raydist.engines.raytrain_backend)",
    ),
    "set_torch_distributed_env_vars": (
        "ray.train.torch.config",
        "_set_torch_distributed_env_vars",
        "raydist's backend sets up torch.distributed as TorchConfig's does",
    ),
    "setup_torch_process_group": ("ray.train.torch.config", "_setup_torch_process_group", "as above"),
    "shutdown_torch": ("ray.train.torch.config", "_shutdown_torch", "as above"),
    "TrainingFramework": (
        "ray.train.v2._internal.util",
        "TrainingFramework",
        "the framework Ray Train records for a run (raydist.engines.raytrain_backend)",
    ),
    "ReplicaGroup": (
        "ray.train.v2._internal.execution.worker_group",
        "ReplicaGroup",
        "the heal strategy replaces one replica group, as Ray's torchft backend does",
    ),
    "TorchftConfig": (
        "ray.train.v2.torch.torchft_config",
        "TorchftConfig",
        "Ray's torchft backend (lighthouse, one process group per replica group) is not exported",
    ),
    "DataConfig": (
        "ray.train._internal.data_config",
        "DataConfig",
        "raydist.driver.train_view writes runs that Ray Train did not start to the dashboard's run list",
    ),
    "get_or_create_state_actor": (
        "ray.train.v2._internal.state.state_actor",
        "get_or_create_state_actor",
        "as DataConfig: the run list lives in Ray Train's state actor",
    ),
    "state_schema": ("ray.train.v2._internal.state.schema", None, "as DataConfig: the run list's record types"),
    "state_util": ("ray.train.v2._internal.state.util", None, "as DataConfig: its timestamps and helpers"),
    # ---- torch ---------------------------------------------------------------------------------------------
    "flatten_dense_tensors": (
        "torch._utils",
        "_flatten_dense_tensors",
        "the sync strategy's bucketed all-reduce flattens as DDP does; no public twin",
    ),
    "unflatten_dense_tensors": ("torch._utils", "_unflatten_dense_tensors", "as flatten_dense_tensors"),
}

TORCHFT_MODULE = "ray.train.v2.torch.torchft_config"
"""Whether this Ray has its torchft backend (the heal strategy's check)."""
CONTROLLER_LOGGER = "ray.train.v2._internal.execution.controller.controller"
"""Ray Train's controller's logger: its control-loop tracebacks are kept off the console (raydist.observability)."""
DYNAMO_MODULE = "torch._dynamo"
"""Imported ahead by the warm interpreter: DistributedDataParallel imports it as it is built."""


HEAD_NODE_RESOURCE = "node:__internal_head__"
"""The resource only the head node carries in `ray.nodes()`' Resources (raydist.cluster.preemption never drains the head;
raydist doctor marks it): Ray's own internal name, and `IsHeadNode` is not in every release's node table.
Checked: ray 2.58.0, 2.60.0."""


def trainer_class_filtering_default_callbacks(base: type, keep) -> type:
    """`base` (Ray Train V2's DataParallelTrainer) with only the default callbacks `keep(trainer, callback)` accepts.
    Ray's private `_create_default_callbacks` is the one place Ray Train makes that list, and no option drops its
    placement-group cleaner or dataset manager (raydist.engines.raytrain_trainer says why raydist does). Checked: ray 2.58.0,
    2.60.0."""

    class RaydistTorchTrainer(base):
        def _create_default_callbacks(self):
            return [c for c in super()._create_default_callbacks() if keep(self, c)]

    return RaydistTorchTrainer


def torchft_backend_class() -> type:
    """Ray Train's torchft backend (`_TorchftBackend`: Ray carries it but does not export it), with its private
    lighthouse hook under a public name: a subclass overrides `lighthouse_address(backend_config)` (the heal
    strategy's places the lighthouse on the controller's node without a CPU), and may call it on super() for Ray's.
    Checked: ray 2.58.0, 2.60.0."""
    from ray.train.v2.torch.torchft_config import _TorchftBackend

    class TorchftBackend(_TorchftBackend):
        def _maybe_create_lighthouse_actor(self, backend_config) -> str:
            return self.lighthouse_address(backend_config)

        def lighthouse_address(self, backend_config) -> str:
            return super()._maybe_create_lighthouse_actor(backend_config)

    return TorchftBackend


PYTHON_PRIVATE = {
    "threading._register_atexit": "raydist/launcher/rank_site/sitecustomize.py: the one hook at the "
    "moment a script's main module has ended (before non-daemon threads are joined and atexit runs); "
    "that file runs in the user's Python and cannot import raydist. Checked: CPython 3.10-3.12"
}
"""Python's own private names raydist uses, where they are used."""


def actor_id(handle: Any) -> str:
    """An actor handle's id, hex: to name an actor from its handle (the async PS's shards, the Train view's
    workers). The handle has no public accessor in Ray 2.60; inside the actor, get_runtime_context() has it."""
    return handle._actor_id.hex()


def reread_ray_settings() -> None:
    """In a worker forked with Ray already imported (the warm interpreter): Ray's C++ side reads its settings again
    from the environment and forgets a cached token, as ray.init does after setting one (ray._private.
    authentication). No public call: Ray reads them once, at import. Nothing when Ray is not imported."""
    import sys

    raylet = sys.modules.get("ray._raylet")
    if raylet is not None:
        raylet.Config.initialize("")
        raylet.AuthenticationTokenLoader.instance().reset_cache()


def __getattr__(name: str) -> Any:
    if name not in PRIVATE:
        raise AttributeError(f"module 'raydist.private_api' has no attribute {name!r}")
    module, attribute, _ = PRIVATE[name]
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value
