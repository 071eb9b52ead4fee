"""jobs/compare.py end to end on the real data set: every strategy learns, and the three artefacts are written."""

from __future__ import annotations

import json
import struct

import pytest

from tests.support.comparerun import EPOCHS, STRATEGIES

pytestmark = pytest.mark.slow


def test_every_strategy_reaches_the_accuracy_threshold_on_digits(compared):
    result, _, _ = compared
    assert set(result["test_accuracy"]) == set(STRATEGIES)
    for strategy, accuracy in result["test_accuracy"].items():
        assert accuracy >= 0.95, (strategy, result)
        assert result["time_to_target_s"][strategy] is not None


def test_compare_writes_results_table_and_a_png_of_the_stated_size(compared):
    result, stdout, out = compared
    assert result["run_dir"] == str(out) and json.loads((out / "summary.json").read_text()) == result

    data = json.loads((out / "results.json").read_text())
    assert list(data["strategies"]) == list(STRATEGIES)
    for strategy, entry in data["strategies"].items():
        s = entry["summary"]
        assert s["strategy"] == strategy and s["workers"] == 2
        assert len(s["bytes_per_worker"]) == len(s["wait_s_per_worker"]) == 2
        evals = len(entry["curves"]["eval"])
        # Sync and local SGD evaluate at every epoch's end; the async PS's driver at its next poll after one, so on a
        # loaded machine several epochs can pass between two (a suite run saw 7 evaluations in 15 epochs).
        assert (evals == EPOCHS) if strategy != "async" else (3 <= evals <= EPOCHS + 1), (strategy, evals)
        assert entry["curves"]["train_loss"]
    # Local SGD averages every 8 steps: far fewer bytes than sync's all-reduce every step.
    per_worker = {k: v["summary"]["bytes_per_worker"][0] for k, v in data["strategies"].items()}
    assert per_worker["local_sgd"] < per_worker["sync"] / 4

    table = (out / "results.md").read_text()
    rows = [ln for ln in table.splitlines() if ln.startswith("| ")]
    assert len(rows) == 1 + len(STRATEGIES) and "staleness mean" in rows[0]
    assert table.strip() in stdout  # printed at the end
    assert "[compare] (3/3) async PS: done" in stdout and "[compare] sync: step" in stdout  # progress on the way

    png = (out / "plot.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    assert struct.unpack(">II", png[16:24]) == (900, 400)
    import matplotlib.image

    assert matplotlib.image.imread(str(out / "plot.png")).shape[:2] == (400, 900)  # it decodes, too


def test_one_tensorboard_logdir_shows_every_strategy_side_by_side(compared):
    from tensorboard.backend.event_processing import event_accumulator, event_multiplexer

    _, stdout, out = compared
    assert f"tensorboard --logdir {out / 'runs'}" in stdout
    # What `tensorboard --logdir <out>/runs` loads: one run per strategy, each with its full curves
    mux = event_multiplexer.EventMultiplexer(size_guidance={event_accumulator.SCALARS: 0})
    mux.AddRunsFromDirectory(str(out / "runs"))
    mux.Reload()
    assert sorted(mux.Runs()) == sorted(f"{s}/tensorboard" for s in STRATEGIES)
    data = json.loads((out / "results.json").read_text())
    for strategy, entry in data["strategies"].items():
        run = f"{strategy}/tensorboard"
        steps = [e.step for e in mux.Scalars(run, "train/loss")]
        # one point per step; async's steps are server versions, fewer than the budget by any dropped updates
        assert steps == list(range(1, len(steps) + 1)), strategy
        assert len(steps) == entry["summary"]["steps"] - (entry["summary"]["dropped"] or 0), strategy
        evals = mux.Scalars(run, "eval/test_accuracy")
        assert len(evals) == len(entry["curves"]["eval"]), strategy
        assert evals[-1].value == pytest.approx(entry["summary"]["test_accuracy"]), strategy
        assert "config/text_summary" in mux.GetAccumulator(run).Tags()["tensors"], strategy


def test_a_failing_strategy_job_fails_compare_with_its_one_line_reason(tmp_path):
    # compare checks every strategy's config before the first one runs (tests/test_bad_inputs.py); what only a
    # strategy's own job finds (on a cluster: what the cluster can hold) fails compare with that job's line.
    from raydist.compare.runner import run_strategy
    from raydist.errors import RaydistError

    shared = tmp_path / "shared.yaml"
    shared.write_text("async_ps:\n  cpus_per_server: 64\n")
    with pytest.raises(RaydistError) as e:
        run_strategy("async", [shared], tmp_path / "runs", "(1/1)")
    assert str(e.value).startswith("async run failed (exit 2): the async job needs 66 CPUs"), str(e.value)
    assert e.value.exit_code == 1
