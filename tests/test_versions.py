"""The Ray and torch versions raydist runs with are the ones pyproject declares and CI proves: anything else is
refused before anything starts, in one line, exit 2 (raydist/versions.py). `make test-min` runs the oldest Ray."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from raydist.versions import declared, refusal, satisfies

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "version, spec, ok",
    [
        ("2.60.0", ">=2.58,<2.61", True),
        ("2.58.0", ">=2.58,<2.61", True),
        ("2.55.1", ">=2.58,<2.61", False),
        ("2.61.0", ">=2.58,<2.61", False),
        ("3.0.0", ">=2.58,<2.61", False),
        ("2.13.0+cpu", ">=2.13,<2.14", True),
        ("2.14.0", ">=2.13,<2.14", False),
        ("2.13.1", "==2.13.*", True),
        ("2.58.0rc1", ">=2.58", True),
        ("2.60", ">=2.60.0", True),
    ],
)
def test_a_version_is_in_range_by_its_release_numbers(version, spec, ok):
    assert satisfies(version, spec) is ok


def test_the_range_is_read_from_raydists_own_metadata_as_pyproject_declares_it():
    wanted = declared(metadata.requires("raydist"))
    assert set(wanted) == {"ray", "torch"}
    text = (REPO / "pyproject.toml").read_text()
    for name, spec in wanted.items():
        lower, upper = sorted(spec.split(","), key=lambda c: not c.startswith(">="))
        assert f'"{name}' in text and lower in text and upper in text, (name, spec)
    # the ones this suite runs with are in it
    assert satisfies(metadata.version("ray"), wanted["ray"]) and satisfies(metadata.version("torch"), wanted["torch"])
    # an extra's requirement (torchft for the heal strategy) is not one a run needs
    assert declared(["torch<2.14,>=2.13", 'torchft<0.3,>=0.2; extra == "heal"']) == {"torch": ">=2.13,<2.14"}


def test_the_refusal_names_the_installed_version_and_the_range():
    assert refusal("ray", "2.60.0", ">=2.58,<2.61") is None and refusal("ray", None, ">=2.58,<2.61") is None
    assert refusal("ray", "2.55.1", ">=2.58,<2.61") == (
        "ray 2.55.1 is installed; raydist needs ray>=2.58,<2.61 (the versions its CI tests: install one of them, "
        "e.g. pip install 'ray>=2.58,<2.61')"
    )


@pytest.mark.parametrize("command", [["-m", "raydist.cli", "launch", "--", "python", "x.py"], ["jobs/sync.py"]])
def test_a_ray_outside_the_range_is_refused_in_one_line_before_anything_starts(tmp_path, command):
    # What the metadata says is installed: a dist-info ahead of site-packages on the path, as an older Ray's is.
    info = tmp_path / "ray-2.55.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ray\nVersion: 2.55.1\n")
    r = subprocess.run(
        [sys.executable, *command],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "HOME": str(tmp_path)},
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        "raydist: error: ray 2.55.1 is installed; raydist needs ray>=2.58,<2.61 (the "
        "versions its CI tests: install one of them, e.g. pip install "
        "'ray>=2.58,<2.61')"
    ], r.stderr
