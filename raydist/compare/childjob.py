"""Running another job (a strategy's, a sweep's) as a child process, as a user runs it, and echoing its progress."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import deque
from pathlib import Path

from raydist.errors import RaydistError
from raydist.summary import RESULT_ENV, SUMMARY_FILE

REPO = Path(__file__).resolve().parents[2]


def run_job(job: str, configs: list[Path], runs_dir: Path, name: str, marks: tuple[str, ...]) -> Path:
    """Run `job` as a user would, in a fresh `runs_dir/name`, echoing its progress lines (those holding one of
    `marks`) as `[compare] name: ...`; returns the run directory, which holds its summary.json."""
    run_dir = runs_dir / name
    shutil.rmtree(run_dir, ignore_errors=True)  # always a fresh run: a leftover checkpoint would resume instead
    cmd = [sys.executable, "-m", "raydist.job", job]
    for path in configs:
        cmd += ["--config", str(path)]
    cmd += ["--set", f"run.storage_path={runs_dir}", "--set", f"run.name={name}"]
    tail: deque[str] = deque(maxlen=40)
    # In this directory, as a user's job: the user's own package (model.factory, data.factory) imports from it.
    here = os.getcwd()
    path = [here, str(REPO), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    env.pop(RESULT_ENV, None)  # batch mode's result file is this job's, not its child's
    with subprocess.Popen(
        cmd, cwd=here, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            mark = next((m for m in marks if m in line), None)
            if mark:  # Ray may prefix a worker's line with "(RayTrainWorker pid=...)"
                text = line.split(mark, 1)[1].rstrip()
                text = text.removeprefix(f"{job}: ").removeprefix(f"{name}: ")
                print(f"[compare] {name}: {text}", flush=True)
    if proc.returncode != 0 or not (run_dir / SUMMARY_FILE).is_file():
        # The job's own one-line error (`raydist: error: ...`), else its last words.
        errors = [ln.split("raydist: error: ", 1)[1] for ln in tail if "raydist: error: " in ln]
        why = errors[-1] if errors else next((ln for ln in reversed(tail) if ln.strip()), "no output")
        raise RaydistError(f"{name} run failed (exit {proc.returncode}): {why}")
    return run_dir
