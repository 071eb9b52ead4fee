"""The one table of `raydist doctor`, its --json form, and the exit line."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from raydist.doctor.checks import Row, exit_line

HEADER = ("NODE", "CHECK", "STATUS", "VALUE", "DETAIL")


def table(rows: Iterable[Row]) -> str:
    cells = [HEADER] + [
        (r.node, r.check, r.status.upper() if r.status == "fail" else r.status, r.value, r.detail) for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(row[:-1], widths)), row[-1]]).rstrip() for row in cells)


def as_json(rows: list[Row], **extra: Any) -> str:
    return json.dumps(
        {
            "ok": exit_line(rows) is None,
            "failing": [r.name for r in rows if r.status == "fail"],
            "rows": [dataclasses.asdict(r) for r in rows],
            **extra,
        },
        indent=1,
        default=str,
    )
