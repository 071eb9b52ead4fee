"""The tables README and docs/ quote are the stored results (docs/data/*.json) as the benchmarks print them: a
benchmark re-run that changes a figure fails here until the docs are pasted again."""

from __future__ import annotations

import json

import pytest

from tests.support.jobutil import REPO, load_benchmark

DATA = REPO / "docs" / "data"


FOOTPRINT_CASES = ("thread", "arena", "runlist", "helpers", "warm", "prestart")
"""benchmarks/footprint_ab.py's cases that docs/benchmarks.md quotes."""


def _doc(name: str) -> str:
    return (REPO / "docs" / name).read_text()


def test_the_shaped_links_tables_are_the_stored_runs():
    shaped = load_benchmark("shaped_strategies")
    stored = json.loads((DATA / "shaped_runs.json").read_text())
    text = _doc("benchmarks.md")
    assert shaped.fanin_table(stored["points"], stored["hosts"]) in text, (
        "docs/benchmarks.md's fan-in table is stale: paste `python -m benchmarks.shaped_strategies --report`"
    )
    assert shaped.strategies_table(stored["points"]) in text, (
        "docs/benchmarks.md's time-to-target table is stale: paste `python -m benchmarks.shaped_strategies --report`"
    )


@pytest.mark.parametrize("data", ["more_hosts.json", "three_workers.json"])
def test_the_cores_against_hosts_tables_are_the_stored_runs(data):
    shaped = load_benchmark("shaped_strategies")
    stored = json.loads((DATA / data).read_text())
    assert shaped.hosts_table(stored["points"], stored["hosts"]) in _doc("costmodel.md"), (
        f"docs/costmodel.md is stale: paste the last table of `python -m benchmarks.shaped_strategies --report docs/data/{data}`"
    )


def test_the_checkpoint_chaos_lines_are_the_stored_run():
    chaos = load_benchmark("checkpoint_chaos")
    stored = json.loads((DATA / "checkpoint_chaos.json").read_text())
    assert chaos.report(stored) in _doc("checkpoints.md"), (
        "docs/checkpoints.md's chaos lines are stale: paste `python -m benchmarks.checkpoint_chaos --report`"
    )
    assert stored["machine"]["cpus"] and stored["commit"]


def test_the_suite_time_readme_and_testing_md_quote_is_the_stored_run():
    stored_path = DATA / "suite_time.json"
    if not stored_path.exists():
        pytest.skip("no suite time stored yet: python -m benchmarks.suite_time --out docs/data/suite_time.json")
    line = load_benchmark("suite_time").report(json.loads(stored_path.read_text()))
    for doc in (REPO / "README.md", REPO / "docs" / "dev" / "testing.md"):
        assert line in doc.read_text(), f"{doc.name} is stale: paste `python -m benchmarks.suite_time --report`"


def test_the_shared_head_lines_are_the_stored_rounds():
    stored = json.loads((DATA / "shared_head.json").read_text())
    assert load_benchmark("shared_head").report(stored) in _doc("dev/testing.md"), (
        "docs/dev/testing.md's shared-head lines are stale: paste `python -m benchmarks.shared_head --report`"
    )
    assert len(stored["rounds"]) >= 3 and stored["machine"]["cpus"] and stored["commit"]


def test_the_sync_against_torchrun_tables_and_readmes_make_run_figure_are_the_stored_rounds():
    bench = load_benchmark("sync_vs_torchrun")
    stored = json.loads((DATA / "sync_vs_torchrun.json").read_text())
    for table in bench.report(stored).strip("\n").split("\n\n"):
        assert table in _doc("benchmarks.md"), (
            "docs/benchmarks.md's start-up tables are stale: paste `python -m benchmarks.sync_vs_torchrun --report`"
        )
    assert bench.make_run_line(stored) in (REPO / "README.md").read_text()
    assert bench.launch_engine_line(stored) in (REPO / "README.md").read_text()
    assert all(r["again_reported"] for r in stored["rounds"]) and stored["machine"]["cpus"] and stored["commit"]


def test_the_warm_cluster_first_step_table_is_the_stored_rounds():
    bench = load_benchmark("first_step")
    stored = json.loads((DATA / "first_step.json").read_text())
    assert bench.report(stored).strip("\n") in _doc("benchmarks.md"), (
        "docs/benchmarks.md's warm-cluster table is stale: paste `python -m benchmarks.first_step --report`"
    )
    assert stored["machine"]["cpus"] and stored["commit"]


def test_the_bring_up_lines_are_the_stored_runs():
    bench = load_benchmark("bringup")
    stored = json.loads((DATA / "bringup.json").read_text())
    assert bench.report(stored) in _doc("benchmarks.md"), (
        "docs/benchmarks.md's bring-up lines are stale: paste `python -m benchmarks.bringup --report`"
    )
    assert stored["machine"]["cpus"] and stored["commit"]


def test_the_training_chaos_lines_are_the_stored_runs():
    chaos = load_benchmark("train_chaos")
    stored = json.loads((DATA / "train_chaos.json").read_text())
    assert chaos.report(stored) in _doc("faults.md"), (
        "docs/faults.md's chaos lines are stale: paste `python -m benchmarks.train_chaos --report`"
    )
    assert chaos.ok(stored) and stored["disturbed"]["kills"] == 5 and stored["commit"]


def test_the_heal_against_restart_lines_are_the_stored_runs():
    bench = load_benchmark("heal_vs_restart")
    stored = json.loads((DATA / "heal_vs_restart.json").read_text())
    assert bench.report(stored) in _doc("faults.md"), (
        "docs/faults.md's heal against restart lines are stale: paste `python -m benchmarks.heal_vs_restart --report`"
    )
    assert bench.ok(stored) and stored["kills"] == 2 and len(stored["rounds"]) == 2 and stored["commit"]


def test_the_parameter_server_chaos_tables_are_the_stored_runs():
    chaos = load_benchmark("ps_chaos")
    stored = json.loads((DATA / "ps_chaos.json").read_text())
    assert chaos.report(stored) in _doc("faults.md"), (
        "docs/faults.md's parameter-server chaos tables are stale: paste `python -m benchmarks.ps_chaos --report`"
    )
    assert stored["ok"] and len(stored["kills"]) == 6 and stored["commit"]


@pytest.mark.parametrize(
    "bench, data, doc",
    [
        ("strategies_compare", "strategies_compare.json", "strategies.md"),
        ("strategies_tuned", "strategies_tuned.json", "strategies.md"),
        ("fsdp_memory", "fsdp_memory.json", "strategies.md"),
        ("gloo_bytes", "gloo_bytes.json", "strategies.md"),
        ("gloo_bytes", "gloo_bytes.json", "costmodel.md"),
        ("metrics_cost", "metrics_cost.json", "observability.md"),
        ("desync_cost", "desync_cost.json", "faults.md"),
        ("desync_cost", "desync_cost_large.json", "faults.md"),
        ("doctor_allreduce", "doctor_allreduce.json", "doctor.md"),
        ("startup_before_after", "startup_before_after.json", "dev/startup-changes.md"),
        ("startup_before_after", "lean_trainer.json", "dev/startup-changes.md"),
        ("startup_before_after", "job_server_preload.json", "dev/startup-changes.md"),
        ("startup_before_after", "fast_exit.json", "dev/startup-changes.md"),
        ("startup_before_after", "driver_imports.json", "dev/startup-changes.md"),
        ("startup_before_after", "warm_before_checks.json", "dev/startup-changes.md"),
        ("startup_before_after", "driver_without_torch.json", "dev/startup-changes.md"),
        ("startup_before_after", "ray_deps_preload.json", "dev/startup-changes.md"),
        ("startup_before_after", "driver_context_without_torch.json", "dev/startup-changes.md"),
        ("startup_before_after", "worker_setup_without_ray.json", "dev/startup-changes.md"),
        ("startup_before_after", "dynamo_preload.json", "dev/startup-changes.md"),
        ("footprint_sync", "footprint_sync.json", "benchmarks.md"),
        ("footprint_sync", "footprint_sync_tiny.json", "benchmarks.md"),
        ("footprint_sync", "footprint_sync_long.json", "benchmarks.md"),
        ("footprint_cluster", "footprint_cluster.json", "benchmarks.md"),
        *(("footprint_ab", f"footprint_ab_{case}.json", "benchmarks.md") for case in FOOTPRINT_CASES),
        ("bytecode", "bytecode.json", "dev/testing.md"),
        ("setup_time", "setup_time.json", "dev/testing.md"),
    ],
)
def test_a_benchmarks_stored_report_is_what_the_doc_quotes(bench, data, doc):
    stored = json.loads((DATA / data).read_text())
    text = load_benchmark(bench).report(stored)
    assert text.strip("\n") in _doc(doc), (
        f"docs/{doc} is stale: paste `benchmarks/{bench}.py --report docs/data/{data}`"
    )
    assert stored["machine"]["cpus"] and stored["commit"]


def test_the_save_cost_table_is_the_stored_run():
    stored = json.loads((DATA / "save_cost.json").read_text())
    assert load_benchmark("checkpoint_chaos").save_cost_report(stored).strip("\n") in _doc("checkpoints.md"), (
        "docs/checkpoints.md's save-cost table is stale: paste `python -m benchmarks.checkpoint_chaos --report "
        "docs/data/save_cost.json`"
    )


def test_the_slurm_resilience_table_is_the_stored_rounds():
    stored = json.loads((DATA / "slurm_resilience.json").read_text())
    table = load_benchmark("slurm_resilience").report(stored).strip("\n")
    for doc in ("benchmarks.md", "slurm.md"):
        assert table in _doc(doc), f"docs/{doc} is stale: paste `python -m benchmarks.slurm_resilience --report`"
    assert all(r["resumed_from_step"] == r["stopped_at"] for s in ("sync", "async") for r in stored[s])


def test_every_stored_result_is_listed_with_its_benchmark_and_names_a_commit():
    table = _doc("benchmarks.md").split("| file | written by | quoted in |")[1].split("\n\n")[0]

    def commits(value) -> list:
        if isinstance(value, dict):
            return ([value["commit"]] if "commit" in value else []) + [c for v in value.values() for c in commits(v)]
        return [c for v in value for c in commits(v)] if isinstance(value, list) else []

    for path in sorted(DATA.glob("*.json")):
        stem = path.stem.removesuffix("_large")
        assert path.name in table or f"`{stem}*.json`" in table, f"{path.name} is not in docs/benchmarks.md's table"
        assert commits(json.loads(path.read_text())), f"{path.name} names no commit"


def test_train_startup_split_reads_the_raylet_and_controller_logs(tmp_path):
    """benchmarks/train_startup_split.py on a session laid out as Ray 2.60 writes it (lines copied in form)."""
    import json

    from benchmarks.train_startup_split import split

    (tmp_path / "logs" / "train").mkdir(parents=True)
    started = "[2026-11-24 04:03:{} I 2512 2512] (raylet) worker_pool.cc:564: Started worker process with pid {}\n"
    (tmp_path / "logs" / "raylet.out").write_text(
        started.format("32,309", 2609) + started.format("32,311", 2610) + started.format("33,555", 2681)
    )
    messages = [
        ("36,088", "No checkpoint manager snapshot found."),
        ("37,385", "PlacementGroupCleaner launched for run_id=x"),
        ("38,841", "[State Transition] INITIALIZING -> SCHEDULING."),
        ("40,846", "[Worker Group Initialization] 2 worker actors created in 1.97s."),
        ("43,299", "[Worker Group Initialization] Train context initialized on workers in 2.44s."),
        ("44,088", "[State Transition] SCHEDULING -> RUNNING."),
    ]
    (tmp_path / "logs" / "train" / "ray-train-sys-controller-61ae.log").write_text(
        "".join(json.dumps({"asctime": f"2026-11-24 04:03:{t}", "message": m}) + "\n" for t, m in messages)
    )
    got = split(str(tmp_path))
    assert got == pytest.approx(
        {
            "controller process starts": 1.246,
            "controller set-up": 2.533,
            "state actor": 1.297,
            "placement-group cleaner": 1.456,
            "worker actors": 1.97,
            "train context and synchronization actor": 2.44,
            "process group, callbacks, launch": 0.789,
        },
        abs=1e-3,
    )
    # raydist's runs start no placement-group cleaner (raydist.engines.raytrain_trainer): the state actor's step runs on
    (tmp_path / "logs" / "train" / "ray-train-sys-controller-61ae.log").write_text(
        "".join(
            json.dumps({"asctime": f"2026-11-24 04:03:{t}", "message": m}) + "\n"
            for t, m in messages
            if "Cleaner" not in m
        )
    )
    got = split(str(tmp_path))
    assert "placement-group cleaner" not in got and got["state actor"] == pytest.approx(2.753, abs=1e-3), got


def test_the_footprint_table_is_the_stored_run():
    stored = json.loads((DATA / "footprint.json").read_text())
    assert load_benchmark("footprint").report(stored) in _doc("running.md"), (
        "docs/running.md is stale: paste `python -m benchmarks.footprint --report docs/data/footprint.json`"
    )


def test_the_sweep_table_is_the_stored_run():
    stored = json.loads((DATA / "tune_sweep.json").read_text())
    assert load_benchmark("tune_sweep").report(stored) in _doc("tune.md"), (
        "docs/tune.md is stale: paste `python -m benchmarks.tune_sweep --report docs/data/tune_sweep.json`"
    )
