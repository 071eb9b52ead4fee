"""Debian packages the tests use beyond the SLURM cluster's (prometheus, chromium): installed with apt-get when
missing, as CI runs as root on a fresh machine."""

from __future__ import annotations

import os
import shutil
import subprocess


class Unavailable(RuntimeError):
    """The program is missing and cannot be installed; the message says why and what to do."""


def ensure(binary: str, packages: list[str]) -> str:
    """The path of `binary`, installing `packages` first when it is missing."""
    found = shutil.which(binary)
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Unavailable(f"no {binary}: apt-get install {' '.join(packages)} (as root)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock = ["-o", "DPkg::Lock::Timeout=300"]  # another test may be installing its packages at the same time
    install = ["apt-get", *lock, "install", "-y", "-qq", "--no-install-recommends", *packages]
    # The package lists the machine has usually suffice; refresh them (slow) only when they do not.
    if subprocess.run(install, env=env, capture_output=True, text=True).returncode != 0:
        for cmd in (["apt-get", *lock, "update", "-qq"], install):
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["?"]
                raise Unavailable(f"could not install {' '.join(packages)} ({' '.join(cmd[:2])}...: {tail[0]}): "
                                  f"apt-get install {' '.join(packages)} by hand")
    found = shutil.which(binary)
    if not found:
        raise Unavailable(f"apt-get installed {' '.join(packages)} but there is no {binary} on PATH")
    return found
