"""Sync vs async where bandwidth matters: every strategy on the emulated cluster's shaped links.

    flock /tmp/raydist-emu.lock .venv/bin/python -m benchmarks.shaped_strategies --links 100,1000 \
        --out docs/data/shaped_runs.json

(root: it builds a 6-host emulated SLURM cluster (tests/support/cluster/emucluster.py), brings Ray up on it with
cluster/ray_up.slurm and submits every run with `ray job submit` from master-node, as a user would.) For each link
rate (every host's link shaped to it, both ways: a switch port of that speed):

- fan-in: jobs/async.py, 4 workers (one per host), 1, 2 and 4 server shards spread over the hosts (the two hosts
  without a worker first); global steps/s against the busiest link's bound (`raydist.strategies.async_ps.cost.ps_link_bound`);
- strategies: jobs/compare.py with sync DDP, local SGD, async PS and FSDP, with and without a 4x straggler: time to
  the target accuracy, final accuracy, steps/s;
- size: sync and async on a model 4x larger, for the cost model's validation;
- ring: local SGD with ring averaging, with and without the straggler;
- checkpoint: local SGD with per-epoch checkpoints against only the last one;
- real: examples/tinygpt (a GPT-style model given by import path) with every strategy in one compare run,
  submitted from examples/: the real-model rows, and the cost model's check on another kind of model;
- workers: every strategy at 2 and 3 workers (`--other-workers`), for the cost model's check at worker counts it
  was not fitted on (not in the default parts: `--parts workers --append`). Each of these runs records how busy the
  machine's cores were while it ran; with `--hosts 8` and a file of their own they answer whether 2 cores can stand
  for more nodes:

    flock /tmp/raydist-emu.lock .venv/bin/python -m benchmarks.shaped_strategies --parts workers --hosts 8 \
        --other-workers 4,6 --strategies sync,local_sgd --out docs/data/more_hosts.json

Every run's summary lands in one JSON file: the measured points `raydist plan` fits and validates its cost model on
(docs/costmodel.md). Tables go to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.stored import stamp

REPO = Path(__file__).resolve().parents[1]

from raydist import registry  # noqa: E402

STRATEGIES = tuple(spec.name for spec in registry.modelled())
"""What the cost model is fitted on: every strategy with cost terms (`StrategySpec.cost`)."""


def hosts(count: int = 6):
    """Six hosts by default, like the product's typical cluster: 4 workers leave two nodes free for server shards.
    More (`--hosts`) for the question whether 2 cores can stand for more nodes (`cpu_busy` of each run answers it)."""
    from tests.support.cluster.emucluster import DEFAULT_HOSTS, Host

    names = ("eno1", "enp3s0", "ens1f1", "eno2", "enp4s0", "ens2f0")  # interface names differ per node
    extra = [Host(f"node{i:02d}", f"192.168.20.{15 + i}", names[(i - 3) % len(names)]) for i in range(3, count)]
    return (*DEFAULT_HOSTS, *extra)


class CpuBusy:
    """The machine's CPU busy share, second by second, while a run lasts (every emulated host shares these cores,
    so /proc/stat counts them all): the median second at or near 1.0 means the cores, not the links, set the pace."""

    def __init__(self):
        import threading

        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def _ticks() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle and iowait
        return sum(fields[:8]) - idle, sum(fields[:8])

    def _sample(self) -> None:
        busy, total = self._ticks()
        while not self._stop.wait(1.0):
            b, t = self._ticks()
            if t > total:
                self.samples.append((b - busy) / (t - total))
            busy, total = b, t

    def __enter__(self) -> CpuBusy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        import statistics

        s = self.samples or [0.0]
        return {
            "cpu_busy_median": round(statistics.median(s), 3),
            "cpu_busy_share_over_95": round(sum(x >= 0.95 for x in s) / len(s), 3),
        }


def workload(a: argparse.Namespace) -> list[str]:
    """The shared setting: the synthetic task and an MLP of a.params parameters, 4 workers, evaluated every epoch."""
    return [
        "--set",
        "data.name=synthetic",
        "--set",
        f"data.synthetic_samples={a.samples}",
        "--set",
        f"data.synthetic_features={a.features}",
        "--set",
        f"data.synthetic_classes={a.classes}",
        "--set",
        "model.name=mlp",
        "--set",
        f"model.params={a.params}",
        "--set",
        f"train.epochs={a.epochs}",
        "--set",
        f"scaling.num_workers={a.workers}",
        "--set",
        "run.tensorboard=false",
    ]


def param_count(a: argparse.Namespace) -> int:
    from raydist.config import ModelConfig
    from raydist.torchkit.model_size import mlp_params, mlp_width

    depth = ModelConfig().depth
    return mlp_params(a.features, a.classes, mlp_width(a.params, a.features, a.classes, depth), depth)


def submit(cluster, job, args: list[str], what: str, working_dir: str = ".") -> dict:
    """Run one job from master-node as a user would; returns the machine's CPU busy share while it ran."""
    cmd = ["ray", "job", "submit", "--working-dir", working_dir, "--", "python", *args]
    t = time.monotonic()
    with CpuBusy() as cpu:
        r = cluster.run("master-node", cmd, env=job.env(), timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"{what} failed (exit {r.returncode}): {(r.stdout + r.stderr)[-3000:]}")
    print(f"  {what}: {time.monotonic() - t:.0f} s, CPU busy {cpu.summary()}", flush=True)
    return cpu.summary()


def point(summary: dict, a: argparse.Namespace, link: float, params: int = 0, train_samples: int = 0, **extra) -> dict:
    """One run's figures, with what the cost model needs of its setting: the model's parameter count (default:
    the MLP's), the link and `checkpoint_every` (steps per epoch: every job checkpoints each epoch)."""
    keep = (
        "strategy",
        "workers",
        "steps",
        "steps_per_s",
        "samples_per_s",
        "train_time_s",
        "wall_s",
        "test_accuracy",
        "bytes_per_worker",
        "wait_s_per_worker",
        "servers",
        "server_hosts",
        "staleness_mean",
        "steps_per_worker",
        "peak_memory_bytes_per_worker",
    )
    per_step = 32 * (1 if summary["strategy"] == "async" else summary["workers"])
    steps_per_epoch = (train_samples or int(a.samples * 0.8)) // per_step  # data.test_fraction 0.2
    return {
        **{k: summary.get(k) for k in keep},
        "link_mbit": link,
        "params": params or param_count(a),
        "batch_size": 32,
        "checkpoint_every": steps_per_epoch,
        **extra,
    }


def fan_in(cluster, job, a, link: float, storage: Path) -> list[dict]:
    out = []
    for servers in (1, 2, 4):
        name = f"fanin-{link:g}-{servers}"
        submit(
            cluster,
            job,
            [
                "jobs/async.py",
                *workload(a),
                "--set",
                f"train.epochs={a.fanin_epochs}",
                "--set",
                f"async_ps.num_servers={servers}",
                "--set",
                f"run.storage_path={storage}",
                "--set",
                f"run.name={name}",
            ],
            name,
        )
        s = json.loads((storage / name / "summary.json").read_text())
        out.append(point(s, a, link, part="fanin", straggler=False))
        print(f"    {servers} shard(s) on {s['server_hosts']}: {s['steps_per_s']:.1f} steps/s", flush=True)
    return out


def strategies(cluster, job, a, link: float, storage: Path, straggler: bool) -> list[dict]:
    name = f"compare-{link:g}-{'straggler' if straggler else 'even'}"
    slow = ["--set", "straggler.worker=0", "--set", "straggler.slowdown=4"] if straggler else []
    submit(
        cluster,
        job,
        [
            "jobs/compare.py",
            *workload(a),
            *slow,
            "--set",
            f"compare.strategies={','.join(a.strategies)}",
            "--set",
            f"compare.target_accuracy={a.target}",
            "--set",
            f"run.storage_path={storage}",
            "--set",
            f"run.name={name}",
        ],
        name,
    )
    results = json.loads((storage / name / "results.json").read_text())
    out = []
    for r in results["strategies"].values():
        out.append(
            point(
                r["summary"],
                a,
                link,
                part="compare",
                straggler=straggler,
                time_to_target_s=r["time_to_target_s"],
                target=a.target,
            )
        )
    return out


def ring(cluster, job, a, link: float, storage: Path, straggler: bool) -> list[dict]:
    """Local SGD with ring averaging (each worker mixes in one neighbour's parameters) in a compare run of its own:
    compare runs a strategy once per run."""
    name = f"ring-{link:g}-{'straggler' if straggler else 'even'}"
    slow = ["--set", "straggler.worker=0", "--set", "straggler.slowdown=4"] if straggler else []
    submit(
        cluster,
        job,
        [
            "jobs/compare.py",
            *workload(a),
            *slow,
            "--set",
            "compare.strategies=local_sgd",
            "--set",
            "local_sgd.averaging=ring",
            "--set",
            f"compare.target_accuracy={a.target}",
            "--set",
            f"run.storage_path={storage}",
            "--set",
            f"run.name={name}",
        ],
        name,
    )
    r = json.loads((storage / name / "results.json").read_text())["strategies"]["local_sgd"]
    return [
        point(
            r["summary"],
            a,
            link,
            part="compare",
            straggler=straggler,
            time_to_target_s=r["time_to_target_s"],
            target=a.target,
            averaging="ring",
        )
    ]


def other_size(cluster, job, a, link: float, storage: Path) -> list[dict]:
    """sync and async (2 shards) on a model a.size_params large: held out of the cost model's fit, they check
    that its base time scales with the parameter count."""
    sized = argparse.Namespace(**{**vars(a), "params": a.size_params})
    out = []
    for strategy, extra in (("sync", []), ("async", ["--set", "async_ps.num_servers=2"])):
        name = f"size-{link:g}-{strategy}"
        submit(
            cluster,
            job,
            [
                f"jobs/{strategy}.py",
                *workload(sized),
                "--set",
                f"train.epochs={a.fanin_epochs}",
                *extra,
                "--set",
                f"run.storage_path={storage}",
                "--set",
                f"run.name={name}",
            ],
            name,
        )
        s = json.loads((storage / name / "summary.json").read_text())
        out.append(point(s, sized, link, part="size", straggler=False))
    return out


def checkpoint_cost(cluster, job, a, link: float, storage: Path) -> list[dict]:
    """local SGD with its per-epoch checkpoints and with none but the last: what its checkpoints cost (each rank
    writes its own replica's model and optimizer state to the run's storage)."""
    out = []
    for label, extra in (("per-epoch", []), ("last-only", ["--set", "checkpoint.every_steps=1000000"])):
        name = f"ckpt-{link:g}-{label}"
        submit(
            cluster,
            job,
            [
                "jobs/local_sgd.py",
                *workload(a),
                *extra,
                "--set",
                f"run.storage_path={storage}",
                "--set",
                f"run.name={name}",
            ],
            name,
        )
        s = json.loads((storage / name / "summary.json").read_text())
        out.append(
            point(s, a, link, part=f"checkpoint-{label}", straggler=False, **({"checkpoint_every": 0} if extra else {}))
        )
        print(f"    local SGD, checkpoints {label}: {s['steps_per_s']:.1f} steps/s", flush=True)
    return out


def other_workers(cluster, job, a, link: float, storage: Path) -> list[dict]:
    """Every strategy in one compare run per worker count of a.other_workers (no straggler): the cost model fits on
    the most common count and checks its predictions at these."""
    out = []
    for workers in a.other_workers:
        fewer = argparse.Namespace(**{**vars(a), "workers": workers})
        name = f"workers{workers}-{link:g}"
        cpu = submit(
            cluster,
            job,
            [
                "jobs/compare.py",
                *workload(fewer),
                "--set",
                f"compare.strategies={','.join(a.strategies)}",
                "--set",
                f"compare.target_accuracy={a.target}",
                "--set",
                f"run.storage_path={storage}",
                "--set",
                f"run.name={name}",
            ],
            name,
        )
        results = json.loads((storage / name / "results.json").read_text())
        for r in results["strategies"].values():
            out.append(
                point(
                    r["summary"],
                    fewer,
                    link,
                    part="workers",
                    straggler=False,
                    time_to_target_s=r["time_to_target_s"],
                    target=a.target,
                    **cpu,
                )
            )
            print(
                f"    {r['summary']['strategy']}, {workers} workers: {r['summary']['steps_per_s']:.1f} steps/s",
                flush=True,
            )
    return out


REAL_CONFIG = "tinygpt/tinygpt.yaml"  # examples/tinygpt, relative to examples/
REAL_TRAIN_SAMPLES = 4096  # its data.args.samples


def real_model(cluster, job, a, link: float, storage: Path) -> list[dict]:
    """examples/tinygpt (a GPT-style model on synthetic tokens, given by import path) with every strategy in one
    compare run, submitted from examples/ as its users submit it: the "real model" rows, and the cost model's
    check on a model of another kind (its sync run gives the compute per step; costmodel.anchor)."""
    from raydist.planning.costmodel import BYTES_PER_PARAM

    name = f"real-{link:g}"
    submit(
        cluster,
        job,
        [
            "-m",
            "raydist.job",
            "compare",
            "--config",
            REAL_CONFIG,
            "--set",
            f"scaling.num_workers={a.workers}",
            "--set",
            f"compare.strategies={','.join(a.strategies)}",
            "--set",
            "run.tensorboard=false",
            "--set",
            f"run.storage_path={storage}",
            "--set",
            f"run.name={name}",
        ],
        name,
        working_dir="examples",
    )
    run = json.loads((storage / name / "results.json").read_text())
    results = run["strategies"]
    params = (
        next(r["summary"]["param_bytes_per_worker"][0] for r in results.values() if r["summary"]["strategy"] == "sync")
        // BYTES_PER_PARAM
    )
    return [
        point(
            r["summary"],
            a,
            link,
            params=params,
            train_samples=REAL_TRAIN_SAMPLES,
            part="compare",
            straggler=False,
            model="tinygpt",
            time_to_target_s=r["time_to_target_s"],
            target=run["target_accuracy"],
        )
        for r in results.values()
    ]


def repeats(points: list[dict], part: str) -> list[list[dict]]:
    """The runs of one part grouped by setting, in first-run order: a run repeated with --append is one row."""
    groups: dict[tuple, list[dict]] = {}
    for p in points:
        if p["part"] == part:
            key = (
                p["link_mbit"],
                p["straggler"],
                p["strategy"],
                p.get("averaging"),
                p.get("servers"),
                p["params"],
                p.get("model"),
            )
            groups.setdefault(key, []).append(p)
    return list(groups.values())


def spread(values: list[float], digits: int) -> str:
    """The mean, and the lowest and highest when there are repeats."""
    mean = sum(values) / len(values)
    return f"{mean:.{digits}f}" + (f" ({min(values):.{digits}f}-{max(values):.{digits}f})" if len(values) > 1 else "")


def fanin_table(points: list[dict], hosts: int) -> str:
    """Measured async rate against the busiest link's bound at the raw link rate (raydist.planning.costmodel)."""
    from raydist.planning import costmodel as cm
    from raydist.strategies.async_ps.cost import ps_link_bound

    rows = [
        "| link | shards | runs | measured steps/s | busiest link's bound | measured / bound | MB/s moved by the "
        "workers |",
        "|---|---|---|---|---|---|---|",
    ]
    for runs in repeats(points, "fanin"):
        p = runs[0]
        s = cm.setting_of({**p, "nodes": hosts})
        bound = ps_link_bound(cm.Fit(1.0, {"async": 0.0}, p["params"]), s)
        rates = [r["steps_per_s"] for r in runs]
        moved = [sum(r["bytes_per_worker"]) / r["train_time_s"] / 1e6 for r in runs]
        rows.append(
            f"| {p['link_mbit']:g} Mbit/s | {p['servers']} | {len(runs)} | {spread(rates, 1)} | {bound:.1f} | "
            f"{spread([r / bound for r in rates], 2)} | {spread(moved, 1)} |"
        )
    return "\n".join(rows)


def strategies_table(points: list[dict]) -> str:
    rows = [
        "| link | straggler | strategy | runs | steps/s | time to target (s) | final accuracy |",
        "|---|---|---|---|---|---|---|",
    ]
    for runs in repeats(points, "compare"):
        p = runs[0]
        reached = [r["time_to_target_s"] for r in runs if r.get("time_to_target_s") is not None]
        ttt = (
            spread(reached, 1) + (f", {len(runs) - len(reached)} not reached" if len(reached) < len(runs) else "")
            if reached
            else "not reached"
        )
        name = (
            p["strategy"]
            + (" (ring)" if p.get("averaging") == "ring" else "")
            + (f", {p['model']}" if p.get("model") else "")
        )
        rows.append(
            f"| {p['link_mbit']:g} Mbit/s | {'rank 0, 4x' if p['straggler'] else '-'} | {name} | {len(runs)} | "
            f"{spread([r['steps_per_s'] for r in runs], 2)} | {ttt} | "
            f"{spread([r['test_accuracy'] for r in runs], 3)} |"
        )
    return "\n".join(rows)


def plots(points: list[dict], hosts: int, directory: Path) -> list[Path]:
    """docs/images/shaped_fanin.png (async rate per shard count against its link bound) and
    shaped_time_to_target.png (each strategy's time to the target, per link rate, with and without a straggler)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from raydist.planning import costmodel as cm
    from raydist.strategies.async_ps.cost import ps_link_bound

    directory.mkdir(parents=True, exist_ok=True)
    fan = [p for p in points if p["part"] == "fanin"]
    links = sorted({p["link_mbit"] for p in fan})
    fig, axes = plt.subplots(1, len(links), figsize=(5 * len(links), 3.6), squeeze=False)
    for ax, link in zip(axes[0], links):
        groups = sorted(
            (g for g in repeats(points, "fanin") if g[0]["link_mbit"] == link), key=lambda g: g[0]["servers"]
        )
        shards = [str(g[0]["servers"]) for g in groups]
        bounds = [
            ps_link_bound(
                cm.Fit(1.0, {"async": 0.0}, g[0]["params"]),
                cm.setting_of({**g[0], "nodes": hosts}),
            )
            for g in groups
        ]
        rates = [[p["steps_per_s"] for p in g] for g in groups]
        mean = [sum(r) / len(r) for r in rates]
        ax.bar(
            shards,
            mean,
            color="tab:blue",
            label="measured (mean; bars: lowest-highest)",
            yerr=[[m - min(r) for m, r in zip(mean, rates)], [max(r) - m for m, r in zip(mean, rates)]],
        )
        ax.plot(shards, bounds, "k_", markersize=30, mew=2, label="busiest link's bound")
        ax.set_title(f"async PS, 4 workers, {link:g} Mbit/s links")
        ax.set_xlabel("server shards")
        ax.set_ylabel("steps/s (all workers)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = [directory / "shaped_fanin.png"]
    fig.savefig(out[0], dpi=110)
    plt.close(fig)

    comp = [p for p in points if p["part"] == "compare" and not p.get("model")]  # the MLP's; tinygpt's in tables
    settings = sorted({(p["link_mbit"], p["straggler"]) for p in comp})
    key = lambda p: p["strategy"] + (" (ring)" if p.get("averaging") == "ring" else "")  # noqa: E731
    strategies = list(dict.fromkeys(key(p) for p in comp))
    fig, ax = plt.subplots(figsize=(10, 3.8))
    width = 0.8 / len(strategies)
    for i, strategy in enumerate(strategies):
        values = []
        for link, straggler in settings:
            match = [
                p["time_to_target_s"]
                for p in comp
                if (p["link_mbit"], p["straggler"], key(p)) == (link, straggler, strategy)
                and p.get("time_to_target_s") is not None
            ]
            values.append(match)
        mean = [sum(v) / len(v) if v else 0 for v in values]
        ax.bar(
            [k + i * width for k in range(len(settings))],
            mean,
            width,
            label=strategy,
            yerr=[
                [m - min(v, default=0) for m, v in zip(mean, values)],
                [max(v, default=0) - m for m, v in zip(mean, values)],
            ],
        )
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(settings))])
    ax.set_xticklabels([f"{link:g} Mbit/s{', straggler 4x' if s else ''}" for link, s in settings])
    ax.set_ylabel(f"seconds to {comp[0]['target']:g} test accuracy")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title("time to target, 4 workers, 0.25M-parameter MLP on the synthetic task")
    fig.tight_layout()
    out.append(directory / "shaped_time_to_target.png")
    fig.savefig(out[1], dpi=110)
    plt.close(fig)
    return out


def hosts_table(points: list[dict], hosts: int) -> str:
    """The runs that recorded the machine's CPU (the workers part since `--hosts`): measured against what the cost
    model fitted on the shipped 6-host runs predicts, beside how busy the 2 cores were while each ran."""
    from raydist.planning import costmodel as cm

    fit = cm.fit(json.loads((REPO / "docs" / "data" / "shaped_runs.json").read_text())["points"])
    rows = [
        "| hosts | link | workers | strategy | steps/s | predicted | measured / predicted | CPU busy, median "
        "second | seconds at 95%+ busy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        if "cpu_busy_median" not in p:
            continue
        predicted = cm.steps_per_s(fit, cm.setting_of(p))
        rows.append(
            f"| {hosts} | {p['link_mbit']:g} Mbit/s | {p['workers']} | {p['strategy']} | "
            f"{p['steps_per_s']:.1f} | {predicted:.1f} | {p['steps_per_s'] / predicted:.2f} | "
            f"{p['cpu_busy_median']:.0%} | {p['cpu_busy_share_over_95']:.0%} |"
        )
    return "\n".join(rows) if len(rows) > 2 else ""


def table(points: list[dict], hosts: int) -> str:
    return "\n\n".join(filter(None, (fanin_table(points, hosts), strategies_table(points), hosts_table(points, hosts))))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--links", default="100,1000", help="link rates in Mbit/s, comma-separated")
    p.add_argument("--parts", default="fanin,compare,ring,size,checkpoint,real")
    p.add_argument("--size-params", type=int, default=1_000_000, help="the size part's model")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--other-workers", default="2,3", help="the workers part: these worker counts, comma-separated")
    p.add_argument("--hosts", type=int, default=6, help="emulated hosts (master-node and nodes)")
    p.add_argument("--params", type=int, default=250_000)
    p.add_argument("--samples", type=int, default=6000)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--fanin-epochs", type=int, default=2)
    p.add_argument("--target", type=float, default=0.8)
    p.add_argument("--out", type=Path, default=REPO / "docs" / "data" / "shaped_runs.json")
    p.add_argument("--report", type=Path, help="print the tables of an earlier run's JSON and exit")
    p.add_argument("--append", action="store_true", help="add this run's points to those already in --out")
    a = p.parse_args()
    if a.report:
        data = json.loads(a.report.read_text())
        print(table(data["points"], data["hosts"]))
        for path in plots(data["points"], data["hosts"], REPO / "docs" / "images"):
            print(f"wrote {path}")
        return 0
    a.strategies = a.strategies.split(",")
    a.other_workers = [int(w) for w in a.other_workers.split(",")]
    parts = a.parts.split(",")
    links = [float(x) for x in a.links.split(",")]

    from tests.support.cluster import rayup
    from tests.support.cluster.emucluster import EmulatedCluster

    this = {**{k: v for k, v in vars(a).items() if k not in ("out", "append")}, **stamp()}
    header = {"setting": this, "appended": []}
    points: list[dict] = []
    if a.append and a.out.exists():  # the first run's setting stays; this one is listed after it
        earlier = json.loads(a.out.read_text())
        points, header = earlier["points"], {"setting": earlier["setting"], "appended": earlier.get("appended", [])}
        header["appended"].append(this)
    ran_before, started = len(points), time.monotonic()
    with EmulatedCluster(hosts=hosts(a.hosts)) as cluster:
        job = rayup.submit(cluster, rayup.write_config(cluster, "shaped-bench"), nodes=len(cluster.hosts))
        job.wait_for("Ray cluster ready", timeout=240)
        storage = cluster.shared / "runs"
        for link in links:
            cluster.shape(link)
            print(f"links shaped to {link:g} Mbit/s", flush=True)
            if "fanin" in parts:
                points += fan_in(cluster, job, a, link, storage)
            if "compare" in parts:
                for straggler in (False, True):
                    points += strategies(cluster, job, a, link, storage, straggler)
            if "size" in parts:
                points += other_size(cluster, job, a, link, storage)
            if "ring" in parts:
                for straggler in (False, True):
                    points += ring(cluster, job, a, link, storage, straggler)
            if "checkpoint" in parts:
                points += checkpoint_cost(cluster, job, a, link, storage)
            if "real" in parts:
                points += real_model(cluster, job, a, link, storage)
            if "workers" in parts:
                points += other_workers(cluster, job, a, link, storage)
            for point in points[ran_before:]:  # which run of the file measured it (its setting or an append)
                point["commit"] = this["commit"]
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(
                json.dumps({**header, "hosts": len(cluster.hosts), "points": points}, indent=1, default=str)
            )
        cluster.run("master-node", ["scancel", str(job.job_id)])
        rayup.wait_no_leftovers(cluster, job.job_id)
    print(table(points, a.hosts))
    if a.out.name == "shaped_runs.json":  # the docs' plots are of the cost model's runs only
        plots(points, a.hosts, REPO / "docs" / "images")
    print(f"{len(points)} runs in {time.monotonic() - started:.0f} s; written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
