"""The session's one jobs/compare.py run (fixture `compared`), on a Ray head of its own with a real Prometheus
scraping it and `raydist top`'s reader polling it while the three strategies train: tests of compare, of the
metrics every strategy exports, of TensorBoard side by side and of the dashboard all read this one run."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.jobutil import REPO, summary

STRATEGIES = ("sync", "local_sgd", "async")
EPOCHS = 15
"""Long enough (a few seconds of training per strategy) for metrics exported every second to be seen, and for every
strategy to pass the 0.95 test accuracy test_compare asks for."""
METRICS = (
    "step",
    "total_steps",
    "loss",
    "samples_per_s",
    "comm_wait_share",
    "staleness",
    "ps_updates_per_s",
    "peak_memory_bytes",
    "last_checkpoint_step",
    "test_accuracy",
    "comm_bytes_total",
)


def prometheus_queries(session: str) -> dict[str, str]:
    """The largest value each (strategy, role, rank) series of this head's session reached during the run
    (staleness: per worker). Only this session's: other tests' Ray instances may run beside this one."""
    return {
        name: f"max by (strategy, role, rank{', worker' if name == 'staleness' else ''}) "
        f'(max_over_time(ray_raydist_{name}{{SessionName="{session}"}}[30m]))'
        for name in METRICS
    }


class Compared(tuple):
    """(summary, stdout, output dir) of the compare run; `.snapshots`: what `raydist top` read, about every
    second; `.prometheus`: prometheus_queries' answers after the run; `.prom_targets`: Prometheus's targets."""

    snapshots: list[dict]
    prometheus: dict[str, list[tuple[dict[str, str], float]]]
    prom_targets: list[dict]


@pytest.fixture(scope="session")  # not module: under xdist a module fixture can be built twice
def compared(tmp_path_factory):
    from raydist.observability import top
    from raydist.observability.prometheus import scrape_config
    from tests.support.promserver import prometheus
    from tests.support.rayhead import ray_head

    storage = tmp_path_factory.mktemp("compare")
    logs = tmp_path_factory.mktemp("compare-logs")
    # Metrics reach the node's agent every second (Ray's default: 10 s), as raydist's own instances do every 2 s.
    with (
        ray_head(num_cpus=4, env={"RAY_metrics_report_interval_ms": "1000"}) as head,
        prometheus(
            scrape_config(dashboard_url=head.dashboard_url, token_file=head.token_path, interval_s=1, refresh_s=2)
        ) as prom,
    ):
        source = top.Source(
            "test head", dashboard_url=head.dashboard_url, token=Path(head.token_path).read_text().strip()
        )
        # Start once Prometheus scrapes every target the head lists now (it asks for the list every 2 s here).
        deadline = time.monotonic() + 90
        while not set(source.targets()) <= {t["labels"]["instance"] for t in prom.targets() if t["health"] == "up"}:
            assert time.monotonic() < deadline, (source.targets(), prom.targets())
            time.sleep(0.5)
        args = [sys.executable, str(REPO / "jobs" / "compare.py")]
        for o in (
            f"run.storage_path={storage}",
            "run.name=cmp",
            "compare.plot_width=900",
            "compare.plot_height=400",
            f"train.epochs={EPOCHS}",
            f"run.address={head.gcs_address}",
        ):
            args += ["--set", o]
        out_path, err_path = logs / "stdout", logs / "stderr"
        snapshots = []
        with open(out_path, "w") as out, open(err_path, "w") as err:
            proc = subprocess.Popen(args, cwd=REPO, env=head.node_env(), stdout=out, stderr=err, text=True)
            deadline = time.monotonic() + 600
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    snapshots.append(top.snapshot(source))
                except Exception as e:  # noqa: BLE001 — a look that failed is recorded, not fatal here
                    snapshots.append({"error": repr(e), "runs": []})
                time.sleep(1)
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        time.sleep(2)  # one more scrape of the last exports
        answers = {name: prom.query(q) for name, q in prometheus_queries(source.session_name()).items()}
        # Every panel of the shipped Grafana dashboard is a query this Prometheus accepts (query() asserts it).
        from raydist.observability.grafana import dashboard

        for panel in dashboard()["panels"]:
            prom.query(panel["targets"][0]["expr"].replace("$run", ".*").replace("$strategy", ".*"))
        targets = prom.targets()
    done = subprocess.CompletedProcess(args, proc.returncode, out_path.read_text(), err_path.read_text())
    result = Compared((summary(done), done.stdout, storage / "cmp"))
    result.snapshots, result.prometheus, result.prom_targets = snapshots, answers, targets
    return result
