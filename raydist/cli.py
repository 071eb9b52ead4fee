"""The `raydist` console script: one sub-command per module listed in COMMANDS."""

from __future__ import annotations

import argparse
import importlib
import sys

from raydist.errors import exits_cleanly, fail

# Each module defines `register(subparsers)`, which adds its sub-command(s) and sets `func`
# (called with the parsed args, returns an exit status).
COMMANDS = [
    "raydist.config_command",
    "raydist.slurm.command",
    "raydist.doctor.command",
    "raydist.observability.command",
    "raydist.planning.command",
    "raydist.launcher.command",
]


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit 2 like every other raydist error."""

    def error(self, message: str):  # type: ignore[override]
        fail(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="raydist", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


@exits_cleanly
def main(argv: list[str] | None = None) -> int:
    from raydist.versions import check_versions

    check_versions()
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
