"""How a summary's field is declared: its default and the one line the generated field reference shows."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any


def described(help: str, default: Any = dataclasses.MISSING, compare: str = "") -> Any:
    """`compare`: the header of the column `compare`'s table gives the field, for a strategy's own field that sets
    it apart from the others (the async PS's staleness); '' for none."""
    metadata = {"help": help, **({"compare": compare} if compare else {})}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)
