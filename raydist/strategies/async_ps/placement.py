"""Where the parameter-server shards go (async_ps.server_placement=spread).

Every push and fetch of a shard's slice crosses the link of the shard's node, so the busiest node's link bounds
the run (the fan-in: W workers' pushes into one link). Spreading the shards over nodes divides that load, and a
node that runs no worker has its whole link for its shard: such nodes come first, then the workers' nodes, one
shard each in turn before any node gets a second (docs/benchmarks.md measures what each shard buys).
"""

from __future__ import annotations


def shard_nodes(num_servers: int, nodes: list[str], worker_nodes: list[str]) -> list[str]:
    """The node of each shard: `nodes` (every alive node, in a stable order) without workers first, then the
    nodes holding the fewest workers; round-robin when there are more shards than nodes."""
    if not nodes:
        return []
    load = {n: worker_nodes.count(n) for n in nodes}
    order = sorted(nodes, key=lambda n: (load[n] > 0, load[n], nodes.index(n)))
    return [order[i % len(order)] for i in range(num_servers)]
