"""Kill checkpoint writers at random moments and check that resume always finds a complete checkpoint.

    .venv/bin/python -m benchmarks.checkpoint_chaos [--kills 30] [--seed 0] [--out docs/data/checkpoint_chaos.json]
    .venv/bin/python -m benchmarks.checkpoint_chaos --report docs/data/checkpoint_chaos.json   # its lines again
    .venv/bin/python -m benchmarks.checkpoint_chaos --save-cost 50     # what one save costs, with and without fsync

Three writers, each a process of its own (forked from a server that imported torch once) that resumes from the
newest valid checkpoint and then saves one checkpoint after another until it is SIGKILLed:
  sync  the Ray Train path: `save_state` into a local directory, then what Ray Train does with it: a copy into
        <run_dir>/checkpoint_stepNNNNNNNN (file by file, not atomic), an in-place rewrite of
        checkpoint_manager_snapshot.json, the deletion of the oldest beyond `keep`; onto storage at ~100 MB/s
  local_sgd  the same path with two ranks' own model and optimizer files in place of the model (`save_replica`)
  ps    the async PS driver's `_save` (staging directory, manifest, rename)
After each kill the reader the jobs use picks a checkpoint; the check fails if it is broken, holds the wrong
content for its step, or is older than the last save the writer finished. tests/test_checkpoint_integrity.py runs
a short version.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

from benchmarks.stored import spread, stamp

KEEP = 2
WIDTH = 1024  # a 4 MiB model: a save takes long enough for many kills to land inside one
SAVED_LOG = "saved.log"
# Ray copies onto storage every node sees (NFS and the like): about 1 GbE NFS, so the copy takes about as long as
# the local save and kills land in both.
STORAGE_BYTES_S = 100e6
STORAGE_LATENCY_S = 0.002
CHUNK = 256 * 1024
STATE = {"sync": "train_state.pt", "local_sgd": "train_state.pt", "ps": "ps_state.pt"}


# ---- the writers (run in their own process) -------------------------------------------------------------------


def _model(step: int):
    import torch

    model = torch.nn.Linear(WIDTH, WIDTH, bias=False)
    with torch.no_grad():
        model.weight.fill_(float(step))  # the content says which step it is: a mixed-up file cannot pass as valid
    return model


def _write_local_sgd(run_dir: str, step: int, written: list[str]) -> None:
    """Local SGD's checkpoint: the same path as sync's, with each of two ranks' own model and optimizer files."""
    _write_sync(run_dir, step, written, per_rank=2)


def _write_sync(run_dir: str, step: int, written: list[str], per_rank: int = 0) -> None:
    from raydist.torchkit.checkpoint import RAY_SNAPSHOT, Progress, rng_state, save_replica, save_state
    from raydist.train.context import new_checkpoint_dir

    # save_state only asks the optimizer and scheduler for their state: stand-ins spare each restarted writer the
    # second torch.optim takes to set up (the saves, not the payload, are under test).
    no_state = SimpleNamespace(state_dict=dict)
    local = new_checkpoint_dir()
    for rank in range(per_rank):
        save_replica(local, rank, _model(step), no_state)
    save_state(
        local,
        model=None if per_rank else _model(step),
        optimizer=None if per_rank else no_state,
        scheduler=no_state,
        progress=Progress(step=step),
        rng_per_rank=[rng_state()] * max(1, per_rank),
        extra={"replicas": per_rank} if per_rank else None,
    )
    name = f"checkpoint_step{step:08d}"
    # What Ray Train V2 does with a reported checkpoint (storage.py, checkpoint_manager.py): create the directory,
    # copy the files in, rewrite the snapshot in place, then delete the oldest; here onto slow shared storage.
    os.makedirs(os.path.join(run_dir, name), exist_ok=True)
    for file in sorted(os.listdir(local)):  # manifest.json first: the worst order for a reader
        _slow_copy(os.path.join(local, file), os.path.join(run_dir, name, file))
    written.append(name)
    snapshot = json.dumps({"latest_checkpoint": name, "checkpoints": written[-KEEP:], "padding": "x" * 4096})
    _slow_write(os.path.join(run_dir, RAY_SNAPSHOT), snapshot.encode())
    for old in written[:-KEEP]:
        shutil.rmtree(os.path.join(run_dir, old), ignore_errors=True)
    del written[:-KEEP]
    shutil.rmtree(local)


def _slow_write(path: str, data: bytes) -> None:
    """Write in place (truncate, then chunks), as Ray's pyarrow output streams do, on storage with a latency per
    write and a bandwidth."""
    with open(path, "wb") as f:
        for i in range(0, len(data), CHUNK):
            time.sleep(STORAGE_LATENCY_S + len(data[i : i + CHUNK]) / STORAGE_BYTES_S)
            f.write(data[i : i + CHUNK])
            f.flush()


def _slow_copy(src: str, dst: str) -> None:
    with open(src, "rb") as f:
        _slow_write(dst, f.read())


def _write_ps(run_dir: str, step: int, written: list[str]) -> None:
    from raydist.strategies.async_ps.checkpoints import save as _save

    _save(
        run_dir,
        step,
        {"shards": [{"param": _model(step).weight.detach().flatten()}], "steps": step, "workers": 1},
        KEEP,
    )


def _warm_up() -> None:
    import io

    import torch

    import raydist.train.context  # noqa: F401

    torch.save(_model(0).state_dict(), io.BytesIO())


def write_forever(writer: str, run_dir: str) -> None:
    """The writer's process: resume where the reader says, then save step after step, logging each finished save."""
    _warm_up()  # so that the random kills land in the saves, not in first-use imports

    chosen = choose(writer, run_dir)
    step = check(writer, chosen) if chosen else 0
    written = [os.path.basename(chosen)] if chosen else []
    save = {"sync": _write_sync, "local_sgd": _write_local_sgd, "ps": _write_ps}[writer]
    with open(os.path.join(run_dir, SAVED_LOG), "a") as log:
        print(f"ready {step}", file=log, flush=True)
        while True:
            step += 1
            save(run_dir, step, written)
            print(f"saved {step}", file=log, flush=True)


# ---- the reader and the check (what a resumed job does) -------------------------------------------------------


def choose(writer: str, run_dir: str, use_snapshot: bool = True) -> str | None:
    """The checkpoint a resumed job of this kind would load. For sync, `use_snapshot=False` is the scan alone,
    what resume does when Ray's snapshot is torn or missing (a kill before Ray wrote its first)."""
    import contextlib
    import io

    if writer == "ps":
        from raydist.strategies.async_ps.checkpoints import latest_checkpoint

        with contextlib.redirect_stdout(io.StringIO()):  # its one line is not this harness's output
            return latest_checkpoint(run_dir)
    from raydist.torchkit.checkpoint import RAY_SNAPSHOT, STATE_FILE, resume_choice, set_aside_broken_snapshot

    known = None
    snapshot = os.path.join(run_dir, RAY_SNAPSHOT)
    if use_snapshot:
        set_aside_broken_snapshot(run_dir)  # as raytrain.fit_on_ray_train does before trainer.fit()
        if os.path.exists(snapshot):  # Ray's get_checkpoint(): the snapshot's latest checkpoint
            with open(snapshot) as f:
                known = os.path.join(run_dir, json.load(f)["latest_checkpoint"])
    return resume_choice(known, run_dir, STATE_FILE)[0]


def check(writer: str, directory: str) -> int:
    """Load the checkpoint with the job's own loader and confirm it holds its step's content; returns the step."""
    import torch

    step = int(os.path.basename(directory)[len("checkpoint_step") :])
    if writer == "ps":
        from raydist.strategies.async_ps.checkpoints import load_params

        params = load_params(directory)
    else:
        from raydist.torchkit.checkpoint import load_replica, load_state

        state = load_state(directory)
        if state["progress"].step != step:
            raise AssertionError(f"{directory} holds step {state['progress'].step}")
        replicas = [load_replica(directory, r)["model"]["weight"] for r in range(state["extra"].get("replicas", 0))]
        params = replicas[0] if replicas else state["model"]["weight"]
        if any(not torch.equal(mine, params) for mine in replicas):
            raise AssertionError(f"{directory}: a rank's own model is not step {step}'s")
    if not torch.equal(params.flatten(), torch.full((WIDTH * WIDTH,), float(step))):
        raise AssertionError(f"{directory} does not hold step {step}'s weights")
    return step


# ---- the harness ----------------------------------------------------------------------------------------------


@dataclass
class ChaosResult:
    writer: str
    kills: int = 0
    mid_save: int = (
        0  # kills that left a partial write on disk (a broken directory, a staging leftover, a torn snapshot)
    )
    broken_seen: int = 0  # kills that left a broken checkpoint directory newer than the one resume chose
    snapshots_set_aside: int = 0
    resumed_steps: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"{self.writer}: {self.kills} kills, {self.mid_save} mid-save, {self.broken_seen} left a broken newest "
            f"checkpoint that resume skipped, {self.snapshots_set_aside} a torn snapshot set aside, "
            f"resumed at steps {self.resumed_steps[0] if self.resumed_steps else '-'}.."
            f"{self.resumed_steps[-1] if self.resumed_steps else '-'}, failures {len(self.failures)}"
            + (f": {self.failures[0]}" if self.failures else "")
        )


def _log_lines(run_dir: str) -> list[str]:
    path = os.path.join(run_dir, SAVED_LOG)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().splitlines()


def _wait_ready(run_dir: str, before: int, proc, err: str) -> None:
    while len(_log_lines(run_dir)) <= before:
        if not proc.is_alive():
            with open(err, errors="replace") as f:
                raise RuntimeError(f"writer exited {proc.exitcode}: {f.read()[-2000:]}")
        time.sleep(0.02)


def _start_writer(writer: str, run_dir: str):
    """The writer in a process of its own, forked from a server that imported torch once: a fresh process per kill,
    as a restarted worker is, without each paying torch's import."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "raydist.torchkit.checkpoint", "raydist.train.context"])
    # The staging directories a killed sync writer leaves behind (as a killed worker would) stay in the run.
    staging, err = os.path.join(run_dir, ".staging"), os.path.join(run_dir, ".writer-stderr")
    os.makedirs(staging, exist_ok=True)
    proc = ctx.Process(target=_writer_process, args=(writer, run_dir, staging, err), daemon=True)
    proc.start()
    return proc, err


def _writer_process(writer: str, run_dir: str, staging: str, err: str) -> None:
    os.environ["TMPDIR"] = staging
    tempfile.tempdir = None  # tempfile reads TMPDIR again
    fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    write_forever(writer, run_dir)


def _last_saved(run_dir: str) -> int:
    saved = [int(ln.split()[1]) for ln in _log_lines(run_dir) if ln.startswith("saved ")]
    return saved[-1] if saved else 0


def chaos(
    writer: str, kills: int, run_dir: str, seed: int = 0, max_delay_s: float = 0.6, mid_save_at_least: int = 0
) -> ChaosResult:
    """Start the writer, SIGKILL it after a random delay, check what resume would choose; `kills` times, and on
    (up to 4x `kills`) until `mid_save_at_least` kills have landed inside a write."""
    from raydist.torchkit.checkpoint import checkpoint_dirs, verify

    rng = random.Random(seed)
    result = ChaosResult(writer)
    while result.kills < kills or (result.mid_save < mid_save_at_least and result.kills < 4 * kills):
        before = len(_log_lines(run_dir))
        partial_before = _partials(run_dir, writer)
        proc, err = _start_writer(writer, run_dir)
        _wait_ready(run_dir, before, proc, err)
        time.sleep(rng.uniform(0, max_delay_s))
        proc.kill()
        proc.join()
        result.kills += 1
        result.mid_save += bool(_partials(run_dir, writer) - partial_before)
        readers = [True, False] if writer != "ps" else [True]  # with Ray's snapshot, and the scan alone
        try:
            steps = [_checked_choice(writer, run_dir, use_snapshot) for use_snapshot in reversed(readers)]
        except Exception as e:  # noqa: BLE001 -- every failure is a result here
            result.failures.append(f"{type(e).__name__}: {e}")
            continue
        step = steps[-1]
        result.resumed_steps.append(step)
        result.broken_seen += any(
            s > steps[0] and verify(p, required=STATE[writer]) for s, p in checkpoint_dirs(run_dir)
        )
    result.snapshots_set_aside = sum(".broken-" in n for n in os.listdir(run_dir))
    return result


def _checked_choice(writer: str, run_dir: str, use_snapshot: bool) -> int:
    """The step of the checkpoint resume chooses, after checking it loads, holds its step and loses no finished save."""
    chosen = choose(writer, run_dir, use_snapshot)
    step = check(writer, chosen) if chosen else 0
    if step < _last_saved(run_dir):
        raise AssertionError(f"chose step {step} but step {_last_saved(run_dir)} had been saved")
    return step


def _partials(run_dir: str, writer: str) -> set[str]:
    """What interrupted writes left in the run directory: broken checkpoint directories, temporary files or
    directories, a snapshot that is not JSON. A kill landed inside a write when it adds to this set."""
    from raydist.torchkit.checkpoint import RAY_SNAPSHOT, checkpoint_dirs, verify

    found = {n for n in os.listdir(run_dir) if ".tmp-" in n or n.startswith(".old-")}
    if os.path.exists(os.path.join(run_dir, RAY_SNAPSHOT)):
        try:
            with open(os.path.join(run_dir, RAY_SNAPSHOT)) as f:
                json.load(f)
        except ValueError:
            found.add(f"{RAY_SNAPSHOT} (torn, {os.path.getmtime(os.path.join(run_dir, RAY_SNAPSHOT))})")
    return found | {p for _, p in checkpoint_dirs(run_dir) if verify(p, required=STATE[writer])}


LARGE = ["model.hidden=1024", "model.depth=4"]


def _saver(overrides: list[str]):
    """A `once(directory, fsync)` timing one `save_state` of the sync job's model under `overrides` (with its
    optimizer state and two ranks' RNG, as every real checkpoint), and the model's parameter bytes."""
    import torch

    from raydist.config import job_defaults, load_config
    from raydist.torchkit.checkpoint import Progress, rng_state, save_state
    from raydist.torchkit.data import load_splits
    from raydist.torchkit.models import build_model
    from raydist.torchkit.optim import build_optimizer, build_scheduler

    cfg = load_config(job_defaults("sync"), [], overrides)
    data = load_splits(cfg.data)
    model = build_model(cfg.model, data)
    optimizer = build_optimizer(model.parameters(), cfg.optim)
    scheduler = build_scheduler(optimizer, 440, cfg.schedule)
    model(torch.zeros(2, data.train[0][0].numel())).sum().backward()
    optimizer.step()

    def once(directory: str, fsync: bool) -> float:
        t0 = time.perf_counter()
        save_state(
            directory,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            progress=Progress(step=1),
            rng_per_rank=[rng_state(), rng_state()],
            extra={"config": cfg.to_dict()},
            fsync=fsync,
        )
        elapsed = time.perf_counter() - t0
        written[:] = [sum(f.stat().st_size for f in Path(directory).rglob("*") if f.is_file())]
        shutil.rmtree(directory)
        return elapsed

    written = [0]  # bytes the last save wrote (the state file and its manifest)
    return once, sum(p.numel() * p.element_size() for p in model.parameters()), written


def save_cost(rounds: int) -> dict:
    """Time `save_state` with and without fsync: the default sync model into the loop's local staging directory
    (Ray copies it from there) and into a directory beside this repository; a 12.9 MB model into staging."""
    from raydist.train.context import new_checkpoint_dir

    beside = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".bench-save")
    cases = {}
    for name, overrides, where, make in (
        ("default, staging", [], "staging", new_checkpoint_dir),
        ("default, beside the repo", [], "beside", lambda: beside),
        ("large, staging", LARGE, "staging", new_checkpoint_dir),
    ):
        once, size, written = _saver(overrides)
        times = {"fsync": [], "no_fsync": []}
        for _ in range(rounds):  # interleaved, so drifting load hits both alike
            for fsync in (True, False):
                times["fsync" if fsync else "no_fsync"].append(round(once(make(), fsync) * 1e3, 3))
        cases[name] = {
            "overrides": overrides,
            "where": where,
            "param_bytes": size,
            "written_bytes": written[0],
            "ms": times,
        }
        print(
            f"save_state, {name}: fsync {statistics.median(times['fsync']):.1f} ms, no fsync "
            f"{statistics.median(times['no_fsync']):.1f} ms (median of {rounds})",
            flush=True,
        )
    return {"rounds": rounds, "cases": cases}


def save_cost_report(stored: dict) -> str:
    """The table docs/checkpoints.md quotes: each case's median (min-max) in ms, with and without fsync."""
    labels = {
        "default, staging": "into the loop's staging directory (`tempfile`)",
        "default, beside the repo": "into a directory beside the repository",
        "large, staging": "a model with {mb:.1f} MB of parameters (`--set model.hidden=1024 --set "
        "model.depth=4`), staging",
    }
    rows = ["| | with fsync (the default) | without fsync |", "|---|---|---|"]
    for name, case in stored["cases"].items():
        label = labels[name].format(mb=case["param_bytes"] / 1e6)
        rows.append(f"| {label} | {spread(case['ms']['fsync'])} ms | {spread(case['ms']['no_fsync'])} ms |")
    default = stored["cases"]["default, staging"]
    return "\n".join(rows) + (
        f"\n\nMedian (min-max) of {stored['rounds']} saves each; a save of the default model "
        f"writes {default['written_bytes'] / 1e6:.2f} MB ({default['param_bytes'] / 1e6:.2f} MB "
        f"of parameters, the rest AdamW's state, the RNG and the config).\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=30, help="kills per writer")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--save-cost",
        type=int,
        metavar="ROUNDS",
        help="instead: time save_state with and without fsync "
        "(stored with --out as docs/data/save_cost.json; --report with --save-cost prints its table)",
    )
    ap.add_argument("--out", type=Path, help="store the rounds, the machine and the commit in this JSON file")
    ap.add_argument("--report", type=Path, help="print the lines of a stored run and exit")
    args = ap.parse_args()
    if args.report:
        stored = json.loads(args.report.read_text())
        print(save_cost_report(stored) if "cases" in stored else report(stored))
        return
    if args.save_cost:
        result = {**save_cost(args.save_cost), **stamp()}
        print(save_cost_report(result), end="")
        if args.out:
            args.out.write_text(json.dumps(result, indent=1) + "\n")
        return
    started = time.perf_counter()
    results = []
    for writer in ("sync", "local_sgd", "ps"):
        with tempfile.TemporaryDirectory(prefix=f"rd-chaos-{writer}-") as run_dir:
            results.append(chaos(writer, args.kills, run_dir, seed=args.seed))
        print(results[-1].line(), flush=True)
    stored = {
        "setting": {"kills": args.kills, "seed": args.seed},
        "writers": [asdict(r) for r in results],
        "total_s": round(time.perf_counter() - started, 1),
        **stamp(),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(stored, indent=1) + "\n")
    print(f"total {stored['total_s']:.0f} s", flush=True)
    sys.exit(1 if any(r.failures for r in results) else 0)


def report(stored: dict) -> str:
    """The lines docs/checkpoints.md quotes, from a stored run."""
    return "\n".join([ChaosResult(**w).line() for w in stored["writers"]] + [f"total {stored['total_s']:.0f} s"])


if __name__ == "__main__":
    main()
