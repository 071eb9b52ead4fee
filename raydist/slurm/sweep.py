"""Remove what raydist jobs that SLURM no longer runs left behind: node-local temp dirs and shared job dirs.

A job whose clean-up SLURM SIGKILLed (`KillWait` shorter than `timeouts.teardown`, a node rebooted, a batch step
killed) leaves `<temp_dir>/raydist-<job id>` on its nodes and `<job_dir>/<job id>/` (token included). Every later
bring-up sweeps them: each node its temp dirs, the head at the start also the job dirs.

`to_remove` is the whole decision, pure: given the entries found and the job ids SLURM still runs, which go.
Only a directory (not a link) owned by the current user whose name raydist gives (`raydist-<id>`, `<id>`), and
for a job dir holding raydist's files, is a candidate; a candidate goes only if its job is not live. The rest of
the module lists entries, asks SLURM, and removes; if asking SLURM fails, nothing is removed.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

TEMP = "temp dir"
JOB = "job dir"
# Files a raydist job dir holds (jobdir.JobDir): one of them must be there before a `<id>` dir counts as ours.
JOB_DIR_MARKERS = ("token", "plan.json", "nodes", "connection.env")
SQUEUE_TIMEOUT_S = 20.0
_TEMP_NAME = re.compile(r"raydist-([1-9][0-9]*)")
_JOB_NAME = re.compile(r"[1-9][0-9]*")
_LEADING_ID = re.compile(r"[0-9]+")
# squeue reads these from the environment; SQUEUE_STATES=R, say, would hide pending and suspended jobs.
_SQUEUE_ENV = re.compile(r"SQUEUE_")
_MAX_LISTED_IDS = 500  # beyond this, ask for every job instead of a --jobs list


class SlurmUnavailable(Exception):
    """SLURM could not say which jobs are live; the message says why, in one line."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One directory entry found under a temp dir or job dir root."""

    path: Path
    kind: str  # TEMP or JOB
    job_id: int | None  # from the name; None: not a name raydist gives
    ours: bool  # a real directory (not a link) owned by the current user
    marked: bool = True  # a job dir: holds one of JOB_DIR_MARKERS; temp dirs: always


def job_of(name: str, kind: str) -> int | None:
    """The job id a raydist-made entry name carries, else None ('raydist-41' -> 41 for temp dirs, '41' for job
    dirs; never '041', 'raydist-41.old', 'raydist-x')."""
    m = (_TEMP_NAME if kind == TEMP else _JOB_NAME).fullmatch(name)
    return int(m.group(m.lastindex or 0)) if m else None


def candidates(entries: Iterable[Entry], current_job: int | None = None) -> list[Entry]:
    """Entries raydist made for some other job: removed if that job is no longer live."""
    return [e for e in entries if e.job_id is not None and e.ours and e.marked and e.job_id != current_job]


def to_remove(entries: Iterable[Entry], live: set[int], current_job: int | None = None) -> list[Entry]:
    """The decision: raydist's entries of jobs SLURM does not list as live (never the current job's)."""
    return [e for e in candidates(entries, current_job) if e.job_id not in live]


def live_ids(squeue_output: str) -> set[int]:
    """Job ids in `squeue -h -o '%A %i'` output: each job's own id and, for array tasks ('1234_5', '1234_[6-9]')
    and het components ('1234+1'), the id before the separator as well. More ids count as live rather than fewer:
    a leftover kept is swept by a later job, a live job's dir removed is not recoverable."""
    return {int(m.group(0)) for token in squeue_output.split() if (m := _LEADING_ID.match(token))}


# ---- the thin layer: list, ask SLURM, remove ------------------------------------------------------------


def scan(root: Path, kind: str, uid: int | None = None) -> list[Entry]:
    """Every entry directly under `root` (none if it does not exist), classified by name and ownership."""
    uid = os.getuid() if uid is None else uid
    try:
        names = sorted(os.listdir(root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for name in names:
        path = root / name
        job = job_of(name, kind)
        try:
            st = os.lstat(path)
        except OSError:
            continue  # gone meanwhile
        ours = stat.S_ISDIR(st.st_mode) and st.st_uid == uid
        marked = True
        if kind == JOB and job is not None and ours:
            marked = any(os.path.lexists(path / m) for m in JOB_DIR_MARKERS)
        out.append(Entry(path, kind, job, ours, marked))
    return out


def ask_slurm(job_ids: Iterable[int], current_job: int | None, timeout: float = SQUEUE_TIMEOUT_S) -> set[int]:
    """The ids among (and around) `job_ids` that SLURM still runs, pending, suspended or completing included.

    The current job is always asked about too: with two or more ids squeue filters its full listing, where a single
    id it no longer knows would be an error, and the current job missing from the answer means the answer cannot
    be trusted.
    """
    ids = sorted(set(job_ids) | ({current_job} if current_job is not None else set()))
    cmd = ["squeue", "--noheader", "--array", "--format=%A %i"]
    if current_job is not None and len(ids) <= _MAX_LISTED_IDS:
        cmd.append("--jobs=" + ",".join(map(str, ids)))
    env = {k: v for k, v in os.environ.items() if not _SQUEUE_ENV.match(k)}
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"squeue did not answer within {timeout:.0f}s") from None
    except OSError as e:
        raise SlurmUnavailable(f"cannot run squeue: {e.strerror or e}") from None
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or [""])[-1]
        raise SlurmUnavailable(f"squeue exited {r.returncode}" + (f": {why}" if why else ""))
    live = live_ids(r.stdout)
    if current_job is not None and current_job not in live:
        raise SlurmUnavailable(f"squeue does not list this job ({current_job}) itself")
    return live


def _remove(path: Path) -> str | None:
    """None when `path` is gone, else why not."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def _some(items: list, limit: int = 5) -> str:
    """'a, b, c' or 'a, b, c, d, e and 3 more': one line however many."""
    shown = ", ".join(str(i) for i in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _names(entries: list[Entry]) -> str:
    return _some([e.path for e in entries])


def sweep(
    roots: list[tuple[Path, str]],
    current_job: int | None,
    who: str,
    ask: Callable[[list[int], int | None], set[int]] = ask_slurm,
) -> str | None:
    """Remove the leftovers of ended jobs under each (root, kind); one line saying what was done, or None when
    there was nothing to do. Never raises: a sweep must not fail a bring-up."""
    try:
        return _sweep(roots, current_job, who, ask)
    except Exception as e:  # noqa: BLE001 - whatever it is, bring-up goes on; the line says what happened
        return f"{who}: sweeping leftovers of ended jobs failed: {type(e).__name__}: {e}"


def _sweep(roots, current_job, who, ask) -> str | None:
    try:
        found = [e for root, kind in roots for e in candidates(scan(root, kind), current_job)]
    except OSError as e:
        return f"{who}: not sweeping leftovers of ended jobs: cannot list {e.filename}: {e.strerror}"
    if not found:
        return None
    try:
        live = ask(sorted({e.job_id for e in found}), current_job)
    except SlurmUnavailable as e:
        return (
            f"{who}: not removing {len(found)} possible leftover(s) of earlier jobs ({_names(found)}): "
            f"cannot ask SLURM which jobs are live: {e}"
        )
    gone = to_remove(found, live, current_job)
    if not gone:
        return None
    failed = [(e, why) for e in gone if (why := _remove(e.path))]
    removed = [e for e in gone if e not in {f for f, _ in failed}]
    jobs = sorted({e.job_id for e in gone})
    line = f"{who}: removed leftovers of ended job(s) {_some(jobs, 10)}: {_names(removed) or 'none'}"
    if failed:
        line += f"; could not remove {_some([f'{e.path} ({why})' for e, why in failed])}"
    return line
