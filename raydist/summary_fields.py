"""How a summary's field is declared: its default and the one line the generated field reference shows."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any


def described(help: str, default: Any = dataclasses.MISSING) -> Any:
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})
