"""A checkpoint is complete or absent: the manifest, its verification, resume past broken checkpoints, writers
SIGKILLed mid-save, and a real sync run resumed after its newest checkpoint and Ray's snapshot were torn."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from raydist.errors import RaydistError
from raydist.torchkit.checkpoint import (
    MANIFEST,
    RAY_SNAPSHOT,
    STATE_FILE,
    Progress,
    load_state,
    newest_valid,
    resume_choice,
    rng_state,
    save_state,
    set_aside_broken_snapshot,
    sha256_of,
    skipped_line,
    verify,
)


def _save(directory: Path, step: int) -> Path:
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    save_state(
        str(directory),
        model=model,
        optimizer=opt,
        scheduler=sched,
        progress=Progress(step=step),
        rng_per_rank=[rng_state()],
    )
    return directory


# ---- (a) the manifest and what verification catches -----------------------------------------------------------


def test_save_state_writes_the_manifest_last_with_each_files_size_and_sha256(tmp_path):
    d = _save(tmp_path / "checkpoint_step00000007", 7)
    manifest = json.loads((d / MANIFEST).read_text())
    state = d / STATE_FILE
    assert manifest["step"] == 7
    assert manifest["files"] == [{"name": STATE_FILE, "size": state.stat().st_size, "sha256": sha256_of(str(state))}]
    assert sorted(os.listdir(d)) == [MANIFEST, STATE_FILE]  # no temporary files left behind
    assert verify(str(d), required=STATE_FILE) is None
    assert load_state(str(d))["progress"] == Progress(step=7)


def _truncate(d: Path) -> None:
    data = (d / STATE_FILE).read_bytes()
    (d / STATE_FILE).write_bytes(data[: len(data) // 2])


def _flip_a_byte(d: Path) -> None:
    data = bytearray((d / STATE_FILE).read_bytes())
    data[len(data) // 2] ^= 0x01
    (d / STATE_FILE).write_bytes(bytes(data))


DAMAGE = {
    "truncated file": (_truncate, "has"),
    "missing file": (lambda d: (d / STATE_FILE).unlink(), "missing"),
    "flipped byte": (_flip_a_byte, "sha256"),
    "missing manifest": (lambda d: (d / MANIFEST).unlink(), "did not finish"),
    "torn manifest": (lambda d: (d / MANIFEST).write_text('{"step": 3, "fi'), "unreadable"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_verify_says_why_a_damaged_checkpoint_is_broken_and_load_state_refuses_it(tmp_path, damage):
    d = _save(tmp_path / "checkpoint_step00000003", 3)
    harm, reason = DAMAGE[damage]
    harm(d)
    why = verify(str(d), required=STATE_FILE)
    assert why is not None and reason in why, why
    with pytest.raises(RaydistError, match="is broken") as e:
        load_state(str(d))
    assert "\n" not in str(e.value)


def test_verify_wants_the_readers_state_file_listed(tmp_path):
    d = _save(tmp_path / "checkpoint_step00000003", 3)
    assert "ps_state.pt" in verify(str(d), required="ps_state.pt")


# ---- resume past broken checkpoints ------------------------------------------------------------------------------


def test_resume_takes_the_newest_valid_checkpoint_and_names_what_it_skipped_in_one_line(tmp_path):
    for step in (2, 4, 6):
        _save(tmp_path / f"checkpoint_step{step:08d}", step)
    _truncate(tmp_path / "checkpoint_step00000006")
    (tmp_path / "checkpoint_step00000008").mkdir()  # a save killed before its first file
    found, skipped = newest_valid(str(tmp_path), STATE_FILE)
    assert found == str(tmp_path / "checkpoint_step00000004")
    assert [os.path.basename(p) for p, _ in skipped] == ["checkpoint_step00000008", "checkpoint_step00000006"]
    line = skipped_line(skipped, found)
    assert line.startswith("[raydist] skipped broken checkpoints checkpoint_step00000008 (")
    assert line.endswith("; resuming from checkpoint_step00000004") and "\n" not in line
    # Ray's own choice, when broken, is named once, and the scan goes on below it.
    found, skipped = resume_choice(str(tmp_path / "checkpoint_step00000006"), str(tmp_path), STATE_FILE)
    assert found == str(tmp_path / "checkpoint_step00000004")
    assert sorted(os.path.basename(p) for p, _ in skipped) == ["checkpoint_step00000006", "checkpoint_step00000008"]
    assert resume_choice(str(tmp_path / "checkpoint_step00000002"), str(tmp_path), STATE_FILE) == (
        str(tmp_path / "checkpoint_step00000002"),
        [],
    )  # a valid one Ray names is used as it is


def test_a_torn_ray_snapshot_is_moved_aside_and_a_valid_one_is_left(tmp_path):
    assert set_aside_broken_snapshot(str(tmp_path)) is None  # none there
    snapshot = tmp_path / RAY_SNAPSHOT
    snapshot.write_text('{"ray_version": "2.0", "checkpoint_results": []}')
    assert set_aside_broken_snapshot(str(tmp_path)) is None and snapshot.exists()
    snapshot.write_text('{"ray_version": "2.0", "checkpoint_res')
    line = set_aside_broken_snapshot(str(tmp_path))
    assert line.startswith(f"[raydist] {RAY_SNAPSHOT} is truncated or corrupt") and "\n" not in line
    assert not snapshot.exists() and [p.name.split(".broken-")[0] for p in tmp_path.iterdir()] == [RAY_SNAPSHOT]


def test_ps_save_renames_a_complete_directory_into_place_and_keeps_the_newest_valid(tmp_path, capsys):
    from raydist.strategies.async_ps.checkpoints import latest_checkpoint, load_params
    from raydist.strategies.async_ps.checkpoints import save as ps_save

    def state(step):
        return {"shards": [{"param": torch.full((5,), float(step))}], "steps": step, "workers": 1}

    for step in (1, 2, 3):
        ps_save(str(tmp_path), step, state(step), keep=2)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_step00000002", "checkpoint_step00000003"]
    ps_save(str(tmp_path), 3, state(30), keep=2)  # the same step again replaces it whole
    assert torch.equal(load_params(str(tmp_path / "checkpoint_step00000003")), torch.full((5,), 30.0))

    (tmp_path / "checkpoint_step00000003" / "ps_state.pt").write_bytes(b"torn")
    (tmp_path / ".tmp-checkpoint_step00000004-999").mkdir()  # what a killed save leaves
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint_step00000002")
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "[raydist] skipped broken checkpoint checkpoint_step00000003 (ps_state.pt has 4 bytes, the manifest "
        f"says {json.loads((tmp_path / 'checkpoint_step00000003' / MANIFEST).read_text())['files'][0]['size']}); "
        "resuming from checkpoint_step00000002"
    ]
    with pytest.raises(RaydistError, match="is broken"):
        load_params(str(tmp_path / "checkpoint_step00000003"))
    # The resumed session saves step 3 again; the broken newer directory and the leftover go, the valid 2 stays.
    ps_save(str(tmp_path), 3, state(3), keep=2)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_step00000002", "checkpoint_step00000003"]
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint_step00000003")


# ---- (b) writers SIGKILLed at random moments ---------------------------------------------------------------------


def _chaos_module():
    from tests.support.jobutil import load_benchmark

    return load_benchmark("checkpoint_chaos")


@pytest.mark.parametrize("writer", ["sync", "local_sgd", "ps"])
def test_a_writer_killed_at_random_moments_never_leaves_resume_a_partial_checkpoint(tmp_path, writer):
    # 5 kills per writer, more until 2 of them have landed inside a write (a kill between saves tests nothing);
    # benchmarks/checkpoint_chaos.py runs 30 each.
    result = _chaos_module().chaos(writer, kills=5, run_dir=str(tmp_path), seed=1, mid_save_at_least=2)
    assert result.failures == [], result.line()
    assert result.mid_save >= 2, result.line()
    assert result.kills >= 5 and result.resumed_steps == sorted(result.resumed_steps)


# ---- (c) a real sync run resumed past a torn checkpoint and a torn Ray snapshot -------------------------------


@pytest.mark.slow
@pytest.mark.shared_ray
def test_sync_run_resumes_from_the_previous_valid_checkpoint_when_the_latest_and_the_snapshot_are_torn(tmp_path):
    from tests.support.jobutil import run_job, summary

    common = [f"run.storage_path={tmp_path}", "run.name=torn", "train.epochs=1", "checkpoint.every_steps=5"]
    stopped = summary(run_job("sync", *common, "train.stop_at_step=12"))
    assert stopped["steps"] == 12 and stopped["status"] == "stopped"
    run_dir = tmp_path / "torn"
    latest = run_dir / "checkpoint_step00000012"
    assert stopped["checkpoint"] == str(latest) and (run_dir / "checkpoint_step00000010").is_dir()
    _truncate(latest)
    snapshot = run_dir / RAY_SNAPSHOT
    snapshot.write_bytes(snapshot.read_bytes()[:100])

    proc = run_job("sync", *common)
    resumed = summary(proc)
    assert resumed["resumed_from_step"] == 10
    assert resumed["steps"] == resumed["total_steps"] == 22 and resumed["status"] == "completed"
    lines = [ln[ln.find("[raydist]") :] for ln in proc.stdout.splitlines()]  # without Ray's "(RayTrainWorker pid=..)"
    aside = [ln for ln in lines if ln.startswith(f"[raydist] {RAY_SNAPSHOT} is truncated")]
    skipped = [ln for ln in lines if ln.startswith("[raydist] skipped broken checkpoint")]
    assert len(aside) == 1 and len(skipped) == 1, proc.stdout[-3000:]  # one line each, from rank 0 of 2
    assert skipped[0] == (
        "[raydist] skipped broken checkpoint checkpoint_step00000012 (train_state.pt has "
        f"{latest.joinpath(STATE_FILE).stat().st_size} bytes, the manifest says "
        f"{json.loads(latest.joinpath(MANIFEST).read_text())['files'][0]['size']}); "
        "resuming from checkpoint_step00000010"
    )
    assert verify(resumed["checkpoint"], required=STATE_FILE) is None
