"""The driver's view of the cluster's nodes: say in the job output when one dies or joins, name the dead ones."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from raydist.cluster.dashboard_client import HOST_LABEL  # set on every node by SLURM bring-up


def node_name(node: dict[str, Any]) -> str:
    """'node02 (192.168.20.17)' on a SLURM-booted cluster, else the node's address."""
    host = (node.get("Labels") or {}).get(HOST_LABEL) or node.get("NodeManagerHostname") or ""
    address = node.get("NodeManagerAddress", "?")
    return f"{host} ({address})" if host and host != address else address


def preempted(node_ids) -> str:
    """The stop reason for nodes being drained: 'preempted: node(s) node01 (192.168.20.16), ... draining'."""
    import ray

    names = {n["NodeID"]: node_name(n) for n in ray.nodes()}
    return f"preempted: node(s) {', '.join(sorted(names.get(n, n[:8]) for n in node_ids)) or '?'} draining"


def dead_nodes() -> list[str]:
    """Names of the nodes Ray knows as dead, with Ray's reason."""
    import ray

    return [f"{node_name(n)}: {n.get('DeathReasonMessage') or 'no heartbeat'}" for n in ray.nodes() if not n["Alive"]]


class NodeWatcher:
    """A daemon thread that polls Ray's node table and reports each change in one line."""

    def __init__(self, say: Callable[[str], None] = lambda line: print(line, flush=True), interval_s: float = 2.0):
        import ray

        self._say, self._interval = say, interval_s
        self._alive = {n["NodeID"]: n["Alive"] for n in ray.nodes()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raydist-node-watcher", daemon=True)

    def __enter__(self) -> NodeWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=self._interval + 1)

    def _run(self) -> None:
        import ray

        while not self._stop.wait(self._interval):
            try:
                nodes = ray.nodes()
            except Exception:  # the GCS going away is reported by the job's own failure, not here
                return
            for n in nodes:
                was = self._alive.get(n["NodeID"])
                if was is not None and was == n["Alive"]:
                    continue
                self._alive[n["NodeID"]] = n["Alive"]
                if not n["Alive"] and was:
                    self._say(f"[raydist] node {node_name(n)} died: {n.get('DeathReasonMessage') or 'no heartbeat'}")
                elif n["Alive"] and was is None:
                    self._say(f"[raydist] node {node_name(n)} joined")
