"""Heal or restart: the same run with N SIGKILLed workers under today's restart (`sync`: Ray Train replaces the
group and every worker reloads the last checkpoint) and under healing (`heal`: torchft; the survivor keeps stepping,
the replacement takes the state from it). docs/faults.md quotes it.

    .venv/bin/python -m benchmarks.heal_vs_restart [--kills 2] [--rounds 2] [--seed 0] [--set KEY=VALUE]...
    .venv/bin/python -m benchmarks.heal_vs_restart --out docs/data/heal_vs_restart.json   # stored, as docs quote
    .venv/bin/python -m benchmarks.heal_vs_restart --report docs/data/heal_vs_restart.json

Each round runs, for each path (the order alternates between rounds), an undisturbed run and one with `--kills`
SIGKILLs, side by side on one machine. A kill lands only when the whole group trains again: new step records since
the previous kill and a checkpoint newer than it (heal checkpoints only when every replica is in). Per kill:
- wall time lost: (disturbed - undisturbed run's seconds) / kills, within the round;
- the stall: from the kill to the next step record in metrics.jsonl, for both paths alike (only rank 0 writes it);
  for heal also the survivor's own count (`heal_stall_s`, from its last step before the failure to its next);
- steps taken during recovery (heal: `steps_during_heals`; restart: none) and steps done again (restart: from the
  checkpoint it resumed at to where it was);
- checkpoints read: restarts of the whole group (`restarts`).
tests/test_heal.py runs a short version (heal, one kill).
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import stored as stored_file
from raydist.torchkit.checkpoint import checkpoint_dirs
from tests.support.jobutil import job_processes_titled, start_job

REPO = Path(__file__).resolve().parents[1]

# Long enough for two kills to land on a healing run: a survivor alone steps three to four times as fast here,
# so the seconds a replacement takes to start cover hundreds of steps.
BASE = ["train.epochs=150", "checkpoint.every_steps=10", "train.report_every_s=0.5"]
PATHS = {"restart": "sync", "heal": "heal"}


def _records(metrics: Path) -> int:
    return sum(1 for _ in metrics.open()) if metrics.exists() else 0


def _newest_checkpoint(run_dir: Path) -> int:
    found = checkpoint_dirs(str(run_dir)) if run_dir.exists() else []
    return found[0][0] if found else -1


def _when_trained_again(metrics: Path, records: int, proc, timeout: float = 300) -> float | None:
    """Seconds until metrics.jsonl grows past `records` + 1 (one step may have been in flight at the kill)."""
    started = time.monotonic()
    while proc.poll() is None and time.monotonic() - started < timeout:
        if _records(metrics) > records + 1:
            return time.monotonic() - started
        time.sleep(0.02)
    return None


def _near_the_end(metrics: Path) -> bool:
    """The run is in its last 10% of steps: a kill there may land after the last step, and heals nothing."""
    step, total = 0, None
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        r = json.loads(line)
        total = r.get("total_steps", total)
        step = r["step"] if isinstance(r.get("step"), int) else step
    return total is not None and step >= 0.9 * total


def _kill_when_whole(proc, metrics: Path, run_dir: Path, rng: random.Random, last_ckpt: int) -> tuple[int, int] | None:
    """Wait until the group trains whole again, then SIGKILL one random worker: (records, checkpoint) at the kill;
    None when the run ended or is too near its end (the kill is not made, and the caller stops)."""
    seen = _records(metrics)
    while proc.poll() is None and (_records(metrics) < seen + 15 or _newest_checkpoint(run_dir) <= last_ckpt):
        time.sleep(0.05)
    time.sleep(rng.uniform(0, 0.3))
    workers = job_processes_titled(proc, "ray::RayTrainWorker")
    if proc.poll() is not None or not workers or _near_the_end(metrics):
        return None
    at = (_records(metrics), _newest_checkpoint(run_dir))
    try:
        os.kill(rng.choice(workers), signal.SIGKILL)
    except ProcessLookupError:
        return None
    return at


def run(storage: str, name: str, path: str, kills: int, seed: int, overrides: list[str] = ()) -> dict:
    """One job on `path` (restart or heal) with `kills` worker SIGKILLs: its summary, the kills that landed, the
    seconds it took, and each kill's stall as the records show it."""
    rng = random.Random(seed)
    started = time.perf_counter()
    proc = start_job(
        PATHS[path],
        f"run.storage_path={storage}",
        f"run.name={name}",
        f"scaling.max_failures={kills + 1}",
        *BASE,
        *overrides,
    )
    run_dir = Path(storage) / name
    metrics, stalls, ckpt = run_dir / "metrics.jsonl", [], -1
    try:
        while len(stalls) < kills and proc.poll() is None:
            at = _kill_when_whole(proc, metrics, run_dir, rng, ckpt)
            if at is None:
                break
            stalls.append(_when_trained_again(metrics, at[0], proc))
            ckpt = at[1]
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise SystemExit(f"{name}: exit {proc.returncode}: {err.strip().splitlines()[-1] if err.strip() else ''}")
    summary = json.loads((run_dir / "summary.json").read_text())
    result = {
        **summary,
        "kills": len(stalls),
        "seconds": time.perf_counter() - started,
        "record_stall_s": stalls,
        "steps_redone": steps_redone(metrics),
        "traceback": "Traceback" in err,
        "heal_lines": [ln for ln in (out + err).splitlines() if "[raydist] heal:" in ln],
    }
    if result["traceback"] or summary["status"] != "completed":  # what went wrong, kept with the figures
        result["console_tail"] = (out + err)[-4000:]
    return result


def steps_redone(metrics: Path) -> int:
    """Steps trained twice: at each resumed session, from its checkpoint's step to the furthest step before."""
    furthest, redone, sessions = 0, 0, 0
    for line in metrics.open():
        r = json.loads(line)
        if "session_at_step" in r and not r.get("from_peer"):  # a heal's replacement redoes nothing
            sessions += 1
            redone += max(0, furthest - r["session_at_step"]) if sessions > 1 else 0
        elif isinstance(r.get("step"), int):
            furthest = max(furthest, r["step"])
    return redone


def per_kill(calm: dict, hit: dict, path: str) -> dict:
    """One disturbed run's figures per kill, against its round's undisturbed run of the same path."""
    kills = max(1, hit["kills"])
    stall = hit["heal_stall_s"] if path == "heal" else [s for s in hit["record_stall_s"] if s is not None]
    return {
        "kills": hit["kills"],
        "lost_s_per_kill": round((hit["seconds"] - calm["seconds"]) / kills, 2),
        "stall_s": stall,
        "steps_during_recovery": hit.get("steps_during_heals") or [0] * hit["kills"],
        "steps_redone": hit["steps_redone"],
        "checkpoint_restarts": hit["restarts"],
        "completed": hit["status"] == "completed" and hit["steps"] == hit["total_steps"],
        "accuracy": hit["test_accuracy"],
        "undisturbed_accuracy": calm["test_accuracy"],
    }


def report(stored: dict) -> str:
    """The lines docs/faults.md quotes: per path, over the rounds, median (min-max)."""
    landed = [r[p]["per_kill"]["kills"] for r in stored["rounds"] for p in PATHS]
    lines = [
        f"{stored['kills']} SIGKILLs per run ({min(landed)}-{max(landed)} landed), {len(stored['rounds'])} "
        f"rounds, {stored['machine']['cpus']} cores:"
    ]
    for path in PATHS:
        rows = [r[path]["per_kill"] for r in stored["rounds"]]
        # Both paths' stall timed alike, by this benchmark: from the kill to the next metrics.jsonl record.
        stalls = [s for r in stored["rounds"] for s in r[path]["disturbed"]["record_stall_s"] if s is not None]
        own = [s for r in rows for s in r["stall_s"]] if path == "heal" else []
        during = [s for r in rows for s in r["steps_during_recovery"]]
        lines.append(
            f"{path}: wall time per kill against the undisturbed run {_signed([r['lost_s_per_kill'] for r in rows])} s; "
            f"kill to the next step record {stored_file.spread(stalls)} s"
            + (f" (the survivor's own count of its stall: {stored_file.spread(own)} s)" if own else "")
            + f"; steps during recovery {stored_file.spread(during, 0)}; "
            f"steps done again {stored_file.spread([r['steps_redone'] for r in rows], 0)}; checkpoint restarts "
            f"{stored_file.spread([r['checkpoint_restarts'] for r in rows], 0)}; completed "
            f"{sum(r['completed'] for r in rows)}/{len(rows)}; accuracy {_accuracies(rows)}; undisturbed "
            f"{stored_file.spread([r[path]['undisturbed']['steps_per_s'] for r in stored['rounds']])} steps/s"
        )
    return "\n".join(lines) + "\n"


def _signed(values: list[float]) -> str:
    return f"{statistics.median(values):+.1f} ({min(values):+.1f} to {max(values):+.1f})"


def _accuracies(rows: list[dict]) -> str:
    diffs = [abs(r["accuracy"] - r["undisturbed_accuracy"]) for r in rows]
    return (
        f"{stored_file.spread([r['accuracy'] for r in rows], 4)} "
        f"(undisturbed {stored_file.spread([r['undisturbed_accuracy'] for r in rows], 4)}, "
        f"largest difference {max(diffs):.4f})"
    )


def ok(stored: dict) -> bool:
    """Every kill landed and (heal) was healed; both paths complete their step budget at the undisturbed
    accuracy; heal reads no checkpoint and takes no step twice."""
    rows = [r[p]["per_kill"] for r in stored["rounds"] for p in PATHS]
    heal = [r["heal"]["per_kill"] for r in stored["rounds"]]
    return (
        all(r["completed"] and abs(r["accuracy"] - r["undisturbed_accuracy"]) <= 0.01 for r in rows)
        and all(r["kills"] == stored["kills"] for r in rows)
        and all(len(r["stall_s"]) == r["kills"] for r in heal)
        and all(r["checkpoint_restarts"] == 0 and r["steps_redone"] == 0 for r in heal)
    )


def one_round(storage: str, index: int, kills: int, seed: int, overrides: list[str]) -> dict:
    order = list(PATHS) if index % 2 == 0 else list(PATHS)[::-1]
    result = {}
    for path in order:
        calm = run(storage, f"{path}-calm-{index}", path, 0, seed + index, overrides)
        hit = run(storage, f"{path}-chaos-{index}", path, kills, seed + index, overrides)
        result[path] = {"undisturbed": calm, "disturbed": hit, "per_kill": per_kill(calm, hit, path)}
        print(f"round {index} {path}: {json.dumps(result[path]['per_kill'])}", flush=True)
    return result


def main() -> None:
    ap = stored_file.parser(__doc__, rounds=2)
    ap.add_argument("--kills", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    stored_file.add_options(ap, "docs/data/heal_vs_restart.json")
    args = ap.parse_args()
    if stored_file.print_report(args.report, report):
        return
    stamp = stored_file.stamp()
    with tempfile.TemporaryDirectory(prefix="rd-heal-vs-restart-") as storage:
        rounds = [one_round(storage, i, args.kills, args.seed, args.overrides) for i in range(args.rounds)]
    stored = {"kills": args.kills, "seed": args.seed, "overrides": [*BASE, *args.overrides], "rounds": rounds}
    print(report({**stored, **stamp}), end="", flush=True)
    stored_file.save(args.out, stored, stamp)
    sys.exit(0 if ok(stored) else 1)


if __name__ == "__main__":
    main()
