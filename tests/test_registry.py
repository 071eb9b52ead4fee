"""The strategy registry: every entry is runnable, every job starts the same way, exit statuses mean one thing."""

from __future__ import annotations

import pytest

from raydist import registry
from raydist.config import Config, job_defaults, load_config
from raydist.train import Strategy
from tests.support.jobutil import REPO


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
@pytest.mark.shared_ray
def test_a_training_failure_is_one_line_and_exit_1(tmp_path):
    from tests.support.jobutil import run_job

    # A failure inside the workers: rank 0 cannot open its metrics log, which is in the way as a directory.
    (tmp_path / "broken" / "metrics.jsonl").mkdir(parents=True)
    proc = run_job(
        "sync", f"run.storage_path={tmp_path}", "run.name=broken", "train.max_steps=4", "scaling.max_failures=0"
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("raydist: error:")]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-3000:]
    assert "training failed" in lines[0] and "metrics.jsonl" in lines[0], lines


def test_docs_summary_field_table_matches_the_dataclass():
    from raydist.summary import fields_markdown

    docs = (REPO / "docs" / "strategies.md").read_text()
    assert fields_markdown() in docs, "docs/strategies.md's summary table is stale: paste `python -m raydist.summary`"


@pytest.mark.parametrize("name", registry.names())
def test_every_part_a_registry_entry_names_is_where_it_says(name):
    import dataclasses

    from raydist.planning.costmodel import CostTerms

    spec = registry.get(name)
    if spec.config:
        assert dataclasses.is_dataclass(spec.load("config")) and spec.section in Config().to_dict()
    if spec.summary_fields:
        assert dataclasses.is_dataclass(spec.load("summary_fields"))
    if spec.cost:
        assert issubclass(spec.load("cost"), CostTerms)
    if spec.metrics:
        from raydist.observability.metric import Metric
        from raydist.observability.ray_metrics import COMMON

        own = spec.load("metrics")
        assert own and all(isinstance(m, Metric) for m in own)
        assert not {m.name for m in own} & {m.name for m in COMMON}, "a strategy's metric may not shadow a common one"
    if spec.torch_config or spec.unfit:
        assert all(callable(spec.load(what)) for what in ("torch_config", "unfit") if getattr(spec, what))
    assert (spec.fallback in registry.names() and spec.fallback != name) if spec.unfit else not spec.fallback
    parts = [spec.worker, spec.config, spec.cost, spec.summary_fields, spec.metrics, spec.torch_config, spec.unfit]
    assert all(p.startswith("raydist.strategies.") for p in parts if p), "a strategy's parts live in its folder"


NEW_STRATEGY = """
import dataclasses, sys, types
from raydist import registry
from raydist.typedconfig import opt

toy = types.ModuleType("toy_strategy")
@dataclasses.dataclass
class ToyConfig:
    rounds: int = opt(3, "rounds per step", ge=1)
@dataclasses.dataclass
class ToyBooks:
    toy_rounds_done: int | None = dataclasses.field(default=None, metadata={"help": "toy: rounds done"})
toy.ToyConfig, toy.ToyBooks = ToyConfig, ToyBooks
sys.modules["toy_strategy"] = toy
registry.STRATEGIES["toy"] = registry.StrategySpec(
    "toy", "toy", "a strategy added by one registry entry", worker="raydist.strategies.sync.worker:SyncDDP",
    section="toy", config="toy_strategy:ToyConfig", summary_fields="toy_strategy:ToyBooks")

from raydist.jobconfig import SHARED_SECTIONS
from raydist.config import load_config
from raydist.summary import JobSummary, fields_markdown
from raydist.typedconfig import reference_markdown

cfg = load_config(None, [], ["toy.rounds=5", "compare.strategies=sync,toy"], job="toy")
assert cfg.toy.rounds == 5 and cfg.run.name == "toy-digits" and cfg.compare.strategy_list == ["sync", "toy"]
assert "toy" in SHARED_SECTIONS
assert "`toy.rounds`" in reference_markdown(type(cfg))
assert "`toy_rounds_done`" in fields_markdown() and JobSummary.__dataclass_fields__["toy_rounds_done"]
print("ok")
"""


def test_a_new_strategy_needs_only_its_folder_and_one_registry_entry():
    """Config (its section, --set, the reference), compare (the sections its jobs share, compare.strategies) and
    the summary (its fields) all follow one added entry; nothing else is edited."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", NEW_STRATEGY], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
