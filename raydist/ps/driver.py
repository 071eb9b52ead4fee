"""jobs/async.py's driver: places the server shards and workers, watches them, evaluates, checkpoints and resumes."""

from __future__ import annotations

import glob
import json
import os
import shutil
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any

import torch

from raydist import sharding
from raydist.commstats import per_worker_summary
from raydist.config import Config
from raydist.data import Splits, load_splits
from raydist.errors import ConfigError, RaydistError, exits_cleanly
from raydist.evaluation import evaluate
from raydist.flat import as_tensor, flatten_, slice_bounds
from raydist.launch import connect, last_error_line, parse_job_args
from raydist.metrics import MetricsLog
from raydist.models import build_model
from raydist.sharding import check_fits

STRATEGY = "async"
STATE_FILE = "ps_state.pt"
PLACEMENT_TIMEOUT_S = 120
POLL_S = 0.1  # how often the driver collects update records and looks for a due evaluation or checkpoint


def latest_checkpoint(run_dir: str) -> str | None:
    found = sorted(glob.glob(os.path.join(run_dir, "checkpoint_step*", STATE_FILE)))
    return os.path.dirname(found[-1]) if found else None


def load_params(checkpoint_dir: str) -> torch.Tensor:
    """The flat parameter vector a checkpoint holds (the shards' slices, joined)."""
    state = torch.load(os.path.join(checkpoint_dir, STATE_FILE), map_location="cpu", weights_only=False)
    return torch.cat([s["param"] for s in state["shards"]])


def _save(run_dir: str, steps: int, state: dict[str, Any], keep: int) -> str:
    directory = os.path.join(run_dir, f"checkpoint_step{steps:08d}")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, STATE_FILE)
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)  # a reader never sees half a file
    for old in sorted(glob.glob(os.path.join(run_dir, "checkpoint_step*", STATE_FILE)))[:-keep]:
        shutil.rmtree(os.path.dirname(old), ignore_errors=True)
    return directory


class _Evaluator:
    """Scores the servers' current parameters on the test split, here in the driver."""

    def __init__(self, cfg: Config, data: Splits):
        self.cfg, self.data = cfg, data
        self.model = build_model(cfg.model, data)
        self.params, _ = flatten_(self.model)
        self.ctx = SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu"))

    def __call__(self, shards: list, bounds: list[tuple[int, int]]) -> dict[str, float]:
        import ray

        for (a, b), (_, array, _, _) in zip(bounds, ray.get([s.pull.remote() for s in shards])):
            self.params[a:b].copy_(as_tensor(array))
        return evaluate(self.model, self.data, self.cfg, self.ctx)


def _check_resources(cfg: Config) -> None:
    import ray

    need = cfg.scaling.num_workers * cfg.scaling.cpus_per_worker + cfg.async_ps.num_servers * cfg.async_ps.cpus_per_server
    have = ray.cluster_resources().get("CPU", 0)
    if need > have:
        raise RaydistError(
            f"the async job needs {need:g} CPUs (scaling.num_workers x scaling.cpus_per_worker + async_ps.num_servers x "
            f"async_ps.cpus_per_server) but the Ray cluster has {have:g}"
        )
    if cfg.scaling.use_gpu and ray.cluster_resources().get("GPU", 0) < cfg.scaling.num_workers:
        raise RaydistError(f"scaling.use_gpu needs {cfg.scaling.num_workers} GPUs; the Ray cluster has "
                           f"{ray.cluster_resources().get('GPU', 0):g}")


def train(cfg: Config, where: str = "local", start: float | None = None) -> dict[str, Any]:
    """Run Downpour SGD to the sample budget (or train.stop_at_step) on the connected Ray cluster; returns the summary.

    `start` (a perf_counter reading) is when the job began, so wall_s counts connecting to Ray as sync's does.
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from raydist.ps.gate import StalenessGate
    from raydist.ps.server import ParameterShard
    from raydist.ps.worker import DownpourWorker

    start = time.perf_counter() if start is None else start
    W, K, ps = cfg.scaling.num_workers, cfg.async_ps.num_servers, cfg.async_ps
    data = load_splits(cfg.data)
    torch.manual_seed(cfg.train.seed)  # the same initial weights as sync DDP's
    init, _ = flatten_(build_model(cfg.model, data))
    if K > init.numel():
        raise RaydistError(f"async_ps.num_servers={K} exceeds the model's {init.numel()} parameters")
    bounds = slice_bounds(init.numel(), K)
    if cfg.train.grad_accum != 1:
        raise ConfigError("train.grad_accum: the async PS pushes every batch's gradient as it comes; set it to 1")
    check_fits(cfg, len(data.train))
    steps_per_epoch = sharding.steps_per_epoch(len(data.train), W, cfg.train.batch_size)  # per worker, as sync's
    # The same sample budget as sync DDP: there a step takes one batch from every worker, here one worker's.
    budget = W * (cfg.train.max_steps or cfg.train.epochs * steps_per_epoch)
    grant_limit = min(budget, cfg.train.stop_at_step) if cfg.train.stop_at_step else budget
    epoch_steps = W * steps_per_epoch  # an epoch's worth of samples, spread over the workers
    ckpt_every = cfg.checkpoint.every_steps or epoch_steps
    config = cfg.to_dict()

    resume_dir = latest_checkpoint(cfg.run.run_dir)
    resumed = None
    if resume_dir:
        resumed = torch.load(os.path.join(resume_dir, STATE_FILE), map_location="cpu", weights_only=False)
        if len(resumed["shards"]) != K:
            raise RaydistError(f"{resume_dir} holds {len(resumed['shards'])} server shards but async_ps.num_servers={K}: "
                               f"keep the shard count or use a new run.name")
    _check_resources(cfg)

    # One bundle per worker, spread over the nodes as far as the cluster allows.
    pg = placement_group([{"CPU": cfg.scaling.cpus_per_worker, **({"GPU": 1} if cfg.scaling.use_gpu else {})}] * W,
                         strategy="SPREAD")
    actors: list = []
    try:
        try:
            ray.get(pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RaydistError(f"could not place {W} workers within {PLACEMENT_TIMEOUT_S} s (free CPUs/GPUs?)") from None
        Shard = ray.remote(ParameterShard).options(num_cpus=ps.cpus_per_server)
        shards = [Shard.remote(i, init[a:b].numpy(), config, budget, grant_limit) for i, (a, b) in enumerate(bounds)]
        actors += shards
        done: dict[int, int] = {}
        if resumed:
            done = {int(k): v for k, v in resumed["shards"][0]["done"].items()}
            if resumed["workers"] != W:  # other shards of the data now: each worker starts at the average position
                done = {k: sum(done.values()) // W for k in range(W)}
            ray.get([s.load_state_dict.remote(st, done) for s, st in zip(shards, resumed["shards"])])
        gate = None
        if ps.on_stale == "wait" and ps.max_staleness >= 0:
            gate = ray.remote(StalenessGate).options(num_cpus=0).remote(ps.max_staleness)
            actors.append(gate)
        workers = [
            ray.remote(DownpourWorker).options(
                num_cpus=cfg.scaling.cpus_per_worker, num_gpus=1 if cfg.scaling.use_gpu else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=k),
            ).remote(config, k, W, shards, bounds, gate)
            for k in range(W)
        ]
        actors += workers
        ray.get([w.__ray_ready__.remote() for w in workers])  # data loaded: start the clock together
        return _watch(cfg, where, start, shards, bounds, workers, data, budget, epoch_steps, ckpt_every, done,
                      resumed["steps"] if resumed else None)
    finally:
        for actor in actors:
            ray.kill(actor)
        remove_placement_group(pg)


def _watch(cfg: Config, where: str, start: float, shards: list, bounds: list, workers: list, data: Splits, budget: int,
           epoch_steps: int, ckpt_every: int, done: dict[int, int], resumed_from: int | None) -> dict[str, Any]:
    """Start the workers, then until they finish: log their steps, evaluate every epoch's worth of steps (as sync
    does at its epoch ends), print progress about every train.report_every_s, checkpoint every interval."""
    import ray

    log = MetricsLog(cfg.run.run_dir, enabled=True)
    score = _Evaluator(cfg, data)
    t0 = time.time()
    runs = [w.run.remote(done.get(k, 0), t0) for k, w in enumerate(workers)]
    steps = last_ckpt_at = resumed_from or 0
    window: list[dict[str, Any]] = []  # update records since the last progress line
    last_losses: list[float] = []

    def collect() -> None:
        nonlocal steps, last_losses
        records, steps = ray.get(shards[0].drain.remote())
        for r in records:
            log.write(r)
        window.extend(records)
        last_losses = ([r["loss"] for r in records] + last_losses)[: len(workers)] if records else last_losses

    def checkpoint_now() -> str:
        nonlocal last_ckpt_at
        states = ray.get([s.state_dict.remote() for s in shards])
        last_ckpt_at = sum(states[0]["done"].values())  # shard 0's count of each worker's steps: where data resumes
        return _save(cfg.run.run_dir, last_ckpt_at, {"shards": states, "workers": len(workers), "steps": last_ckpt_at,
                                                     "config": cfg.to_dict()}, cfg.checkpoint.keep)

    def evaluate_now() -> dict[str, float]:
        scores = score(shards, bounds)
        log.write({"eval_at_step": steps, "time_s": time.time() - t0, **scores})
        return scores

    def report(scores: dict[str, float], final: bool) -> None:
        applied = [r["staleness"] for r in window if "step" in r]
        loss = f"{sum(r['loss'] for r in window) / len(window):.4g}" if window else "-"
        print(f"[raydist] async: step {steps}/{budget} loss {loss} "
              f"staleness {sum(applied) / max(1, len(applied)):.3g} test_loss {scores['test_loss']:.4g} "
              f"test_accuracy {scores['test_accuracy']:.4g}{' (final)' if final else ''}", flush=True)
        window.clear()

    scores = {"test_loss": float("nan"), "test_accuracy": float("nan")}
    evaluated_at, reported = steps, time.perf_counter()
    try:
        pending = list(runs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            ray.get(ready)  # a failed worker fails the run now, not when the others are done
            collect()
            if not pending:
                break
            if steps // epoch_steps > evaluated_at // epoch_steps:
                scores, evaluated_at = evaluate_now(), steps
            if time.perf_counter() - reported >= cfg.train.report_every_s:
                report(scores, final=False)
                reported = time.perf_counter()
            if steps - last_ckpt_at >= ckpt_every:
                checkpoint_now()
        per_worker = ray.get(runs)
    except ray.exceptions.RayError as e:
        raise RaydistError(f"training failed: {last_error_line(e)}") from None
    train_time = time.time() - t0
    collect()
    scores = evaluate_now()
    report(scores, final=True)
    checkpoint = checkpoint_now()
    log.close()

    staleness: Counter = Counter()
    dropped = 0
    for st in ray.get([s.stats.remote() for s in shards]):
        staleness.update({int(k): v for k, v in st["staleness"].items()})
        dropped += st["dropped"]
    updates = sum(staleness.values())
    samples = sum(w["samples"] for w in per_worker)
    return {
        "strategy": STRATEGY,
        "run_name": cfg.run.name,
        "ray": where,
        "workers": len(workers),
        "steps": steps,
        "wall_s": round(time.perf_counter() - start, 3),
        "test_accuracy": scores["test_accuracy"],
        "test_loss": scores["test_loss"],
        "final_loss": sum(last_losses) / len(last_losses) if last_losses else None,
        "samples_per_s": samples / train_time,
        "steps_per_s": sum(w["steps"] for w in per_worker) / train_time,
        "resumed_from_step": resumed_from,
        "checkpoint": checkpoint,
        "metrics_file": log.path,
        "servers": len(shards),
        "staleness_mean": sum(k * v for k, v in staleness.items()) / updates if updates else 0.0,
        "staleness_max": max(staleness, default=0),
        "dropped": dropped,
        "steps_per_worker": [w["steps"] for w in per_worker],
        **per_worker_summary(per_worker),
    }


@exits_cleanly
def main(doc: str | None = None, argv: list[str] | None = None) -> int:

    cfg = parse_job_args("async", argv, doc)
    start = time.perf_counter()
    where = connect(cfg)
    print(json.dumps(train(cfg, where, start)), flush=True)
    return 0
