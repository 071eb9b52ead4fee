"""torchrun's error file: where a script decorated with `torch.distributed.elastic.multiprocessing.errors.record`
writes the exception that ended it, so that the launcher names the root cause (type, message, file:line) rather
than the rank's last line. Each rank of each start gets its own path in TORCHELASTIC_ERROR_FILE, as torchrun
gives it; the format is torch's ErrorHandler.record_exception's (checked: torch 2.13)."""

from __future__ import annotations

import json
import re
from typing import Any

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)', re.MULTILINE)


def read_error_file(path: str) -> dict[str, Any] | None:
    """{'message': 'ValueError: ...', 'where': 'train.py:42' or ''} from the file a failed rank wrote; None when
    there is none (no @record, a signal) or it cannot be read."""
    if not path:
        return None
    try:
        with open(path) as f:
            data = json.load(f)
        message = data["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if isinstance(message, str):  # torch's own for a failure without a Python traceback
        return {"message": message.strip(), "where": ""}
    if not isinstance(message, dict):
        return None
    stack = str((message.get("extraInfo") or {}).get("py_callstack", ""))
    return {"message": str(message.get("message", "")).strip(), "where": innermost_frame(stack)}


def innermost_frame(traceback_text: str) -> str:
    """'path/to/file.py:LINE' of a formatted traceback's last frame (where the exception was raised); ''."""
    frames = _FRAME.findall(traceback_text)
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else ""


def describe(error: dict[str, Any] | None) -> str:
    """The root cause as one line's tail: 'ValueError: bad lr (at train.py:42)'; '' with no error file."""
    if not error or not error.get("message"):
        return ""
    first = error["message"].splitlines()[0]
    return first + (f" (at {error['where']})" if error.get("where") else "")
