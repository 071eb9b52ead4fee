"""`raydist top`: a live view of the training processes of a running cluster (raydist/observability/top.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from raydist.errors import RaydistError, UsageError


def cluster_source(args):
    from raydist.observability import top

    if args.address or args.job is not None or args.connection:
        if args.address:
            url = args.address.rstrip("/")
            if not url.startswith(("http://", "https://")):
                raise UsageError(f"--address {args.address}: give the dashboard's URL, http://HOST:PORT")
            token_path = args.token_file or os.environ.get("RAY_AUTH_TOKEN_PATH")
            describe = f"cluster {url}"
        else:
            from raydist.slurm.command import find_connection

            _, conn = find_connection(args)
            url, token_path, describe = (
                conn.dashboard_url,
                conn.token_path,
                f"SLURM job {conn.job_id} ({conn.dashboard_url})",
            )
        token = None
        if token_path:
            try:
                token = Path(token_path).read_text().strip()
            except OSError as e:
                raise RaydistError(f"cannot read the token {token_path}: {e.strerror}") from None
        return top.Source(describe=describe, dashboard_url=url, token=token, token_path=token_path)
    address = os.environ.get("RAY_ADDRESS", "")
    if address.startswith(("http://", "https://")):  # what `raydist env` exports
        args.address = address
        return cluster_source(args)
    return top.local_source(args.temp_dir)


def _top(args) -> int:
    from raydist.observability import top

    if args.interval <= 0:
        raise UsageError(f"--interval {args.interval:g}: must be > 0")
    source = cluster_source(args)
    if args.once:
        snap = top.snapshot(source)
        if args.json:
            print(json.dumps(snap, indent=1))
        else:
            print(top.table(snap["runs"], snap["dead_nodes"], snap["source"], snap["time"]))
        return 0
    tty = sys.stdout.isatty()
    shown: list = []
    try:
        while True:
            snap = top.snapshot(source)
            shown = top.with_gone(shown, snap["runs"])  # a worker that died stays on its run's list as `gone`
            text = top.table(shown, snap["dead_nodes"], snap["source"], snap["time"])
            if snap["unreachable"]:
                text += "\nno answer from: " + "; ".join(snap["unreachable"])
            # In place on a terminal (home, clear to the end); a log gets one table after another.
            print(("\x1b[H\x1b[J" if tty else "\n") + text, flush=True)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def which_cluster(p: argparse.ArgumentParser) -> None:
    """The options that name a cluster, shared with `raydist prometheus-config`."""
    p.add_argument(
        "--address",
        help="the cluster's dashboard URL, http://HOST:PORT (default: $RAY_ADDRESS when it "
        "is one, else the Ray instance on this machine)",
    )
    p.add_argument("--token-file", help="the cluster's auth token file (default: $RAY_AUTH_TOKEN_PATH)")
    p.add_argument("--job", type=int, help="a SLURM job's cluster (cluster/ray_up.slurm)")
    p.add_argument("--connection", metavar="FILE", help="a SLURM job's connection file")
    p.add_argument("--config", metavar="FILE", help="cluster config, for --job (default: as `raydist status`)")
    p.add_argument("--temp-dir", default="/tmp/ray", help="a local Ray instance's temp dir (default: /tmp/ray)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "top",
        help="live view of a running cluster's training processes: node, rank, step, "
        "samples/s, communication wait, staleness, last checkpoint, state",
    )
    which_cluster(p)
    p.add_argument("--once", action="store_true", help="print one view and exit")
    p.add_argument("--json", action="store_true", help="with --once: machine-readable")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default: 2)")
    p.set_defaults(func=_top)

    p = sub.add_parser(
        "prometheus-config",
        help="print a prometheus.yml that scrapes a cluster's metrics (Debian's prometheus; docs/observability.md)",
    )
    which_cluster(p)
    p.add_argument("--interval", type=float, default=5.0, help="scrape interval in seconds (default: 5)")
    p.set_defaults(func=_prometheus_config)


def _prometheus_config(args) -> int:
    from raydist.observability.prometheus import scrape_config

    if args.interval <= 0:
        raise UsageError(f"--interval {args.interval:g}: must be > 0")
    source = cluster_source(args)
    if source.sd_file is not None:
        # The session's own file moves with every new session; the legacy link in the temp dir follows the newest.
        text = scrape_config(
            sd_file=os.path.join(args.temp_dir, "prom_metrics_service_discovery.json"), interval_s=args.interval
        )
    else:
        text = scrape_config(dashboard_url=source.dashboard_url, token_file=source.token_path, interval_s=args.interval)
    print(text, end="")
    return 0
