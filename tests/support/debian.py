"""Debian packages the tests use (SLURM and munge for the emulated cluster, prometheus, chromium): installed with
apt-get when missing, as CI runs as root on a fresh machine."""

from __future__ import annotations

import os
import shutil
import subprocess


class Unavailable(RuntimeError):
    """A program is missing and cannot be installed; the message says why and what to do."""


def ensure(binaries: str | list[str], packages: list[str], install: bool = True) -> str:
    """The path of the (first) binary, installing `packages` first when any of `binaries` is missing."""
    wanted = [binaries] if isinstance(binaries, str) else list(binaries)
    missing = [b for b in wanted if shutil.which(b) is None]
    what = " ".join(packages)
    if missing and install:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise Unavailable(f"missing {', '.join(missing)}: apt-get install {what} (as root)")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        lock = ["-o", "DPkg::Lock::Timeout=300"]  # another test may be installing its packages at the same time
        command = ["apt-get", *lock, "install", "-y", "-qq", "--no-install-recommends", *packages]
        # The package lists the machine has usually suffice; refresh them (slow) only when they do not.
        if subprocess.run(command, env=env, capture_output=True, text=True).returncode != 0:
            for cmd in (["apt-get", *lock, "update", "-qq"], command):
                r = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if r.returncode != 0:
                    tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["?"]
                    raise Unavailable(
                        f"`{' '.join(cmd[:1] + cmd[3:5])} ...` failed ({tail[0]}): apt-get install {what} by hand"
                    )
        missing = [b for b in wanted if shutil.which(b) is None]
    if missing:
        raise Unavailable(f"missing {', '.join(missing)}: apt-get install {what}")
    return shutil.which(wanted[0]) or wanted[0]
