"""`raydist config`: print a job's resolved config, or a config reference generated from the dataclasses."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import yaml

from raydist import registry
from raydist.config import Config, job_defaults, load_config
from raydist.errors import ConfigError
from raydist.typedconfig import reference_markdown

DOCS = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def _tables() -> dict[str, tuple[str, str]]:
    """Marker name -> (the command that prints it, the generated table), for each table docs/configuration.md holds."""
    from raydist.launcher.settings import LaunchConfig
    from raydist.slurm.settings import ClusterConfig  # only here: `config show` needs nothing of the SLURM side

    return {
        "run-config": ("raydist config reference", reference_markdown(Config)),
        "cluster-config": ("raydist config reference --cluster", reference_markdown(ClusterConfig)),
        "launch-config": ("raydist config reference --launch", reference_markdown(LaunchConfig)),
    }


def _block(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- BEGIN {name} reference \(generated: [^)]*\) -->\n).*?(<!-- END {name} reference -->)", re.DOTALL
    )


def refreshed(text: str) -> str:
    """`text` (docs/configuration.md) with each generated table replaced by today's; its markers must be there."""
    for name, (_command, table) in _tables().items():
        text, found = _block(name).subn(lambda m: f"{m.group(1)}\n{table}\n{m.group(2)}", text)
        if found != 1:
            raise ConfigError(
                f"expected one '<!-- BEGIN {name} reference ...' ... '<!-- END {name} reference -->' block"
            )
    return text


def _show(args: argparse.Namespace) -> int:
    cfg = load_config(job_defaults(args.job), args.config, args.overrides, job=args.job)
    print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
    return 0


def _reference(args: argparse.Namespace) -> int:
    if args.write:
        path = Path(args.write)
        if not path.is_file():
            raise ConfigError(f"docs file not found: {path}")
        path.write_text(refreshed(path.read_text()))
        print(f"updated the config references in {path}")
        return 0
    print(_tables()["cluster-config" if args.cluster else "launch-config" if args.launch else "run-config"][1], end="")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="show a job's resolved config or the config reference")
    csub = p.add_subparsers(dest="config_command", required=True)
    show = csub.add_parser("show", help="validate and print the config a job would run with")
    show.add_argument(
        "--job",
        default=registry.names()[0],
        choices=registry.jobs(),
        help="whose defaults to start from (default: %(default)s)",
    )
    show.add_argument("--config", action="append", default=[], metavar="FILE")
    show.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    show.set_defaults(func=_show)
    ref = csub.add_parser("reference", help="print a config reference (markdown), as in docs/configuration.md")
    ref.add_argument(
        "--cluster", action="store_true", help="the cluster config's (cluster/cluster.yaml), not the run config's"
    )
    ref.add_argument("--launch", action="store_true", help="`raydist launch`'s settings")
    ref.add_argument(
        "--write",
        nargs="?",
        const=str(DOCS),
        metavar="FILE",
        help=f"rewrite every table in place in FILE (default {DOCS.relative_to(DOCS.parents[1])})",
    )
    ref.set_defaults(func=_reference)
