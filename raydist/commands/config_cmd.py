"""`raydist config`: print a job's resolved config, or the config reference generated from the dataclasses."""

from __future__ import annotations

import argparse

import yaml

from raydist.config import CONFIG_DIR, job_defaults, load_config, reference_markdown


def _show(args: argparse.Namespace) -> int:
    cfg = load_config(job_defaults(args.job), args.config, args.overrides)
    print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
    return 0


def _reference(args: argparse.Namespace) -> int:
    print(reference_markdown(), end="")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="show a job's resolved config or the config reference")
    csub = p.add_subparsers(dest="config_command", required=True)
    show = csub.add_parser("show", help="validate and print the config a job would run with")
    jobs = sorted(f.stem for f in CONFIG_DIR.glob("*.yaml"))
    show.add_argument("--job", default="sync", choices=jobs, help="whose defaults to start from")
    show.add_argument("--config", action="append", default=[], metavar="FILE")
    show.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    show.set_defaults(func=_show)
    ref = csub.add_parser("reference", help="print the config reference (markdown), as in README.md")
    ref.set_defaults(func=_reference)
