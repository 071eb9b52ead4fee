"""The `raydist` console script: one sub-command per module listed in COMMANDS."""

from __future__ import annotations

import argparse
import importlib

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


def run() -> None:
    """The console script: `main`, then the process ends without the interpreter's teardown (raydist.process_exit),
    half a second of every command's wall time once Ray was imported. `main` is what tests call in-process."""
    from raydist.process_exit import exit_now

    try:
        code = main()
    except SystemExit as e:
        if not isinstance(e.code, int):
            raise
        code = e.code
    exit_now(code)


if __name__ == "__main__":
    run()
