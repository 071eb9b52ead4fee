"""Asking every training run on a Ray cluster to checkpoint and stop: the cluster-wide stop request.

Two signals, set together by `request_stop` (the SLURM side calls it at the time-limit warning or on preemption):
- Ray's own: every node but the head is drained with reason PREEMPTION and a deadline. Ray Train's
  PreemptionWatcher sees the drain and `ray.train.get_preemption_info()` reports it on every worker, so any Ray
  Train job on the cluster, not only raydist's, can react. The head is never drained: an idle node being drained
  ends at once, and the head holds the GCS.
- raydist's: a key in the GCS's internal key-value store, which a raydist loop (rank 0) and the async PS driver
  read about once a second. It also covers a cluster of one node, where nothing can be drained.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from raydist.private_api import HEAD_NODE_RESOURCE

STOP_KEY = b"raydist:stop"
NAMESPACE = "raydist"


@dataclass(frozen=True)
class StopRequest:
    reason: str
    """Why, in words: e.g. 'SLURM time limit in 90 s'."""
    deadline_unix: float | None = None
    """When the cluster goes away, if known."""

    def describe(self) -> str:
        if self.deadline_unix is None:
            return self.reason
        return f"{self.reason} (cluster ends in {max(0.0, self.deadline_unix - time.time()):.0f} s)"


def stop_requested() -> StopRequest | None:
    """The cluster's stop request, if any; needs a connected Ray (driver or worker)."""
    from raydist.private_api import internal_kv_get, internal_kv_initialized

    if not internal_kv_initialized():
        return None
    raw = internal_kv_get(STOP_KEY, namespace=NAMESPACE)
    if raw is None:
        return None
    data = json.loads(raw)
    return StopRequest(data["reason"], data.get("deadline_unix"))


def request_stop(reason: str, deadline_s: float | None) -> list[tuple[str, bool]]:
    """Set the stop key and drain every alive node but the head; returns (node address, drain accepted) pairs."""
    import ray

    from raydist.private_api import GcsClient, autoscaler_pb2, internal_kv_put

    deadline_unix = time.time() + deadline_s if deadline_s is not None else None
    internal_kv_put(
        STOP_KEY, json.dumps({"reason": reason, "deadline_unix": deadline_unix}), overwrite=True, namespace=NAMESPACE
    )
    gcs = GcsClient(address=ray.get_runtime_context().gcs_address)
    deadline_ms = int(deadline_unix * 1000) if deadline_unix is not None else 0
    preemption = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
    drained = []
    for node in ray.nodes():
        if not node["Alive"] or HEAD_NODE_RESOURCE in node["Resources"]:
            continue
        accepted, _ = gcs.drain_node(node["NodeID"], preemption, reason, deadline_ms)
        drained.append((node["NodeManagerAddress"], bool(accepted)))
    return drained


def draining_nodes() -> dict[str, int]:
    """Node id -> drain deadline (ms, 0 = none) of the nodes being drained.

    Ray has no public call for this in 2.60; Ray Train's own PreemptionWatcher reads the same private state.
    """
    from raydist.private_api import global_state

    return global_state.get_draining_nodes()
