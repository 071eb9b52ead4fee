"""Where Ray Train's seconds between connecting and running go, read from a finished local run's own logs.

    .venv/bin/python jobs/sync.py --set train.epochs=2 --set run.storage_path=/tmp/split
    .venv/bin/python -m benchmarks.train_startup_split /tmp/ray/session_latest

Reads the raylet's worker starts (the first is a worker Ray prestarts as the driver connects; the next one the
job's first worker, which was the controller's until the driver started Ray Data's autoscaling coordinator right
after connecting, and is the coordinator's since: the step names stay those of the stored results, and
docs/benchmarks.md says how they read) and Ray Train's controller log (`logs/train/ray-train-sys-controller-*.log`),
and prints one JSON line of seconds per step (docs/benchmarks.md, "Time to the first step"). A session of a run that used more than one
Ray Train controller gives the first one's split.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from datetime import datetime


def stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def split(session: str) -> dict[str, float]:
    with open(os.path.join(session, "logs", "raylet.out")) as f:
        starts = [
            stamp(m.group(1))
            for m in (re.match(r"\[(.*?) I ", line) for line in f if "Started worker process" in line)
            if m
        ]
    connect = starts[0]
    controller = next(s for s in starts if s > connect + 0.05)  # the prestarted workers start together
    logs = glob.glob(os.path.join(session, "logs", "train", "ray-train-sys-controller-*.log"))
    if not logs:
        raise ValueError(f"{session}: no Ray Train controller log (was it a Ray Train run that finished?)")
    events = []
    with open(sorted(logs)[0]) as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            events.append((stamp(record["asctime"]), record["message"]))

    def at(text: str) -> float:
        return next(t for t, m in events if text in m)

    def reported(text: str, pattern: str) -> float:
        return float(re.search(pattern, next(m for _, m in events if text in m)).group(1))

    first, scheduling = events[0][0], at("INITIALIZING -> SCHEDULING")
    cleaner = next((t for t, m in events if "PlacementGroupCleaner launched" in m), None)  # raydist's starts none
    steps = {
        "controller process starts": controller - connect,
        "controller set-up": first - controller,
        "state actor": (cleaner or scheduling) - first,
    }
    if cleaner is not None:
        steps["placement-group cleaner"] = scheduling - cleaner
    return {
        **steps,
        "worker actors": reported("worker actors created", r"created in ([\d.]+)s"),
        "train context and synchronization actor": reported(
            "Train context initialized", r"initialized on workers in ([\d.]+)s"
        ),
        "process group, callbacks, launch": at("SCHEDULING -> RUNNING") - at("Train context initialized"),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("session", help="a Ray session directory, e.g. /tmp/ray/session_latest")
    a = p.parse_args()
    try:
        print(json.dumps({k: round(v, 2) for k, v in split(os.path.realpath(a.session)).items()}))
    except (OSError, ValueError, StopIteration, IndexError) as e:
        print(
            f"train_startup_split: error: {a.session}: cannot read the split ({e or type(e).__name__})", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
