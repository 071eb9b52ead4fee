"""The config users write: defaults, files, --set overrides, and one-line refusals of bad input."""

from __future__ import annotations

import re

import pytest

from raydist import registry
from raydist.config import Config, job_defaults, load_config
from raydist.config_command import refreshed
from raydist.errors import ConfigError
from raydist.typedconfig import reference_markdown
from tests.support.jobutil import REPO


def test_job_defaults_load_and_validate():
    cfg = load_config(job_defaults("sync"))
    assert cfg.data.name == "digits" and cfg.scaling.num_workers == 2
    assert cfg.scaling.resolved_backend == "gloo"


def test_overrides_and_files_merge_in_order(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("optim:\n  lr: 1e-3\ntrain:\n  epochs: 3\n")
    cfg = load_config(job_defaults("sync"), [f], ["train.epochs=5", "scaling.use_gpu=true", "model.name=cnn"])
    assert cfg.optim.lr == pytest.approx(1e-3)  # YAML reads 1e-3 as a string; the float field takes it
    assert cfg.train.epochs == 5 and cfg.scaling.use_gpu is True and cfg.model.name == "cnn"
    assert cfg.scaling.resolved_backend == "nccl"


def test_a_choice_yaml_reads_as_a_boolean_is_taken_as_written(tmp_path):
    # YAML 1.1 reads `off` as false: `--set train.mixed_precision=off` was refused before (found on a GPU machine)
    assert load_config(job_defaults("sync"), [], ["train.mixed_precision=off"]).train.mixed_precision == "off"
    f = tmp_path / "fp32.yaml"
    f.write_text("train:\n  mixed_precision: off\n")
    assert load_config(job_defaults("sync"), [f]).train.mixed_precision == "off"
    with pytest.raises(ConfigError, match="train.mixed_precision: must be one of auto, bf16, off"):
        load_config(job_defaults("sync"), [], ["train.mixed_precision=on"])


def test_round_trip_through_dict_is_identity():
    cfg = load_config(job_defaults("sync"), [], ["train.seed=7"])
    assert Config.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.epochz=3", "unknown key 'train.epochz'"),
        ("optim.lr=-0.1", "optim.lr: must be > 0"),
        ("train.batch_size=many", "train.batch_size: must be an integer"),
        ("scaling.use_gpu=maybe", "scaling.use_gpu: must be true or false"),
        ("model.name=resnet", "model.name: must be one of"),
        ("scaling.backend=nccl", "nccl needs GPUs"),
        ("data.name=synthetic", None),  # valid alone ...
    ],
)
def test_bad_overrides_are_refused_by_name(override, message):
    if message is None:
        load_config(job_defaults("sync"), [], [override])
        return
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config(job_defaults("sync"), [], [override])


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.batch_size=0", "train.batch_size: must be >= 1 (got 0)"),
        ("model.dropout=1.5", "model.dropout: must be in [0, 1) (got 1.5)"),
        ("optim.lr=-0.1", "optim.lr: must be > 0 (got -0.1)"),
        ("async_ps.max_staleness=-2", "async_ps.max_staleness: must be >= 0, or -1 for unbounded (got -2)"),
        ("straggler.worker=2", "straggler.worker: must be below scaling.num_workers=2 (got 2)"),
        ("run.name=a/b", "run.name: must not contain '/'"),
        (
            "compare.strategies=sync,bogus",
            "compare.strategies: unknown strategy 'bogus' (choose from sync, local_sgd, async, fsdp, heal)",
        ),
    ],
)
def test_declared_bounds_and_checks_give_one_message(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [], [override])
    assert str(e.value).startswith(message)


def test_special_values_pass_their_bounds():
    cfg = load_config(None, [], ["async_ps.max_staleness=-1", "scaling.max_failures=-1", "straggler.worker=-1"])
    assert cfg.async_ps.max_staleness == -1 and cfg.scaling.max_failures == -1


def test_file_errors_name_the_file(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("train:\n  epochz: 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(None, [f])
    assert str(e.value) == f"{f}: unknown key 'train.epochz' (did you mean 'train.epochs'?)"


def test_run_name_defaults_to_job_and_data():
    assert load_config(job_defaults("local_sgd"), job="local_sgd").run.name == "local_sgd-digits"
    assert load_config(None, [], ["data.name=synthetic"], job="sync").run.name == "sync-synthetic"
    assert load_config(None, [], ["run.name=mine"], job="sync").run.name == "mine"
    assert load_config().run.name == ""  # no job: left for the caller


def test_job_yamls_hold_only_what_differs_from_the_defaults():
    import yaml

    defaults = Config().to_dict()
    for job in registry.jobs():
        path = job_defaults(job)
        if path is None:
            continue
        for section, keys in yaml.safe_load(path.read_text()).items():
            for key, value in keys.items():
                assert defaults[section][key] != value, f"{path}: {section}.{key} repeats the default {value!r}"


def test_jobs_without_a_yaml_get_none():
    assert job_defaults("sync") is None and job_defaults("compare") is None
    assert job_defaults("async") == registry.get("async").defaults


def test_cnn_on_synthetic_data_is_refused():
    with pytest.raises(ConfigError, match="cnn needs image data"):
        load_config(job_defaults("sync"), [], ["data.name=synthetic", "model.name=cnn"])


def test_docs_config_references_match_the_dataclasses():
    from raydist.slurm.settings import ClusterConfig

    docs = (REPO / "docs" / "configuration.md").read_text()
    assert reference_markdown(Config) in docs and reference_markdown(ClusterConfig) in docs
    assert refreshed(docs) == docs, (
        "docs/configuration.md's config references are stale: run `raydist config reference --write`"
    )


def test_reference_leaves_out_what_users_cannot_set():
    from raydist.slurm.settings import ClusterConfig

    assert "source" not in reference_markdown(ClusterConfig)
    assert "`ports.block` | int >= 18 |" in reference_markdown(ClusterConfig)


@pytest.mark.parametrize("value, expected", [("3", (3, 3, False)), ("2-4", (2, 4, True)), ("1-2", (1, 2, True))])
def test_worker_count_or_elastic_range(value, expected):
    s = load_config(job_defaults("sync"), [], [f"scaling.num_workers={value}"]).scaling
    assert (s.min_workers, s.max_workers, s.elastic) == expected


@pytest.mark.parametrize(
    "value, message",
    [("4-2", "1 <= MIN < MAX"), ("0", "must be >= 1"), ("2-", "range MIN-MAX"), ("x", "range MIN-MAX")],
)
def test_bad_worker_counts_are_refused(value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(job_defaults("sync"), [], [f"scaling.num_workers={value}"])


def test_the_async_ps_refuses_an_elastic_range():
    from raydist.strategies.async_ps.driver import AsyncPSRun

    cfg = load_config(job_defaults("async"), [], ["scaling.num_workers=2-3"])
    with pytest.raises(ConfigError, match="fixed number of workers"):
        AsyncPSRun(cfg)
