"""The strategy registry: every entry is runnable, every job starts the same way, exit statuses mean one thing."""

from __future__ import annotations

import pytest

from jobutil import REPO
from raydist import registry
from raydist.config import Config, job_defaults, load_config
from raydist.train import Strategy


@pytest.mark.parametrize("name", registry.jobs())
def test_every_job_has_a_driver_a_script_and_valid_defaults(name):
    spec = registry.get(name)
    assert callable(spec.load("driver")) and callable(spec.load("check"))
    if spec.worker:
        assert issubclass(spec.load("worker"), Strategy) and spec.load("worker").name == name
    assert (REPO / "jobs" / f"{name}.py").is_file()
    cfg = load_config(job_defaults(name), job=name)
    assert cfg.run.name == f"{name}-{cfg.data.name}"


def test_compare_accepts_exactly_the_registered_strategies():
    cfg = load_config(None, [], [f"compare.strategies={','.join(registry.names())}"])
    assert cfg.compare.strategy_list == registry.names()


def test_job_yamls_hold_only_what_differs_from_the_defaults():
    import yaml

    defaults = Config().to_dict()
    shipped = set((REPO / "raydist").rglob("*.yaml"))
    named = {spec.defaults for spec in registry.all_specs() if spec.defaults}
    assert shipped == named, f"YAML files no registry entry names: {shipped - named}; missing: {named - shipped}"
    for path in named:
        for section, keys in (yaml.safe_load(path.read_text()) or {}).items():
            for key, value in keys.items():
                assert defaults[section][key] != value, f"{path.name}: {section}.{key} repeats the default"


@pytest.mark.slow
def test_a_training_failure_is_one_line_and_exit_1(tmp_path):
    from jobutil import run_job

    # A failure inside the workers: rank 0 cannot open its metrics log, which is in the way as a directory.
    (tmp_path / "broken" / "metrics.jsonl").mkdir(parents=True)
    proc = run_job("sync", f"run.storage_path={tmp_path}", "run.name=broken", "train.max_steps=4",
                   "scaling.max_failures=0")
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("raydist: error:")]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-3000:]
    assert "training failed" in lines[0] and "metrics.jsonl" in lines[0], lines


def test_docs_summary_field_table_matches_the_dataclass():
    from raydist.summary import fields_markdown

    docs = (REPO / "docs" / "strategies.md").read_text()
    assert fields_markdown() in docs, "docs/strategies.md's summary table is stale: paste `python -m raydist.summary`"
