"""Ray Train with its torch backend (what `TorchTrainer` builds) without two helper actors a raydist run has no use
for, and the one guarantee the first of them gave, kept by the driver instead.

Ray Train 2.60 starts, for every `fit()`, beside its controller:
- a `PlacementGroupCleaner`: a detached actor that asks the dashboard's state API every second whether the
  controller still lives, and removes the worker group's placement group if it died without removing it. Ray itself
  removes a placement group once both the actor that created it (the controller) and its job (the driver) are gone;
  the cleaner covers a driver that lives on after its controller died, and costs a process importing Ray's state API
  plus a state query a second. raydist's driver knows when `fit()` ended: `release_placement_group` removes the
  group the workers last ran in, if it is still there, whenever `fit()` raised.
- a `DatasetManager` (through `DatasetsCallback`), which serves Ray Data shards; a raydist run passes no Ray Data
  set (each worker reads its own shard, `raydist.torchkit.sharding`), so it is only started when one is passed.

Measured side by side (docs/dev/startup-changes.md, "Two helpers fewer"): dropping both cut the machine's CPU time for a
one-epoch `jobs/sync.py` by an eighth; its first step moved within the noise. The hook is Ray's `_create_default_callbacks` (raydist.private_api), the
one place the list is made: if a later Ray renames it, nothing breaks, the helpers are started again, and
tests/test_architecture.py fails so that the hook is moved.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from raydist.atomic import write_json_atomic

UNUSED = {
    "PlacementGroupCleanerCallback": lambda trainer: True,
    "DatasetsCallback": lambda trainer: not trainer.datasets,
}
"""Ray Train's default callbacks a raydist run drops, by class name, and when."""

PLACEMENT_GROUP_FILE = "placement_group.json"
"""Written by rank 0 at each start of the worker group: the placement group it runs in."""


def torch_trainer(*, torch_config=None, **kwargs):
    """What `ray.train.torch.TorchTrainer(torch_config=..., **kwargs)` builds, without the helpers in `UNUSED`:
    Ray Train's `DataParallelTrainer` with the torch backend config (raydist.engines.raytrain_backend's, torch-free).
    TorchTrainer adds to it only Ray Train's local mode, which raydist does not use, and its module imports torch:
    a driver that sizes a built-in model without torch (raydist.driver.preflight) then never imports it."""
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from raydist.engines.raytrain_backend import QuietTorchConfig
    from raydist.private_api import trainer_class_filtering_default_callbacks

    RaydistTorchTrainer = trainer_class_filtering_default_callbacks(
        DataParallelTrainer, lambda trainer, c: not UNUSED.get(type(c).__name__, lambda _: False)(trainer)
    )
    return RaydistTorchTrainer(backend_config=torch_config or QuietTorchConfig(), **kwargs)


def note_placement_group(run_dir: str) -> None:
    """On rank 0: the placement group this worker group runs in, for `release_placement_group`."""
    from ray.util import get_current_placement_group

    group = get_current_placement_group()
    if group is not None:
        with contextlib.suppress(OSError):  # a convenience for a rare failure: never a reason to fail the worker
            write_json_atomic(Path(run_dir) / PLACEMENT_GROUP_FILE, {"id": group.id.hex()})


def release_placement_group(run_dir: str) -> bool:
    """After a `fit()` that raised: remove the worker group's placement group if Ray Train's controller died before
    it could (a live driver would otherwise find its CPUs held: the Python API's next `raydist.fit`). Whether one
    was removed."""
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    path = Path(run_dir) / PLACEMENT_GROUP_FILE
    try:
        group = PlacementGroup(ray.PlacementGroupID.from_hex(json.loads(path.read_text())["id"]))
        if ray.util.placement_group_table(group).get("state", "REMOVED") == "REMOVED":
            return False
        remove_placement_group(group)
        return True
    except Exception:  # noqa: BLE001 - no file, or Ray unreachable: the run's own error is what the user must see
        return False
    finally:
        path.unlink(missing_ok=True)
