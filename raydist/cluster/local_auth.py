"""Ray's token auth as raydist uses it: a private token for the embedded instance, and checks of the token
settings a job brings when it joins a cluster (a wrong one would cost ~20 s of retries or abort Ray's C++ side).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

from raydist.errors import UsageError


def check_token_accepted(address: str) -> None:
    """A cluster with token auth on refuses a driver without its token, and ray.init retries that for ~20 s
    before failing with a line that does not say why: ask the GCS once, quietly, first."""
    if address.startswith("ray://") or address in ("auto", "local"):
        return
    try:
        from ray.exceptions import AuthenticationError

        from raydist.private_api import GcsClient
    except ImportError:
        return
    try:
        with _stderr_discarded():  # Ray's C++ client logs the refusal itself
            GcsClient(address=address)
    except AuthenticationError:
        mode = os.environ.get("RAY_AUTH_MODE", "")
        how = (
            "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN"
            if mode != "token"
            else "the token RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN gives is not this cluster's"
        )
        raise UsageError(
            f'Ray at {address} wants its auth token: {how} (for a raydist SLURM cluster: eval "$(raydist env)")'
        ) from None
    except Exception:
        return  # anything else: ray.init says it


@contextlib.contextmanager
def _stderr_discarded():
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as sink:
            os.dup2(sink.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


AUTH_DIR_PREFIX = "raydist-auth-"


def private_auth_token() -> str | None:
    """Turn token auth on for the embedded instance with a token of its own: a file of mode 0600 in a fresh 0700
    directory, named to Ray (and inherited by every Ray process this one starts) by RAY_AUTH_TOKEN_PATH, removed
    at exit. Left to itself Ray reuses, or writes, ~/.ray/auth_token with mode 0644: readable by every local user,
    and shared by every instance they start. Returns the file's path; None when RAY_AUTH_MODE turns auth off."""
    import atexit
    import secrets
    import shutil

    if os.environ.get("RAY_AUTH_MODE", "token") != "token":
        return None
    remove_stale_dirs(AUTH_DIR_PREFIX)
    directory = tempfile.mkdtemp(prefix=f"{AUTH_DIR_PREFIX}{os.getpid()}-")  # mode 0700
    atexit.register(shutil.rmtree, directory, True)  # registered before ray.init: runs after Ray's own shutdown
    path = os.path.join(directory, "auth_token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))  # what `ray get-auth-token --generate` writes: 256 random bits
    os.environ.pop("RAY_AUTH_TOKEN", None)  # it would win over the file
    os.environ["RAY_AUTH_TOKEN_PATH"] = path
    # RAY_AUTH_MODE stays as it is: unset, ray.init turns token auth on for a new instance itself (and refreshes
    # the config its C++ side read at import; setting it here would leave this process without auth).
    return path


def remove_stale_dirs(prefix: str) -> None:
    """This user's temp directories named `<prefix><pid>-...` (an embedded instance's token, its warm
    interpreter's socket) whose process is gone: killed before its atexit ran."""
    import glob
    import shutil

    for directory in glob.glob(os.path.join(tempfile.gettempdir(), f"{prefix}*-*")):
        pid = os.path.basename(directory)[len(prefix) :].split("-", 1)[0]
        try:
            if not pid.isdigit() or os.stat(directory).st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(directory, ignore_errors=True)
        except OSError:
            pass


def check_auth_env(joining: bool) -> None:
    """Ray's token settings in the environment: a mode Ray would quietly read as 'disabled', or (joining a cluster
    with auth on) a token file it cannot read, on which Ray's C++ loader aborts the process with a stack trace."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None and mode not in ("token", "disabled"):
        raise UsageError(f"RAY_AUTH_MODE must be token or disabled (got {mode!r}); Ray would turn auth off")
    if not joining or mode != "token" or os.environ.get("RAY_AUTH_TOKEN"):
        return  # the embedded instance brings its own token (private_auth_token)
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    try:
        empty = not Path(path).read_text().strip()
    except (OSError, UnicodeError) as e:
        raise UsageError(
            f"RAY_AUTH_MODE=token: cannot read the token file {path}: {getattr(e, 'strerror', None) or e}"
        ) from None
    if empty:
        raise UsageError(f"RAY_AUTH_MODE=token: the token file {path} is empty")
