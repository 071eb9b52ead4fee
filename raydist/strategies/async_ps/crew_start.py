"""Placing an async PS run's actors: the resources it needs, the workers' placement group, and each start of the
crew (server shards, the staleness gate, workers), the first and every restart alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from raydist.config import Config
from raydist.driver.train_view import TrainView, actor_name
from raydist.errors import RaydistError, UsageError
from raydist.strategies.async_ps.checkpoints import Resume
from raydist.strategies.async_ps.crew import Crew

PLACEMENT_TIMEOUT_S = 120


def check_resources(cfg: Config) -> None:
    import ray

    need = (
        cfg.scaling.max_workers * cfg.scaling.cpus_per_worker + cfg.async_ps.num_servers * cfg.async_ps.cpus_per_server
    )
    have = ray.cluster_resources().get("CPU", 0)
    if need > have:
        raise UsageError(
            f"the async job needs {need:g} CPUs (scaling.num_workers x scaling.cpus_per_worker + async_ps.num_servers"
            f" x async_ps.cpus_per_server) but the Ray cluster has {have:g}"
        )
    gpus = ray.cluster_resources().get("GPU", 0)
    if cfg.scaling.use_gpu and gpus < cfg.scaling.max_workers:
        raise UsageError(f"scaling.use_gpu needs {cfg.scaling.max_workers} GPUs; the Ray cluster has {gpus:g}")


def placement_group(cfg: Config) -> Any:
    """One bundle per worker, spread over the nodes as far as the cluster allows. It outlives restarts: Ray
    re-places the bundles of a dead node by itself."""
    from ray.util.placement_group import placement_group as create

    s = cfg.scaling
    bundle = {"CPU": s.cpus_per_worker, **({"GPU": 1} if s.use_gpu else {})}
    return create([bundle] * s.max_workers, strategy="SPREAD")


def wait_placed(pg: Any, num_workers: int) -> None:
    """Wait for the workers' bundles: at the start, and after a failure, when Ray may be re-placing the
    bundles of a node that died."""
    import ray

    try:
        ray.get(pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise RaydistError(
            f"could not place {num_workers} workers within {PLACEMENT_TIMEOUT_S} s (free CPUs/GPUs?)"
        ) from None


@dataclass(frozen=True)
class CrewStart:
    """What every start of the crew shares: the run's config, its placement group and dashboard view, and the
    initial parameters cut into the shards' slices."""

    cfg: Config
    pg: Any
    view: TrainView
    initial: torch.Tensor
    bounds: list[tuple[int, int]]
    total_steps: int

    def start(self, crew: Crew, grant_limit: int, resume: Resume) -> None:
        """Server shards (restored from `resume`'s checkpoint if it has one), the staleness gate if any, and
        workers, each added to `crew` as it is created so that it can be named should it die while starting."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from raydist.strategies.async_ps.gate import StalenessGate
        from raydist.strategies.async_ps.worker import DownpourWorker

        cfg, ps, W = self.cfg, self.cfg.async_ps, self.cfg.scaling.max_workers
        config = cfg.to_dict()
        named = self.view.options  # 'raydist/<run>/server-0', ...: readable in the dashboard's actor lists
        self._start_shards(crew, config, grant_limit)
        if resume.shards is not None:
            ray.get([s.load_state_dict.remote(st, resume.done) for s, st in zip(crew.shards, resume.shards)])
        if ps.on_stale == "wait" and ps.max_staleness >= 0:
            crew.gate = crew.add(
                ray.remote(StalenessGate).options(num_cpus=0, **named("gate")).remote(ps.max_staleness),
                "staleness gate",
            )
        for k in range(W):
            worker = (
                ray.remote(DownpourWorker)
                .options(
                    num_cpus=cfg.scaling.cpus_per_worker,
                    num_gpus=1 if cfg.scaling.use_gpu else 0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=k),
                    **named("worker", k),
                )
                .remote(config, k, W, crew.shards, self.bounds, crew.gate)
            )
            crew.workers.append(crew.add(worker, f"worker {k}"))
        crew.locate()  # data loaded: start the clock together
        servers = ", ".join(actor_name(cfg.run.name, "server", i, self.view.attempt) for i in range(len(crew.shards)))
        # Server shard 0 stands in for the controller: it hands out the run's steps and dies with the driver.
        self.view.running(crew.workers, crew.shards[0], f"parameter server shards: {servers}")

    def _start_shards(self, crew: Crew, config: dict[str, Any], grant_limit: int) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from raydist.strategies.async_ps.server import ParameterShard

        ps = self.cfg.async_ps
        # Servers that reserve no CPU fit on any node: pinned where raydist.strategies.async_ps.placement says. Ones that reserve
        # CPUs go where Ray finds them free, spread as far as it can (a pin could wait for ever on a full node).
        spread = ps.server_placement == "spread"
        nodes = self._shard_nodes(ps.num_servers) if spread and ps.cpus_per_server == 0 else []
        for i, (a, b) in enumerate(self.bounds):
            # Hard affinity: with soft=True, Ray 2.60 placed these 0-CPU actors wherever it liked (measured on the
            # emulated cluster: 0 of 6 on the node asked for). The nodes are the ones alive at this start.
            placement = (
                {"scheduling_strategy": NodeAffinitySchedulingStrategy(nodes[i], soft=False)}
                if nodes
                else {"scheduling_strategy": "SPREAD"}
                if spread
                else {}
            )
            shard = (
                ray.remote(ParameterShard)
                .options(num_cpus=ps.cpus_per_server, **placement, **self.view.options("server", i))
                .remote(i, self.initial[a:b].numpy(), config, self.total_steps, grant_limit)
            )
            crew.shards.append(crew.add(shard, f"server shard {i}"))

    def _shard_nodes(self, num_servers: int) -> list[str]:
        """Node ids for the shards (raydist.strategies.async_ps.placement): alive nodes by hostname, the workers' from their bundles."""
        import ray
        from ray.util import placement_group_table

        from raydist.strategies.async_ps.placement import shard_nodes

        alive = sorted((n for n in ray.nodes() if n["Alive"]), key=lambda n: (n["NodeManagerHostname"], n["NodeID"]))
        workers = list(placement_group_table(self.pg)["bundles_to_node_id"].values())
        return shard_nodes(num_servers, [n["NodeID"] for n in alive], workers)
