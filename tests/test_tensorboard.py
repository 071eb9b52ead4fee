"""TensorBoard event files (raydist.observability.tensorboard_log), read back with TensorBoard's own reader; no Ray here. The runs
of tests/test_sync_job.py, test_async_ps.py and test_compare.py check the files real jobs write."""

from __future__ import annotations

import os
from pathlib import Path

from raydist.config import Config, load_config
from raydist.observability.tensorboard_log import RunLog, tensorboard_dir
from tests.support.boardutil import config_texts, read_board, scalar_steps


def _config(tmp_path: Path, *overrides: str) -> Config:
    return load_config(None, [], [f"run.storage_path={tmp_path}", "run.name=r", *overrides])


def _session(cfg: Config, start: int, end: int, loss: float, evals: tuple[int, ...] = ()) -> None:
    log = RunLog(cfg, enabled=True, start_step=start)
    log.write(
        {"session_at_step": start, "total_steps": 20, "world_size": 2, "samples_per_step": 64, "strategy": "sync"}
    )
    for step in range(start + 1, end + 1):
        log.write(
            {
                "step": step,
                "epoch": 0,
                "loss": loss,
                "grad_norm": 1.0,
                "lr": 0.1,
                "step_time_s": 0.01,
                "time_s": 0.5 * step,
            }
        )
        if step in evals:
            log.write({"eval_at_step": step, "time_s": 0.5 * step, "test_loss": loss, "test_accuracy": 0.5})
    log.close()


def test_a_session_restarted_from_a_checkpoint_leaves_one_point_per_step(tmp_path):
    cfg = _config(tmp_path)
    # The first attempt gets to step 15 and evaluates at 10 and 15; it fails, and the next one resumes from the
    # checkpoint at step 10: the points of steps 11 to 15 written before the failure must not stay.
    _session(cfg, 0, 15, loss=2.0, evals=(10, 15))
    _session(cfg, 10, 20, loss=1.0, evals=(20,))
    acc = read_board(cfg.run.run_dir)
    assert scalar_steps(acc, "train/loss") == list(range(1, 21))
    assert [e.value for e in acc.Scalars("train/loss")] == [2.0] * 10 + [1.0] * 10
    for tag in ("train/grad_norm", "train/lr", "train/step_time_s"):
        assert scalar_steps(acc, tag) == list(range(1, 21)), tag
    assert scalar_steps(acc, "eval/test_loss") == scalar_steps(acc, "eval/test_accuracy") == [10, 20]
    assert scalar_steps(acc, "run/world_size") == [0, 10]
    # 64 samples per step, a step every 0.5 s, a point at least a second apart
    rates = acc.Scalars("train/samples_per_s")
    assert rates and all(abs(e.value - 128) < 1e-3 for e in rates)
    texts = config_texts(acc)
    assert sorted(texts) == [0, 10] and "    run:\n" in texts[0] and "    tensorboard: true\n" in texts[0]


def test_the_async_driver_rolls_back_in_the_same_writer(tmp_path):
    cfg = _config(tmp_path)
    log = RunLog(cfg, enabled=True, start_step=0, samples_per_step=32)
    for step in range(1, 9):
        log.write({"step": step, "worker": step % 2, "loss": 3.0, "lr": 0.1, "staleness": 1, "time_s": step})
    log.write({"dropped_at_step": 8, "worker": 0, "loss": 3.0, "staleness": 5})  # not a step: no point
    log.restart(5)  # a dead actor: back to the checkpoint at step 5
    for step in range(6, 11):
        log.write({"step": step, "worker": 0, "loss": 1.0, "lr": 0.1, "staleness": 0, "time_s": step})
    log.close()
    acc = read_board(cfg.run.run_dir)
    assert scalar_steps(acc, "train/loss") == scalar_steps(acc, "train/staleness") == list(range(1, 11))
    assert [e.value for e in acc.Scalars("train/staleness")] == [1.0] * 5 + [0.0] * 5
    assert "train/grad_norm" not in acc.Tags()["scalars"]  # written only where the records carry it
    assert all(e.value == 32 for e in acc.Scalars("train/samples_per_s"))


def test_run_tensorboard_false_and_ranks_other_than_0_write_no_event_files(tmp_path):
    _session(_config(tmp_path, "run.tensorboard=false"), 0, 3, loss=1.0)
    assert not os.path.exists(tensorboard_dir(str(tmp_path / "r")))
    assert (tmp_path / "r" / "metrics.jsonl").is_file()
    log = RunLog(_config(tmp_path, "run.name=other"), enabled=False, start_step=0)
    log.write({"step": 1, "loss": 1.0})
    log.close()
    assert not (tmp_path / "other").exists()
