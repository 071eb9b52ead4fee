"""The cost model behind `raydist plan` (raydist/planning/costmodel.py) and where async puts its server shards
(raydist/strategies/async_ps/placement.py): pure functions, checked by hand-computed values and on the shipped measured runs."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest

from raydist.planning import command as plan_cmd
from raydist.planning import costmodel as cm
from raydist.strategies.async_ps import cost as ps_cost
from raydist.strategies.async_ps.placement import shard_nodes
from raydist.strategies.local_sgd import cost as sgd_cost

REPO = Path(__file__).resolve().parents[1]
G = 1e6  # gradient bytes
OWN = {  # the strategies' own fitted parameters the synthetic runs are made with
    "async": ps_cost.AsyncPSFitted(ps_efficiency=0.7, per_shard_s=0.002),
    "local_sgd": sgd_cost.LocalSGDFitted(checkpoint_s=0.3),
}


def test_shards_go_to_nodes_without_workers_first_then_one_per_worker_node():
    nodes = ["a", "b", "c", "d", "e", "f"]
    workers = ["a", "b", "c", "d"]
    assert shard_nodes(1, nodes, workers) == ["e"]
    assert shard_nodes(2, nodes, workers) == ["e", "f"]
    assert shard_nodes(4, nodes, workers) == ["e", "f", "a", "b"]
    assert shard_nodes(8, nodes, workers) == ["e", "f", "a", "b", "c", "d", "e", "f"]
    assert shard_nodes(2, ["a", "b"], ["a", "a", "b"]) == ["b", "a"]  # the node with fewer workers first
    assert shard_nodes(3, [], []) == []


def test_the_fan_in_one_shard_takes_every_push_through_one_link():
    workers, shards = ps_cost.ps_placement(cm.Setting("async", 4, 250_000, 100, nodes=6).with_options(servers=1))
    assert shards == [4]
    loads = ps_cost.ps_link_loads(G, workers, shards)
    assert loads[4] == pytest.approx((G, G))  # each step: G of pushes in, G of fetches out
    assert all(loads[w] == pytest.approx((G / 4, G / 4)) for w in workers)


def test_more_shards_divide_the_busiest_link():
    busiest = {}
    for servers in (1, 2, 4):
        setting = cm.Setting("async", 4, 250_000, 100, nodes=6).with_options(servers=servers)
        workers, shards = ps_cost.ps_placement(setting)
        busiest[servers] = max(max(io) for io in ps_cost.ps_link_loads(G, workers, shards).values())
    # Two free nodes: G/2 each. Four shards, two on worker nodes: such a node takes 3 workers' pushes of G/4
    # (3/4 of the steps) and its own worker's fetches from 3 remote shards (1/4 of the steps): 3G/16 + 3G/16.
    assert busiest == pytest.approx({1: G, 2: G / 2, 4: 0.375 * G})


def test_ring_allreduce_and_fsdp_volumes():
    assert cm.ring_allreduce_bytes(G, 1) == 0
    assert cm.ring_allreduce_bytes(G, 4) == pytest.approx(1.5 * G)
    params = 250_000
    sync = cm.network_bytes(cm.Setting("sync", 4, params, 1000))
    nccl = cm.Setting("fsdp", 4, params, 1000, backend="nccl")
    assert cm.network_bytes(nccl) == pytest.approx(1.5 * sync)
    assert cm.network_bytes(nccl.with_options(reshard_after_forward=False)) == pytest.approx(sync)
    # gloo's reduce-scatter moves an all-reduce's bytes: one more G x (n-1)/n per step
    assert cm.network_bytes(replace(nccl, backend="gloo")) == pytest.approx(2 * sync)
    local_sgd = cm.Setting("local_sgd", 4, params, 1000).with_options(sync_every=8)
    assert cm.network_bytes(local_sgd) == pytest.approx(sync / 8)


def test_a_runs_setting_holds_the_options_its_strategys_cost_terms_declare_and_no_others():
    run = {"workers": 4, "params": 100_000, "link_mbit": 100, "servers": 2, "sync_every": 4, "averaging": "ring"}
    local = cm.setting_of({**run, "strategy": "local_sgd", "checkpoint_every": 37})
    assert local.options == sgd_cost.LocalSGDOptions(sync_every=4, averaging="ring", checkpoint_every=37)
    assert cm.setting_of({**run, "strategy": "async"}).options == ps_cost.AsyncPSOptions(servers=2)
    # A key the run lacks, or holds as None, is the option's default.
    bare = cm.setting_of({**run, "strategy": "local_sgd", "sync_every": None, "averaging": None})
    assert bare.options == sgd_cost.LocalSGDOptions() and bare == cm.Setting("local_sgd", 4, 100_000, 100)
    # Sync declares none of them: its runs are one setting (one group in `usable`) whatever those keys say.
    sync = cm.setting_of({**run, "strategy": "sync", "checkpoint_every": 37})
    assert sync == cm.Setting("sync", 4, 100_000, 100) and hash(sync) == hash(cm.Setting("sync", 4, 100_000, 100))
    fit = cm.Fit(0.9, {"sync": 0.02, "local_sgd": 0.02}, 100_000, own_fits=OWN)
    assert cm.step_s(fit, local) != cm.step_s(fit, local.with_options(sync_every=8, checkpoint_every=0))
    for name in cm.modelled():  # frozen, so that a Setting stays hashable and a Fit's entries are not shared state
        assert all(kind.__dataclass_params__.frozen for kind in (cm.terms(name).options, cm.terms(name).fitted))


def test_the_fits_dict_holds_each_strategys_own_parameters_flat_under_names_no_other_uses():
    fit = cm.Fit(0.8, {"sync": 0.02}, 100_000, own_fits=OWN, fitted_on=["a run"])
    assert fit.to_dict() == {
        "efficiency": 0.8,
        "base_s": {"sync": 0.02},
        "base_params": 100_000,
        "latency_s": 50e-6,
        "ps_efficiency": 0.7,
        "checkpoint_s": 0.3,
        "per_shard_s": 0.002,
        "fitted_on": ["a run"],
    }
    assert cm.Fit(0.8, {}, 1).to_dict()["per_shard_s"] == 0.0  # nothing fitted: the defaults
    own = [f.name for name in cm.modelled() for f in fields(cm.terms(name).fitted)]
    assert len(own) == len(set(own)) and not set(own) & {f.name for f in fields(cm.Fit)}


def _synthetic_points(truth: cm.Fit) -> list[dict]:
    points = []
    for link in (100, 1000):
        for strategy, every in (("sync", 0), ("local_sgd", 37), ("fsdp", 0)):
            s = cm.Setting(strategy, 4, 100_000, link, nodes=6)
            s = s.with_options(checkpoint_every=every) if every else s
            points.append(
                {
                    "strategy": strategy,
                    "workers": 4,
                    "params": 100_000,
                    "link_mbit": link,
                    "nodes": 6,
                    "checkpoint_every": every,
                    "steps_per_s": cm.steps_per_s(truth, s),
                }
            )
        for servers in (1, 2, 4):
            s = cm.Setting("async", 4, 100_000, link, nodes=6).with_options(servers=servers)
            points.append(
                {
                    "strategy": "async",
                    "workers": 4,
                    "params": 100_000,
                    "link_mbit": link,
                    "nodes": 6,
                    "servers": servers,
                    "steps_per_s": cm.steps_per_s(truth, s),
                }
            )
    s = cm.Setting("local_sgd", 4, 100_000, 100, nodes=6)  # no checkpoints
    points.append(
        {
            "strategy": "local_sgd",
            "workers": 4,
            "params": 100_000,
            "link_mbit": 100,
            "nodes": 6,
            "steps_per_s": cm.steps_per_s(truth, s),
        }
    )
    return points


def test_the_fit_recovers_the_parameters_that_made_the_points():
    # 100k parameters: at 1 Gbit/s even one shard's link does not bound async (the fit assumes that there).
    truth = cm.Fit(
        0.8,
        {"sync": 0.02, "local_sgd": 0.02, "async": 0.01, "fsdp": 0.03},
        100_000,
        own_fits=OWN,
    )
    fit, checks = cm.validate(_synthetic_points(truth))
    assert fit.efficiency == pytest.approx(0.8) and fit.fitted("async").ps_efficiency == pytest.approx(0.7)
    assert fit.base_s == pytest.approx(truth.base_s) and fit.fitted("async").per_shard_s == pytest.approx(0.002)
    assert fit.fitted("local_sgd").checkpoint_s == pytest.approx(0.3)
    # Held out: FSDP and async with 2 and 4 shards at 100 Mbit/s, async with 2 at 1 Gbit/s, local SGD unsaved.
    assert len(checks) == 5 and all(abs(c.error) < 1e-6 for c in checks), cm.validation_table(checks)


def test_another_model_is_predicted_from_its_own_sync_run_as_plan_compute_ms_does():
    """A model of another kind (compute not in proportion to parameters): its sync run at the top rate gives its
    compute per step; the others are predicted from it, and are never fitted on."""
    truth = cm.Fit(
        0.8,
        {"sync": 0.02, "local_sgd": 0.02, "async": 0.01, "fsdp": 0.03},
        100_000,
        own_fits=OWN,
    )
    gpt = cm.with_compute(truth, 40_000, 0.05)  # 40k parameters, yet 50 ms a step
    assert cm.base_for(gpt, cm.Setting("sync", 4, 40_000, 100)) == pytest.approx(0.05)
    assert cm.base_for(gpt, cm.Setting("fsdp", 4, 40_000, 100)) == pytest.approx(0.075)  # sync's ratio kept
    others = []
    for link in (100, 1000):
        for strategy in ("sync", "local_sgd", "fsdp"):
            s = cm.Setting(strategy, 4, 40_000, link, nodes=6)
            others.append(
                {
                    "strategy": strategy,
                    "workers": 4,
                    "params": 40_000,
                    "link_mbit": link,
                    "nodes": 6,
                    "model": "gpt",
                    "steps_per_s": cm.steps_per_s(gpt, s),
                }
            )
    plain = cm.validate(_synthetic_points(truth))
    fit, checks = cm.validate(_synthetic_points(truth) + others)
    assert fit.base_s == pytest.approx(truth.base_s) and fit.fitted_on == plain[0].fitted_on
    mine = [c for c in checks if " gpt " in c.point]
    assert len(mine) == 5 and all(abs(c.error) < 1e-6 for c in mine), cm.validation_table(checks)
    assert "sync, gpt 0.04M params @ 1000 Mbit/s" not in [c.point for c in mine]  # the anchor


def test_repeated_runs_of_one_setting_count_once_at_their_mean():
    run = {"strategy": "sync", "workers": 4, "params": 100_000, "link_mbit": 100, "nodes": 6, "steps_per_s": 9.0}
    merged = cm.usable(
        [
            run,
            {**run, "steps_per_s": 11.0},
            {**run, "link_mbit": 1000, "steps_per_s": 50.0},
            {**run, "straggler": True, "steps_per_s": 2.0},
        ]
    )
    assert [(p["link_mbit"], p["steps_per_s"], p["runs"], p["spread"]) for p in merged] == [
        (100, 10.0, 2, (9.0, 11.0)),
        (1000, 50.0, 1, (50.0, 50.0)),
    ]


def test_the_fit_refuses_points_it_cannot_fit():
    with pytest.raises(ValueError, match="two link rates"):
        cm.fit([{"strategy": "sync", "workers": 4, "params": 10, "link_mbit": 100, "steps_per_s": 1.0}])


def test_plan_on_a_slow_link_prefers_less_communication_and_shards_the_ps():
    fit = cm.Fit(0.9, {"sync": 0.02, "local_sgd": 0.02, "async": 0.02, "fsdp": 0.03}, 1_000_000)
    rows = plan_cmd.plan(fit, plan_cmd.Question(25_000_000, [1000], [8, 64], 32))
    assert all(r["choose"] == "local_sgd" for r in rows)  # 100 MB of gradients over 1 Gbit/s
    shards = [r["strategies"]["async"]["shards"] for r in rows]
    assert shards[0] > 1 and shards[1] > shards[0]  # the more workers, the more shards the fan-in needs


def test_runs_at_another_worker_count_are_held_out_and_predicted():
    truth = cm.Fit(
        0.8,
        {"sync": 0.02, "local_sgd": 0.02, "async": 0.03, "fsdp": 0.05},
        100_000,
        own_fits={
            "async": ps_cost.AsyncPSFitted(ps_efficiency=0.6, per_shard_s=0.004),
            "local_sgd": sgd_cost.LocalSGDFitted(checkpoint_s=0.05),
        },
    )
    others = []
    for workers in (2, 3):
        for strategy in ("sync", "fsdp"):
            s = cm.Setting(strategy, workers, 100_000, 100, nodes=6)
            others.append(
                {
                    "strategy": strategy,
                    "workers": workers,
                    "params": 100_000,
                    "link_mbit": 100,
                    "nodes": 6,
                    "steps_per_s": cm.steps_per_s(truth, s),
                }
            )
    fit, checks = cm.validate(_synthetic_points(truth) + others)
    assert all(", 4 workers," in f for f in fit.fitted_on)  # the most common count is fitted on, the rest checked
    mine = [c for c in checks if ", 4 workers," not in c.point]
    assert len(mine) == 4 and all(abs(c.error) < 1e-6 for c in mine), cm.validation_table(checks)


def test_plan_says_how_far_beyond_the_measured_workers_it_is_and_widens_its_answer():
    reach = cm.Validated(min_workers=2, max_workers=4, max_error=0.2)
    assert reach.beyond(3) == 1 and reach.beyond(8) == 2 and reach.beyond(512) == 128 and reach.beyond(1) == 2
    assert reach.factor(4) == pytest.approx(1.2) and reach.factor(8) == pytest.approx(1.4)
    assert reach.factor(64) == pytest.approx(2.0)
    fit = cm.Fit(0.9, {"sync": 0.02, "local_sgd": 0.02, "async": 0.02, "fsdp": 0.03}, 1_000_000)
    rows = plan_cmd.plan(fit, plan_cmd.Question(1_000_000, [100_000], [4, 512], 32, validated=reach))
    near, far = rows
    assert near["within_factor"] == pytest.approx(1.2) and far["within_factor"] == pytest.approx(2.6)
    # 4 MB of gradients on 100 Gbit/s: FSDP's larger base sets it apart where it was measured; far out, the model
    # cannot rank any of them
    assert "fsdp" not in [near["choose"], *near["or_within_factor"]] and len(far["or_within_factor"]) == 3
    assert "| 512 | 128x | 2.6x |" in plan_cmd.markdown(rows)


@pytest.mark.skipif(not plan_cmd.DEFAULT_MEASURED.is_file(), reason="no measured runs shipped")
def test_the_shipped_fit_predicts_the_held_out_mlp_runs_within_40_percent_at_its_worker_count():
    """The MLP the fit saw, at other sizes, links and settings with the 4 workers it was fitted on: within 40%, one
    run per setting on 2 cores shared by 6 hosts (the worst, 36%, a run slower than the same with more work: the
    cores' noise). Its runs at 2 and 3 workers and examples/tinygpt's rows (another kind of model, anchored on its
    sync run) are in the table as measured: docs/costmodel.md says where they miss, and plan's factor covers the
    largest miss."""
    points = plan_cmd.load_points(plan_cmd.DEFAULT_MEASURED)
    fit, checks = cm.validate(points)
    mlp = [c for c in checks if "tinygpt" not in c.point]
    fitted_count = [c for c in mlp if ", 4 workers," in c.point]
    assert len(fitted_count) >= 5 and len(checks) - len(mlp) == 7
    assert {c.point.split(", ")[1] for c in mlp} == {"2 workers", "3 workers", "4 workers"}
    worst = max(fitted_count, key=lambda c: abs(c.error))
    assert abs(worst.error) <= 0.40, cm.validation_table(checks)
    reach = cm.validated(points, checks)
    assert (reach.min_workers, reach.max_workers) == (2, 4)
    assert reach.max_error == pytest.approx(max(abs(c.error) for c in mlp))
    table = (REPO / "docs" / "costmodel.md").read_text()
    assert cm.validation_table(checks) in table, (
        "docs/costmodel.md's validation table is stale: paste `raydist plan --validate`"
    )


def test_raydist_plan_prints_a_table_and_json():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "raydist.cli",
            "plan",
            "--params",
            "10M",
            "--nodes",
            "8,512",
            "--link-mbit",
            "1000",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    if not plan_cmd.DEFAULT_MEASURED.is_file():
        pytest.skip("no measured runs shipped")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["plan"]
    assert [r["nodes"] for r in rows] == [8, 512] and all(r["choose"] in cm.modelled() for r in rows)


@pytest.mark.skipif(not plan_cmd.DEFAULT_MEASURED.is_file(), reason="no measured runs shipped")
def test_the_docs_plan_table_is_what_raydist_plan_prints():
    out = subprocess.run(
        [sys.executable, "-m", "raydist.cli", "plan", "--params", "25M", "--nodes", "8,64,512", "--compute-ms", "40"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    table = "\n".join(line for line in out.stdout.splitlines() if line.startswith("|"))
    assert table in (REPO / "docs" / "costmodel.md").read_text(), (
        "docs/costmodel.md's plan table is stale: paste `raydist plan --params 25M --nodes 8,64,512 --compute-ms 40`"
    )
