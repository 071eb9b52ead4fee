"""Files that are the old version or the whole new one, never a prefix: write aside, fsync, rename."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def write_atomic(path: str | os.PathLike, write: Callable[[IO[bytes]], Any], *, fsync: bool = True) -> None:
    """Write a file through `write(f)` under a temporary name, fsync it, then rename it: a reader, or a machine
    that lost power, sees the old file or the whole new one, never a prefix."""
    tmp = f"{os.fspath(path)}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: Path, data: Any) -> Path:
    write_atomic(path, lambda f: f.write((json.dumps(data, indent=1) + "\n").encode()))
    return path
