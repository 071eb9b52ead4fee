"""What raydist's metrics exporter costs the training loop, in a real Ray actor (where ray.util.metrics is live).

    .venv/bin/python -m benchmarks.metrics_cost --rounds 3
    .venv/bin/python -m benchmarks.metrics_cost --rounds 5 --out docs/data/metrics_cost.json   # stored, as docs quote
    .venv/bin/python -m benchmarks.metrics_cost --report docs/data/metrics_cost.json           # docs/observability.md

Per step: the calls the loop makes every step (count, communication, observe, maybe_export), which export at most
once a second; per export: a forced export of every value (a dozen Gauge.set calls). Prints each round and the
min-max over rounds.
"""

from __future__ import annotations

import time

import ray

from benchmarks import stored as stored_file


@ray.remote
class Bench:
    def run(self, steps: int, exports: int) -> tuple[float, float]:
        from raydist.observability.ray_metrics import Exporter

        e = Exporter("bench", "sync", "worker", 0)
        t = time.perf_counter()
        for i in range(steps):
            e.count("samples_per_s", 32)
            e.communication(i * 1000.0, i * 0.001)
            e.observe(step=i, total_steps=steps, loss=0.5, grad_norm=1.0, lr=0.1, step_time_s=0.001)
            e.maybe_export()
        per_step = (time.perf_counter() - t) / steps
        t = time.perf_counter()
        for _ in range(exports):
            e.maybe_export(force=True)
        return per_step * 1e6, (time.perf_counter() - t) / exports * 1e6


def report(stored: dict) -> str:
    """The line docs/observability.md quotes."""
    steps, exports = stored["us_per_step"], stored["us_per_export"]
    return (
        f"{stored_file.spread(steps, 2)} µs per step, {stored_file.spread(exports, 1)} µs per export "
        f"(median (min-max) of {len(steps)} rounds)\n"
    )


def measure(a) -> dict:
    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
    rows = []
    for i in range(a.rounds):
        rows.append(ray.get(Bench.remote().run.remote(a.steps, a.exports)))
        print(f"round {i + 1}: {rows[-1][0]:.2f} us per step, {rows[-1][1]:.1f} us per export", flush=True)
    return {
        "steps": a.steps,
        "exports": a.exports,
        "us_per_step": [round(r[0], 3) for r in rows],
        "us_per_export": [round(r[1], 2) for r in rows],
    }


def main() -> None:
    p = stored_file.parser(__doc__.splitlines()[0], rounds=3)
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--exports", type=int, default=200)
    stored_file.cli(p, "docs/data/metrics_cost.json", report, measure)


if __name__ == "__main__":
    main()
