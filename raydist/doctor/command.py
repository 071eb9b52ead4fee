"""CLI: `raydist doctor`: one table of what is wrong with a running Ray cluster, node by node."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from raydist.errors import RaydistError, UsageError

MiB = 2**20


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0 (got {text})")
        return value

    return parse


def _size(text: str) -> int:
    from raydist.errors import ConfigError
    from raydist.slurm.settings import parse_size

    try:
        n = parse_size(text, "--bytes")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if n < 4:
        raise argparse.ArgumentTypeError(f"--bytes: at least 4 (one float32), got {text}")
    return n


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (got {text})")
    return value


def _target(args):
    """(GCS address, token path or None, connection or None): --address, else --job/--connection, else a
    RAY_ADDRESS that is a GCS address (as inside `ray job submit`), else the connection raydist env points at."""
    from raydist.cluster import connection
    from raydist.slurm import settings

    if args.address:
        if "://" in args.address:
            raise UsageError(
                f"--address: give the GCS address host:port, not {args.address} (the dashboard URL "
                f"is for ray job submit; --job ID finds the GCS of a raydist job)"
            )
        return args.address, os.environ.get("RAY_AUTH_TOKEN_PATH"), None
    env_address = os.environ.get("RAY_ADDRESS", "")
    if args.job is None and not args.connection and env_address and "://" not in env_address:
        return env_address, os.environ.get("RAY_AUTH_TOKEN_PATH"), None
    cfg = settings.load(args.config)
    path = connection.find(Path(os.path.expanduser(cfg.job_dir)), args.job, args.connection)
    conn = connection.read(path)
    return conn.gcs_address, conn.token_path, conn


def _connect(address: str, token_path: str | None) -> None:
    if token_path:
        # Before Ray is imported: it reads its auth settings once, at import.
        os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_path})
    os.environ.pop("RAY_ADDRESS", None)  # may be the dashboard URL, which ray.init would take for a client address
    import ray

    try:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    except Exception as e:  # Ray's ConnectionError and friends: one line, exit 1
        from raydist.doctor.runner import one_line

        raise RaydistError(f"doctor: cannot connect to the Ray cluster at {address}: {one_line(e)}") from None


def _doctor(args) -> int:
    from raydist.doctor import checks, report, runner
    from raydist.slurm import settings

    address, token, conn = _target(args)
    cfg = settings.load(args.config)
    opts = runner.Options(
        nbytes=args.bytes,
        iters=args.iters,
        backend=args.backend,
        link_gbps=args.link_gbps,
        min_ratio=args.min_ratio,
        timeout_s=args.timeout,
        connect_timeout_s=args.connect_timeout,
        bandwidth=not args.no_bandwidth,
        storage_path=args.storage_path,
        expected_nodes=tuple(conn.nodes) if conn else (),
        head=conn.head if conn else None,
        head_ip=conn.head_ip if conn else None,
        interfaces=dict(cfg.interfaces),
    )
    _connect(address, token)
    import ray

    try:
        rep = runner.run(
            opts, log=(lambda m: print(m, file=sys.stderr, flush=True)) if args.verbose else (lambda _: None)
        )
    finally:
        ray.shutdown()
    if args.json:
        print(
            report.as_json(rep.rows, address=address, nodes=rep.facts, matrix=rep.matrix, bandwidth=rep.bandwidth),
            flush=True,
        )
    else:
        print(report.table(rep.rows), flush=True)
    line = checks.exit_line(rep.rows)
    if line:
        raise RaydistError(line)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="check a running Ray cluster node by node: interfaces, the 127.0.1.1 trap, "
        "free space, clocks, reachability, bandwidth; exit 1 naming what failed",
    )
    p.add_argument(
        "--address",
        help="GCS address host:port (default: $RAY_ADDRESS if it is one, else the raydist job's connection file)",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="cluster config: interfaces and job_dir (default: $RAYDIST_CLUSTER_CONFIG, else ./cluster/cluster.yaml)",
    )
    p.add_argument(
        "--job", type=int, help="SLURM job id of a raydist cluster (default: $RAYDIST_CONNECTION, else the newest job)"
    )
    p.add_argument("--connection", metavar="FILE", help="a connection file to read instead")
    p.add_argument("--storage-path", metavar="PATH", help="also check free space here on every node (run.storage_path)")
    p.add_argument(
        "--link-gbps",
        type=_positive(float),
        metavar="GBPS",
        help="the links' expected speed (default: what the kernel reports per interface, if anything)",
    )
    p.add_argument(
        "--min-ratio",
        type=_ratio,
        default=0.1,
        metavar="R",
        help="fail a bandwidth figure below R times its bound (default 0.1; 0: never)",
    )
    p.add_argument(
        "--bytes",
        type=_size,
        default=64 * MiB,
        metavar="SIZE",
        help="buffer of the bandwidth tests, e.g. 64MiB (default)",
    )
    p.add_argument("--iters", type=_positive(int), default=5, help="timed iterations per test (default 5)")
    p.add_argument(
        "--backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="auto: NCCL when every node has a GPU, else gloo",
    )
    p.add_argument("--no-bandwidth", action="store_true", help="skip the bandwidth tests")
    p.add_argument(
        "--timeout",
        type=_positive(float),
        default=30.0,
        metavar="S",
        help="bound of each phase in seconds (default 30)",
    )
    p.add_argument(
        "--connect-timeout",
        type=_positive(float),
        default=2.0,
        metavar="S",
        help="bound of each TCP connect of the reachability matrix (default 2)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--verbose", action="store_true", help="progress on stderr")
    p.set_defaults(func=_doctor)
