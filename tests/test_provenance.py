"""Every stored result a page quotes says where it came from, as its benchmark wrote it (benchmarks/stored.py
`stamp`): the clean commit it ran on, the date and the machine. A result measured on a tree with changes outside the
docs carries "-dirty" and is refused, as is a stamp without a machine or a date, or a commit that is not a whole
hash (one written in by hand). A result from before this rule was re-run by its benchmark or dropped from the
pages."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.jobutil import REPO

DATA = REPO / "docs" / "data"
COMMIT = re.compile(
    r"[0-9a-f]{40}(-copy)?"
)  # -copy: a tree copied to a lent GPU machine, its commit given by the caller


def quoted() -> list[str]:
    """The docs/data files README.md or a page under docs/ names."""
    text = "\n".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))])
    return sorted(p.name for p in DATA.glob("*.json") if p.name in text)


def problems(stored: dict) -> list[str]:
    """What is wrong with a stored result's stamp, and with any commit its rounds or points name. A file of halves
    that its benchmark runs apart (launch_first_step.json: `local` and `cluster`) has no stamp of its own: each
    half carries the one it was written with, and each is checked."""
    halves = {k: v for k, v in stored.items() if isinstance(v, dict) and "commit" in v}
    if "commit" not in stored and halves and len(halves) == len(stored):
        return [f"{k}: {problem}" for k, half in halves.items() for problem in problems(half)]
    if "commit" not in stored and "appended" in stored:  # a file its benchmark appends to (shaped_strategies)
        return appended_problems(stored)
    found = []
    if not COMMIT.fullmatch(str(stored.get("commit", ""))):
        found.append(f"commit {stored.get('commit')!r} is not a clean commit the benchmark stamped")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(stored.get("date", ""))):
        found.append("no date")
    if not (isinstance(stored.get("machine"), dict) and stored["machine"].get("cpus")):
        found.append("no machine")
    if any(isinstance(v, str) and "by hand" in v for v in stored.values()):
        found.append("its stamp was corrected by hand")
    for key in ("rounds", "points"):
        parts = stored.get(key)
        for part in parts if isinstance(parts, list) else []:
            if isinstance(part, dict) and "commit" in part and not COMMIT.fullmatch(str(part["commit"])):
                found.append(f"a part of {key} names commit {part['commit']!r}")
    return found


def appended_problems(stored: dict) -> list[str]:
    """A file of runs appended to one another (`setting`, then each of `appended`): every run carries its stamp,
    and every point names the commit of the run that measured it."""
    runs = [stored["setting"], *stored.get("appended", [])]
    found = [f"run {i}: {problem}" for i, run in enumerate(runs) for problem in problems(run)]
    commits = {run.get("commit") for run in runs}
    unnamed = [i for i, p in enumerate(stored.get("points", [])) if p.get("commit") not in commits]
    if unnamed:
        found.append(f"{len(unnamed)} points name no commit of the runs that wrote the file")
    return found


@pytest.mark.parametrize("name", quoted())
def test_a_quoted_result_names_the_clean_commit_it_ran_on_its_date_and_machine(name):
    assert problems(json.loads((DATA / name).read_text())) == [], name


def test_the_stamp_check_refuses_a_dirty_or_hand_written_commit():
    clean = {"commit": "a" * 40, "date": "2026-11-28", "machine": {"cpus": 2}}
    assert problems(clean) == []
    assert problems({**clean, "commit": "a" * 40 + "-dirty"}) and problems({**clean, "commit": "d7d92e4"})
    assert problems({**clean, "rounds": [{"commit": "b" * 40 + "-dirty"}]}) and problems({**clean, "date": None})
    appended = {"setting": clean, "appended": [{**clean, "commit": "b" * 40}], "points": [{"commit": "b" * 40}]}
    assert problems(appended) == []
    assert problems({**appended, "points": [{"commit": None}]}) and problems({**appended, "appended": [{}]})
    assert problems({"local": clean, "cluster": clean}) == []
    assert problems({"local": clean, "cluster": {**clean, "commit": "c" * 40 + "-dirty"}}) == [
        f"cluster: commit {'c' * 40 + '-dirty'!r} is not a clean commit the benchmark stamped"
    ]
    assert problems({"local": clean, "note": "a half without a stamp"})
