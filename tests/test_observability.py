"""What a user watching a run sees: raydist's metrics on Ray's metrics endpoints and in a real Prometheus, and
`raydist top` (tests/support/comparerun.py runs the three strategies on a head while both watch)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from raydist.observability import ray_metrics, top
from tests.support.comparerun import STRATEGIES
from tests.support.jobutil import REPO

HOST = socket.gethostname()


def _by(answers, strategy, role):
    """{rank: value} of one query's series for a strategy and role."""
    return {int(m["rank"]): v for m, v in answers if m.get("strategy") == strategy and m.get("role") == role}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_prometheus_scraped_every_workers_metrics_with_plausible_values(compared, strategy):
    q = compared.prometheus
    assert any(t["health"] == "up" for t in compared.prom_targets), compared.prom_targets  # found via the head
    steps = _by(q["step"], strategy, "worker")
    assert set(steps) == {0, 1}, q["step"]  # both workers, by rank
    assert all(s > 0 for s in steps.values()), steps
    loss = _by(q["loss"], strategy, "worker")
    assert set(loss) == {0, 1} and all(0 < v < 10 for v in loss.values()), loss
    assert all(v > 0 for v in _by(q["samples_per_s"], strategy, "worker").values())
    assert all(v > 0 for v in _by(q["comm_bytes_total"], strategy, "worker").values())
    assert all(0 <= v <= 1 for v in _by(q["comm_wait_share"], strategy, "worker").values())
    assert all(v > 50e6 for v in _by(q["peak_memory_bytes"], strategy, "worker").values())  # a Python + torch process
    driver = _by(q["step"], strategy, "driver")
    assert driver and 0 < driver[0] <= _by(q["total_steps"], strategy, "driver")[0]
    assert 0.5 < _by(q["test_accuracy"], strategy, "driver")[0] <= 1
    if strategy == "async":
        assert _by(q["ps_updates_per_s"], strategy, "server")[0] > 0
        staleness = {m["worker"]: v for m, v in q["staleness"] if m.get("strategy") == "async"}
        assert set(staleness) == {"0", "1"} and all(0 <= v < 100 for v in staleness.values()), staleness
    else:
        assert _by(q["last_checkpoint_step"], strategy, "worker")[0] > 0


@pytest.mark.slow
def test_top_saw_every_strategys_workers_on_their_node_while_they_trained(compared):
    seen: dict[str, dict[int, dict]] = {}
    staleness_seen = False
    for snap in compared.snapshots:
        for run in snap["runs"]:
            for p in run["processes"]:
                if p["role"] == "worker" and p.get("step"):
                    seen.setdefault(run["strategy"], {})[p["rank"]] = p
                    staleness_seen |= run["strategy"] == "async" and "staleness" in p
    assert set(seen) == set(STRATEGIES), [s.get("error") for s in compared.snapshots if "error" in s]
    for strategy, workers in seen.items():
        assert set(workers) == {0, 1}, (strategy, workers)
        for p in workers.values():
            assert p["node"] == HOST and p["state"] == "alive" and p["step"] > 0, p
    assert staleness_seen  # an async worker's row carried the staleness its server measured


# ---- `raydist top` without a cluster ------------------------------------------------------------------------

PAGE = """# HELP ray_raydist_step steps
# TYPE ray_raydist_step gauge
ray_raydist_step{Component="core_worker",WorkerId="a",node="n1",rank="0",role="worker",run="r",strategy="sync"} 12.0
ray_raydist_step{Component="core_worker",WorkerId="b",node="n2",rank="1",role="worker",run="r",strategy="sync"} 11.0
ray_raydist_step{Component="core_worker",WorkerId="old",node="n2",rank="1",role="worker",run="r",strategy="sync"} 3.0
ray_raydist_updated_unixtime{WorkerId="a",node="n1",rank="0",role="worker",run="r",strategy="sync"} 1000.0
ray_raydist_updated_unixtime{WorkerId="b",node="n2",rank="1",role="worker",run="r",strategy="sync"} 990.0
ray_raydist_updated_unixtime{WorkerId="old",node="n2",rank="1",role="worker",run="r",strategy="sync"} 900.0
ray_raydist_comm_bytes_total{WorkerId="a",node="n1",rank="0",role="worker",run="r",strategy="sync"} 5e6
ray_raydist_staleness{WorkerId="s",node="n1",rank="0",role="server",run="p",strategy="async",worker="1"} 4.0
ray_raydist_step{WorkerId="w",node="n2",rank="1",role="worker",run="p",strategy="async"} 7.0
ray_other_metric{run="r"} 1.0
"""


def test_top_groups_series_by_process_keeps_the_newest_and_names_stalled_ones():
    procs = top.group(top.parse_samples(PAGE))
    runs = {r["run"]: r for r in top.runs_view(procs, now=1000.0 + 5)}
    sync = {p["rank"]: p for p in runs["r"]["processes"]}
    assert sync[0]["step"] == 12 and sync[0]["node"] == "n1" and sync[0]["comm_bytes"] == 5e6
    assert sync[1]["step"] == 11  # not the restarted worker's predecessor
    assert sync[0]["state"] == "alive" and sync[1]["state"] == "stalled" and sync[1]["age_s"] == 15.0
    async_worker = [p for p in runs["p"]["processes"] if p["role"] == "worker"][0]
    assert async_worker["staleness"] == 4.0  # measured on the server, shown on the worker
    text = top.table(list(runs.values()), ["node03 (10.0.0.3)"], "test", now=1005.0)
    assert "stalled 15s" in text and "dead nodes: node03" in text and text.count("\n") == 6


def test_top_keeps_a_worker_that_died_on_its_runs_list_as_gone():
    procs = top.group(top.parse_samples(PAGE))
    before = top.runs_view(procs, now=1000.0)
    after = top.runs_view([p for p in procs if not (p.run == "r" and p.rank == 1)], now=1002.0)
    shown = {r["run"]: r for r in top.with_gone(before, after)}
    assert [(p["rank"], p["state"]) for p in shown["r"]["processes"]] == [(0, "alive"), (1, "gone")]
    assert shown["r"]["processes"][1]["step"] == 11  # what it last did
    assert top.with_gone(before, [r for r in after if r["run"] != "r"])[0]["run"] == "p"  # a finished run goes


def test_top_refuses_bad_input_and_a_missing_cluster_in_one_line(tmp_path):
    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "raydist.cli", "top", *args], cwd=REPO, capture_output=True, text=True, timeout=60
        )

    bad = run("--once", "--address", "127.0.0.1:1")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--address" in bad.stderr, bad.stderr
    none = run("--once", "--temp-dir", str(tmp_path))
    assert none.returncode == 1 and none.stderr.startswith("raydist: error: no running Ray instance"), none.stderr
    gone = run("--once", "--address", f"http://127.0.0.1:{_closed_port()}")
    assert gone.returncode == 1 and gone.stderr.count("\n") == 1 and "has the cluster ended" in gone.stderr, gone.stderr


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_every_exported_metric_is_in_the_table_and_the_docs():
    from raydist.observability.grafana import dashboard

    assert ray_metrics.markdown_table() in (REPO / "docs" / "observability.md").read_text()
    shipped = json.loads((REPO / "cluster" / "grafana-raydist.json").read_text())
    assert shipped == dashboard(), "regenerate: python -m raydist.observability.grafana > cluster/grafana-raydist.json"
    assert len(shipped["panels"]) == len(ray_metrics.METRICS) - 1  # all but the timestamp


def test_the_exporter_sends_rates_and_wait_shares_at_most_once_a_second(monkeypatch):
    sent: list[tuple[str, float, dict]] = []

    class Fake:
        def __init__(self, name):
            self.name = name

        def set(self, value, tags):
            sent.append((self.name, value, tags))

        inc = set

    monkeypatch.setattr(ray_metrics, "_instrument", lambda m: Fake(m.name))
    now = [100.0]
    e = ray_metrics.Exporter("r", "sync", "worker", 1, clock=lambda: now[0], enabled=True)
    assert e.maybe_export() and sent  # the first call exports
    sent.clear()
    e.count("samples_per_s", 64)
    e.communication(1000.0, 0.25)
    e.observe(step=3, loss=None)
    now[0] += 0.5
    assert not e.maybe_export() and not sent  # throttled
    now[0] += 0.5
    assert e.maybe_export()
    got = {name: (value, tags) for name, value, tags in sent}
    assert got["samples_per_s"][0] == 64.0 and got["comm_wait_share"][0] == 0.25 and got["step"][0] == 3
    assert got["comm_bytes"][0] == 1000.0 and "loss" not in got  # a counter gets the increment; None is skipped
    assert got["step"][1] == {"run": "r", "strategy": "sync", "role": "worker", "rank": "1", "node": HOST}
    sent.clear()
    now[0] += 1.0
    e.maybe_export()
    assert "comm_bytes" not in {name for name, _, _ in sent}  # nothing new to add


def test_prometheus_config_discovers_a_clusters_nodes_through_its_dashboard_with_the_token():
    from raydist.observability.prometheus import scrape_config

    cfg = json.loads(
        scrape_config(dashboard_url="http://10.0.0.1:8265/", token_file="/tok", interval_s=2).split("\n", 1)[1]
    )
    sd = cfg["scrape_configs"][0]["http_sd_configs"][0]
    assert sd["url"] == "http://10.0.0.1:8265/api/prometheus/sd"
    assert sd["authorization"] == {"type": "Bearer", "credentials_file": "/tok"}
    assert cfg["global"]["scrape_interval"] == "2s"
    local = json.loads(scrape_config(sd_file="/tmp/ray/prom_metrics_service_discovery.json").split("\n", 1)[1])
    assert local["scrape_configs"][0]["file_sd_configs"][0]["files"] == ["/tmp/ray/prom_metrics_service_discovery.json"]
