"""The embedded local Ray instance's token auth: a private per-run token, never ~/.ray/auth_token."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from raydist.cluster.local_auth import AUTH_DIR_PREFIX, private_auth_token
from tests.support.jobutil import REPO, clean_env

TOKEN_LINE = re.compile(r"the dashboard's token is in (\S+) ")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_private_token_file_for_the_embedded_instance(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "would-win-over-the-file")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/somebody/elses")
    path = Path(private_auth_token())
    assert path.parent.parent == tmp_path and path.parent.name.startswith(f"{AUTH_DIR_PREFIX}{os.getpid()}-")
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    assert re.fullmatch(r"[0-9a-f]{64}", path.read_text())
    assert os.environ["RAY_AUTH_TOKEN_PATH"] == str(path) and "RAY_AUTH_TOKEN" not in os.environ
    assert "RAY_AUTH_MODE" not in os.environ  # ray.init turns auth on itself (see private_auth_token)


def test_auth_mode_disabled_gets_no_token(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    assert private_auth_token() is None
    assert list(tmp_path.iterdir()) == [] and "RAY_AUTH_TOKEN_PATH" not in os.environ


def test_token_dirs_of_dead_processes_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names no process now (reuse within this test is not a worry)
    stale = tmp_path / f"{AUTH_DIR_PREFIX}{gone.pid}-abc"
    alive = tmp_path / f"{AUTH_DIR_PREFIX}{os.getppid()}-abc"
    for d in (stale, alive):
        d.mkdir(mode=0o700)
        (d / "auth_token").write_text("x")
    mine = Path(private_auth_token()).parent
    assert not stale.exists() and alive.exists() and mine.exists()


def _status(url: str, token: str | None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.slow
def test_a_real_run_keeps_its_token_private_and_leaves_home_ray_alone(tmp_path):
    home = tmp_path / "home"
    decoy = home / ".ray" / "auth_token"  # what Ray would use (and share) if left to itself
    decoy.parent.mkdir(parents=True)
    decoy.write_text("0" * 64)
    decoy.chmod(0o644)
    before = decoy.stat()
    tmp = Path(tempfile.mkdtemp(prefix="rdt-", dir="/tmp"))  # short: Ray's socket paths are under it
    err_path = tmp_path / "stderr"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "jobs" / "sync.py"),
                "--set",
                f"run.storage_path={tmp_path / 'runs'}",
                "--set",
                "train.max_steps=200",
                "--set",
                "checkpoint.every_steps=100",
            ],
            cwd=REPO,
            env=clean_env(HOME=str(home), TMPDIR=str(tmp)),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        out = []
        token_path = None
        for line in proc.stdout:  # the token line comes right after Ray started, before training
            out.append(line)
            if m := TOKEN_LINE.search(line):
                token_path = Path(m.group(1))
                break
        assert token_path is not None, "".join(out)[-3000:] + err_path.read_text()[-3000:]
        assert token_path.parent.parent == tmp and _mode(token_path) == 0o600 and _mode(token_path.parent) == 0o700
        token = token_path.read_text()
        # Ray copies the token nowhere else: no other file under HOME or TMPDIR (Ray's session dir is there) holds it.
        holders = [
            p
            for root in (home, tmp)
            for p in root.rglob("*")
            if p.is_file() and not p.is_socket() and token.encode() in _read(p)
        ]
        assert holders == [token_path]
        url = re.search(r"dashboard at \S*?(http://127\.0\.0\.1:\d+)", err_path.read_text())
        assert url, err_path.read_text()[-3000:]
        assert _status(f"{url.group(1)}/api/jobs/", token) == 200
        assert _status(f"{url.group(1)}/api/jobs/", None) in (401, 403)
        assert _status(f"{url.group(1)}/api/jobs/", decoy.read_text()) in (401, 403)
        rest, _ = proc.communicate(timeout=600)
        out.append(rest)
        assert proc.returncode == 0, "".join(out)[-3000:] + err_path.read_text()[-3000:]
        assert json.loads(out[-1].strip().splitlines()[-1])["steps"] == 200
        assert not token_path.parent.exists()  # removed at exit
        after = decoy.stat()  # ~/.ray/auth_token neither used (above) nor written; nothing else in HOME either
        assert (after.st_mtime_ns, after.st_size, decoy.read_text()) == (before.st_mtime_ns, before.st_size, "0" * 64)
        assert sorted(p.relative_to(home).as_posix() for p in home.rglob("*")) == [".ray", ".ray/auth_token"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
