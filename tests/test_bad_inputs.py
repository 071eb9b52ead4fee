"""Bad input of every kind, run as a user runs it: one line on stderr, its exit status, nothing written.

CASES is the one table. Each row runs as a subprocess, all of them at once in a few threads (almost every row is
refused before Ray starts, in well under a second to a few seconds), with HOME and TMPDIR pointing at empty
directories of its own: the default run.storage_path (~/raydist_runs) and the SLURM job_dir (~/.raydist/slurm) are
in HOME, which must stay empty. The rows marked `head` join a real `ray start --head` on loopback (2 CPUs, no
GPUs, token auth), started once for them. docs/bad-inputs.md's table is generated from CASES
(`python tests/test_bad_inputs.py` prints it) and a test keeps the two equal.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.jobutil import REPO, clean_env

DOCS = REPO / "docs" / "bad-inputs.md"
TIMEOUT_S = 300  # a bound on a hang, not a timing: a refusal takes seconds, even on a loaded 2-core machine
BEGIN, END = (
    "<!-- BEGIN bad-inputs table (generated: python tests/test_bad_inputs.py) -->",
    "<!-- END bad-inputs table -->",
)


@dataclass(frozen=True)
class Case:
    what: str
    """The kind of input."""
    command: str
    """As typed in the repo root: `python` is the venv's, `raydist` its console script. {F} is a directory holding
    FILES (the only things in it, before and after)."""
    code: int
    line: str
    """The whole stderr line after 'raydist: error: '. {F}, {HEAD} (the head's GCS address), {DASH} (its dashboard's
    host:port), {TORCH}, {MEM} and {CPUS} stand for their values."""
    env: str = ""
    """NAME=value ... set for the command (shown before it)."""
    head: bool = False
    """Joins the test head: RAY_ADDRESS={HEAD} is set unless `env` sets it, and its token (RAY_AUTH_MODE=token
    RAY_AUTH_TOKEN_PATH={TOKEN}) unless `env` sets RAY_AUTH_MODE or `token` is False."""
    token: bool = True


FILES = {
    "bad.yaml": "train:\n  epochs: [1,\n",
    "list.yaml": "- 1\n- 2\n",
    "section.yaml": "optim: 5\n",
    "a-file": "",
    "wrong-token": "0123456789abcdef\n",
    "ports.yaml": "ports:\n  base: 50000\n  end: 40000\n",
    "iface.yaml": "interfaces:\n  node01: eth0/1\n",
    "mycode.py": "import torch\n"
    "NOT_CALLABLE = 3\n"
    "def raises(): raise ValueError('no data here')\n"
    "def one_set(): return torch.utils.data.TensorDataset(torch.zeros(4, 2), torch.zeros(4))\n"
    "def not_a_module(): return {'weights': 1}\n"
    "def wrong_input(): return torch.nn.Linear(5, 10)\n"
    "def per_sample(output, target): return torch.nn.functional.cross_entropy(output, target, "
    "reduction='none')\n",
    "one-rate.json": '{"points": [{"strategy": "sync", "workers": 4, "params": 1000, "link_mbit": 100, '
    '"steps_per_s": 5.0}]}',
}

ADDRESS = "Ray address must be host:port or ray://host:port"
NEEDS = "the async job needs {} CPUs (scaling.num_workers x scaling.cpus_per_worker + async_ps.num_servers x async_ps.cpus_per_server) but"
SHARD = "train.batch_size=1000 x train.grad_accum=1 exceeds the 718 training samples each of 2 workers gets"
YOURS = "PYTHONPATH={F} PYTHONDONTWRITEBYTECODE=1"  # mycode.py importable, and no __pycache__ left in {F}
SLURM_ENV = '(for a raydist SLURM cluster: eval "$(raydist env)")'

CASES = [
    # -- the run config, on the command line
    Case(
        "--set: unknown key",
        "python jobs/sync.py --set train.epochz=3",
        2,
        "unknown key 'train.epochz' (did you mean 'train.epochs'?)",
    ),
    Case("--set: out of range", "python jobs/sync.py --set optim.lr=-0.1", 2, "optim.lr: must be > 0 (got -0.1)"),
    Case("--set: not a number", "python jobs/sync.py --set optim.lr=.nan", 2, "optim.lr: must be > 0 (got nan)"),
    Case(
        "--set: wrong type",
        "python jobs/sync.py --set train.batch_size=many",
        2,
        "train.batch_size: must be an integer (got 'many')",
    ),
    Case(
        "--set: bad worker range",
        "python jobs/sync.py --set scaling.num_workers=4-2",
        2,
        "scaling.num_workers: range must have 1 <= MIN < MAX (got '4-2')",
    ),
    Case(
        "--set: no value",
        "python jobs/sync.py --set train.epochs",
        2,
        "--set needs key.path=value (got 'train.epochs')",
    ),
    Case(
        "--set: a value for a section",
        "python jobs/sync.py --set optim=0.1",
        2,
        "optim: must be a mapping of name, lr, momentum, weight_decay",
    ),
    Case(
        "--set: keys that exclude each other",
        "python jobs/sync.py --set data.name=synthetic --set model.name=cnn",
        2,
        "model.name: cnn needs image data: set data.name=digits",
    ),
    Case(
        "--set: nccl without GPUs",
        "python jobs/sync.py --set scaling.backend=nccl",
        2,
        "scaling.backend: nccl needs GPUs: set scaling.use_gpu=true or backend=gloo",
    ),
    Case(
        "--set: straggler rank beyond the workers",
        "python jobs/sync.py --set straggler.worker=2",
        2,
        "straggler.worker: must be below scaling.num_workers=2 (got 2)",
    ),
    Case(
        "--set: run name with a '/'",
        "python jobs/sync.py --set run.name=a/b",
        2,
        "run.name: must not contain '/' (got 'a/b')",
    ),
    Case(
        "--set: run name outside the storage",
        "python jobs/sync.py --set run.name=..",
        2,
        "run.name: must name a directory under run.storage_path (got '..')",
    ),
    Case(
        "--set: an empty MLflow experiment",
        "python jobs/sync.py --set run.mlflow=true --set run.mlflow_experiment=' '",
        2,
        "run.mlflow_experiment: must not be empty",
    ),
    Case(
        "tune: a key no job takes",
        "python jobs/tune.py --set tune.space.optim.bogus='choice([1, 2])'",
        2,
        "tune.space.optim.bogus: 1 is refused: unknown key 'optim.bogus'; known: name, lr, momentum, weight_decay",
    ),
    Case(
        "tune: impossible bounds",
        "python jobs/tune.py --set tune.space.optim.lr='loguniform(0, 0.1)'",
        2,
        "tune.space.optim.lr: needs 0 < low (got 'loguniform(0, 0.1)')",
    ),
    Case(
        "tune: a metric no strategy reports",
        "python jobs/tune.py --set tune.metric=f1 --set tune.space.optim.lr='loguniform(1e-3, 0.1)'",
        2,
        "tune.metric: must be a metric every strategy reports: test_accuracy, test_loss, loss (got 'f1')",
    ),
    Case(
        "tune: more trials at once than the machine holds",
        "python jobs/tune.py --set tune.max_concurrent=100 --set tune.space.optim.lr='loguniform(1e-3, 0.1)'",
        2,
        "tune.max_concurrent=100 trials need 200 CPUs (scaling.num_workers x scaling.cpus_per_worker each) but the "
        "local Ray instance has {CPUS}; lower it, or 0: as many as fit",
    ),
    Case(
        "compare.tune: a value one strategy refuses",
        "python jobs/compare.py --set compare.tune=true --set tune.space.optim.lr='uniform(-1, 1)'",
        2,
        "sync: tune.space.optim.lr: -1 is refused: optim.lr: must be > 0 (got -1.0)",
    ),
    Case(
        "tune: nothing to sweep",
        "python jobs/tune.py",
        2,
        "tune.space: must name at least one key to sweep, e.g. optim.lr: loguniform(1e-4, 1e-1)",
    ),
    Case(
        "--set: a NUL in a name",
        "python jobs/sync.py --set 'run.name=\"a\\0b\"'",
        2,
        "run.name: must not contain control characters (got 'a\\x00b')",
    ),
    # -- config files
    Case(
        "--config: missing file",
        "python jobs/sync.py --config {F}/missing.yaml",
        2,
        "config file not found: {F}/missing.yaml",
    ),
    Case("--config: a directory", "python jobs/sync.py --config {F}", 2, "config file not found: {F}"),
    Case(
        "--config: unparsable YAML",
        "python jobs/sync.py --config {F}/bad.yaml",
        2,
        "cannot parse {F}/bad.yaml at line 3, column 1: expected the node content, but found '<stream end>'",
    ),
    Case(
        "--config: not a mapping",
        "python jobs/sync.py --config {F}/list.yaml",
        2,
        "{F}/list.yaml: must be a mapping of sections (model, data, ...), got list",
    ),
    Case(
        "--config: a section that is not a mapping",
        "python jobs/sync.py --config {F}/section.yaml",
        2,
        "{F}/section.yaml: optim: must be a mapping of name, lr, momentum, weight_decay",
    ),
    # -- storage
    Case(
        "storage: cannot be created",
        "python jobs/sync.py --set run.storage_path=/proc/forbidden",
        2,
        "run.storage_path: cannot write /proc/forbidden/sync-digits: No such file or directory",
    ),
    Case(
        "storage: under a file",
        "python jobs/sync.py --set run.storage_path={F}/a-file/runs",
        2,
        "run.storage_path: cannot write {F}/a-file/runs/sync-digits: {F}/a-file is not a directory",
    ),
    Case(
        "storage: a URL",
        "python jobs/sync.py --set run.storage_path=s3://bucket/runs",
        2,
        "run.storage_path: must be a local or shared filesystem path (got 's3://bucket/runs')",
    ),
    # -- what this machine cannot hold (the embedded local Ray instance)
    Case("resources: batch larger than a shard", "python jobs/sync.py --set train.batch_size=1000", 2, SHARD),
    Case(
        "resources: GPUs this machine lacks",
        "python jobs/sync.py --set scaling.use_gpu=true",
        2,
        "scaling.use_gpu=true with scaling.num_workers=2 needs 2 GPU(s) but this machine has 0 that torch {TORCH} "
        "can use; set scaling.use_gpu=false or fewer workers",
    ),
    Case(
        "resources: data larger than memory",
        "python jobs/sync.py --set data.name=synthetic --set data.synthetic_samples=100000000000",
        2,
        "data.synthetic_samples=100000000000 x data.synthetic_features=10 needs at least 7450.6 GiB per copy (the "
        "driver and 2 local workers each load it) but this machine has {MEM} GiB",
    ),
    Case(
        "resources: model larger than memory",
        "python jobs/local_sgd.py --set model.hidden=1000000",
        2,
        "model.name=mlp (model.hidden=1000000, model.depth=2) has 1000076000010 parameters, at least 7451.1 GiB per "
        "copy (the driver and 2 local workers each hold one) but this machine has {MEM} GiB",
    ),
    # -- the async PS
    Case(
        "async: more servers than parameters",
        "python jobs/async.py --set async_ps.num_servers=1000000",
        2,
        "async_ps.num_servers=1000000 exceeds the model's 26122 parameters",
    ),
    Case(
        "async: elastic worker range",
        "python jobs/async.py --set scaling.num_workers=2-3",
        2,
        "scaling.num_workers=2-3: the async PS runs a fixed number of workers; give one count",
    ),
    Case(
        "async: gradient accumulation",
        "python jobs/async.py --set train.grad_accum=2",
        2,
        "train.grad_accum: the async PS pushes every batch's gradient as it comes; set it to 1",
    ),
    Case(
        "async: server CPUs this machine lacks",
        "python jobs/async.py --set async_ps.cpus_per_server=64",
        2,
        NEEDS.format(66) + " the local Ray instance has {CPUS}",
    ),
    # -- your code by import path (docs/your-code.md): imported and called once before Ray starts
    Case(
        "factory: not an import path",
        "python jobs/sync.py --set model.factory=mycode.make_model",
        2,
        "model.factory: must be an import path 'package.module:function' (got 'mycode.make_model')",
    ),
    Case(
        "factory: module does not import",
        "python jobs/sync.py --set model.factory=nosuchpkg.nets:make",
        2,
        "model.factory=nosuchpkg.nets:make: cannot import nosuchpkg.nets: ModuleNotFoundError: No module named "
        "'nosuchpkg'",
    ),
    Case(
        "factory: no such function",
        "python jobs/sync.py --set model.factory=mycode:make_model",
        2,
        "model.factory=mycode:make_model: mycode has no attribute 'make_model'",
        env=YOURS,
    ),
    Case(
        "factory: not callable",
        "python jobs/sync.py --set data.factory=mycode:NOT_CALLABLE",
        2,
        "data.factory=mycode:NOT_CALLABLE: is a int, not a function or class to call",
        env=YOURS,
    ),
    Case(
        "factory: raises",
        "python jobs/sync.py --set data.factory=mycode:raises",
        2,
        "data.factory=mycode:raises: calling it failed: ValueError: no data here",
        env=YOURS,
    ),
    Case(
        "factory: not a (train, test) pair",
        "python jobs/sync.py --set data.factory=mycode:one_set",
        2,
        "data.factory=mycode:one_set: must return (train, test), two Datasets; got a "
        "torch.utils.data.dataset.TensorDataset",
        env=YOURS,
    ),
    Case(
        "factory: not a torch.nn.Module",
        "python jobs/sync.py --set model.factory=mycode:not_a_module",
        2,
        "model.factory=mycode:not_a_module: must return a torch.nn.Module; got a dict",
        env=YOURS,
    ),
    Case(
        "factory: output does not fit the loss",
        "python jobs/sync.py --set model.factory=mycode:wrong_input",
        2,
        "the model's output on two training samples does not fit the default loss (cross-entropy over the last "
        "dimension): RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x64 and 5x10)",
        env=YOURS,
    ),
    Case(
        "factory: loss not a scalar",
        "python jobs/sync.py --set train.loss=mycode:per_sample",
        2,
        "train.loss=mycode:per_sample must return the batch's mean loss as a scalar tensor; got (2,)",
        env=YOURS,
    ),
    Case(
        "factory: arguments without a factory",
        "python jobs/sync.py --set model.args.width=3",
        2,
        "model.args: are model.factory's arguments: set model.factory",
    ),
    # -- compare: each strategy's checks, before the first one runs
    Case(
        "compare: unknown strategy",
        "python jobs/compare.py --set compare.strategies=sync,bogus",
        2,
        "compare.strategies: unknown strategy 'bogus' (choose from sync, local_sgd, async, fsdp, heal)",
    ),
    Case(
        "compare: output dir cannot be created",
        "python jobs/compare.py --set compare.output_dir=/proc/forbidden",
        2,
        "compare.output_dir: cannot write /proc/forbidden: No such file or directory",
    ),
    Case(
        "compare: a setting one strategy refuses",
        "python jobs/compare.py --set async_ps.num_servers=1000000",
        2,
        "async: async_ps.num_servers=1000000 exceeds the model's 26122 parameters",
    ),
    # -- the command line
    Case(
        "usage: unknown flag",
        "python jobs/sync.py --bogus-flag",
        2,
        "jobs/sync.py: unrecognized arguments: --bogus-flag",
    ),
    Case(
        "usage: flag without its value",
        "python jobs/sync.py --config",
        2,
        "jobs/sync.py: argument --config: expected one argument",
    ),
    Case(
        "usage: no job",
        "python -m raydist.job",
        2,
        "usage: python -m raydist.job JOB [--config FILE] [--set KEY=VALUE]... (JOB: sync, local_sgd, async, fsdp, heal, compare, tune)",
    ),
    Case(
        "usage: unknown job",
        "python -m raydist.job fedavg",
        2,
        "unknown job 'fedavg' (choose from sync, local_sgd, async, fsdp, heal, compare, tune)",
    ),
    Case("usage: raydist without a command", "raydist", 2, "raydist: the following arguments are required: command"),
    Case(
        "usage: raydist, unknown command",
        "raydist bogus",
        2,
        "raydist: argument command: invalid choice: 'bogus' (choose from 'config', 'slurm', 'status', 'env', 'doctor', "
        "'top', 'prometheus-config', 'plan', 'launch')",
    ),
    Case(
        "usage: raydist config show, unknown job",
        "raydist config show --job fedavg",
        2,
        "raydist config show: argument --job: invalid choice: 'fedavg' (choose from 'sync', 'local_sgd', 'async', 'fsdp', 'heal', "
        "'compare', 'tune')",
    ),
    Case(
        "usage: raydist config show, unknown key",
        "raydist config show --set train.epochz=3",
        2,
        "unknown key 'train.epochz' (did you mean 'train.epochs'?)",
    ),
    Case(
        "usage: raydist config reference, missing file",
        "raydist config reference --write {F}/missing.md",
        2,
        "docs file not found: {F}/missing.md",
    ),
    Case(
        "usage: raydist status, job id not a number",
        "raydist status --job abc",
        2,
        "raydist status: argument --job: invalid int value: 'abc'",
    ),
    Case(
        "usage: raydist slurm run without a command",
        "raydist slurm run",
        2,
        "raydist slurm run: give the command to run, e.g. -- python jobs/sync.py",
    ),
    Case(
        "usage: raydist top, address not a URL",
        "raydist top --once --address 127.0.0.1:8265",
        2,
        "--address 127.0.0.1:8265: give the dashboard's URL, http://HOST:PORT",
    ),
    Case("usage: raydist top, refresh interval", "raydist top --interval 0", 2, "--interval 0: must be > 0"),
    Case(
        "usage: raydist plan, model size",
        "raydist plan --params lots",
        2,
        "--params lots: expected a count > 0 such as 25M or 250000",
    ),
    Case(
        "usage: raydist plan, measured runs missing",
        "raydist plan --measured {F}/runs.json",
        2,
        "--measured {F}/runs.json: No such file or directory",
    ),
    Case(
        "usage: raydist plan, unknown collective library",
        "raydist plan --backend tpu",
        2,
        "raydist plan: argument --backend: invalid choice: 'tpu' (choose from 'nccl', 'gloo')",
    ),
    Case(
        "usage: raydist plan, runs it cannot fit",
        "raydist plan --measured {F}/one-rate.json",
        2,
        "--measured {F}/one-rate.json: fitting needs sync runs at two link rates",
    ),
    # -- raydist launch (docs/launch.md), refused before Ray starts
    Case(
        "launch: no command",
        "raydist launch --workers 2",
        2,
        "raydist launch: give the command every rank runs after --, e.g. raydist launch --workers 2 -- python train.py",
    ),
    Case(
        "launch: a missing script",
        "raydist launch -- python {F}/missing.py",
        2,
        "raydist launch: script not found: {F}/missing.py",
    ),
    Case(
        "launch: a command not on PATH",
        "raydist launch -- no-such-program --lr 1",
        2,
        "raydist launch: command not found: no-such-program",
    ),
    Case(
        "launch: no workers",
        "raydist launch --workers 0 -- python examples/ddp_train.py",
        2,
        "workers: must be >= 1 (got 0)",
    ),
    Case(
        "launch: unknown option",
        "raydist launch --bogus -- python examples/ddp_train.py",
        2,
        "raydist: unrecognized arguments: --bogus",
    ),
    Case(
        "launch: a signal no script can handle",
        "raydist launch --signal KILL -- python examples/ddp_train.py",
        2,
        "stop_signal: must name a signal a script can handle, such as TERM, INT or USR1 (got 'KILL')",
    ),
    Case(
        "launch: --gpu on a machine without a GPU",
        "raydist launch --gpu -- python examples/ddp_train.py",
        2,
        "raydist launch: --gpu with workers=2 needs 2 GPU(s) but this machine has 0; leave out --gpu or start "
        "fewer workers",
    ),
    Case(
        "launch: a launcher variable given with --env",
        "raydist launch --env RANK=3 -- python examples/ddp_train.py",
        2,
        "env: RANK is set by raydist launch for each rank (docs/launch.md), not by you",
    ),
    Case(
        "launch: --env without a value",
        "raydist launch --env NCCL_DEBUG -- python examples/ddp_train.py",
        2,
        "raydist launch: --env needs KEY=VALUE (got 'NCCL_DEBUG')",
    ),
    Case(
        "launch: --export as srun does not spell it",
        "raydist launch --export NCCL_DEBUG,NONE -- python examples/ddp_train.py",
        2,
        "export: NONE may only come first (ALL) or alone (NONE) (ALL, NONE or [ALL,]NAME[=VALUE],... as srun's "
        "--export; got 'NCCL_DEBUG,NONE')",
    ),
    Case(
        "launch: storage that cannot be written",
        "raydist launch --storage /proc/forbidden -- python examples/ddp_train.py",
        2,
        "storage_path: cannot write /proc/forbidden/launch-ddp_train: No such file or directory",
    ),
    # -- the cluster config (raydist slurm ..., raydist env/status)
    Case(
        "cluster config: a rule across keys",
        "raydist slurm plan --config {F}/ports.yaml",
        2,
        "{F}/ports.yaml: ports: need base < end (got base=50000, end=40000)",
    ),
    Case(
        "cluster config: bad interface name",
        "raydist env --config {F}/iface.yaml",
        2,
        "{F}/iface.yaml: interfaces.node01: 'eth0/1' is not an interface name",
    ),
    Case(
        "cluster config: missing file",
        "raydist env",
        2,
        "cluster config file not found: {F}/missing.yaml",
        env="RAYDIST_CLUSTER_CONFIG={F}/missing.yaml",
    ),
    Case(
        "cluster: missing connection file",
        "raydist status --connection {F}/missing.env",
        1,
        "cannot read connection file {F}/missing.env: No such file or directory",
    ),
    # -- the Ray address and auth settings
    Case(
        "address: not host:port",
        "python jobs/sync.py --set run.address=not-an-address",
        2,
        f"{ADDRESS} (got 'not-an-address')",
    ),
    Case(
        "address: port out of range",
        "python jobs/sync.py --set run.address=127.0.0.1:99999",
        2,
        f"{ADDRESS} (got '127.0.0.1:99999')",
    ),
    Case("address: no host", "python jobs/sync.py", 2, f"{ADDRESS} (got ':8265')", env="RAY_ADDRESS=:8265"),
    Case(
        "address: a dashboard URL",
        "python jobs/sync.py",
        2,
        "Ray address 'http://127.0.0.1:1': a job joins a cluster at its GCS address host:port (or ray://host:port); "
        "a http:// address is a dashboard's, for `ray job submit --address`",
        env="RAY_ADDRESS=http://127.0.0.1:1",
    ),
    Case(
        "address: nothing listens (run.address)",
        "python jobs/sync.py --set run.address=127.0.0.1:1",
        1,
        "cannot reach Ray at 127.0.0.1:1: Connection refused",
    ),
    Case(
        "address: nothing listens (RAY_ADDRESS)",
        "python jobs/sync.py",
        1,
        "cannot reach Ray at 127.0.0.1:1: Connection refused",
        env="RAY_ADDRESS=127.0.0.1:1",
    ),
    Case(
        "environment: Ray's temp dir too long",
        "python jobs/sync.py",
        2,
        f"RAY_TMPDIR=/tmp/{'x' * 60}: the local Ray instance's socket paths under it (such as /tmp/{'x' * 60}/ray/"
        "session_2000-01-01_00-00-00_000000_4194304/sockets/plasma_store) would be longer than the 107 bytes a Unix "
        "socket path can have; set a shorter RAY_TMPDIR",
        env=f"RAY_TMPDIR=/tmp/{'x' * 60}",
    ),
    Case(
        "auth: unknown mode",
        "python jobs/sync.py",
        2,
        "RAY_AUTH_MODE must be token or disabled (got 'tokn'); Ray would turn auth off",
        env="RAY_AUTH_MODE=tokn",
    ),
    Case(
        "auth: token file missing",
        "python jobs/sync.py",
        2,
        "RAY_AUTH_MODE=token: cannot read the token file {F}/missing-token: No such file or directory",
        env="RAY_ADDRESS=127.0.0.1:1 RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={F}/missing-token",
    ),
    # -- an existing cluster (the test head: 2 CPUs, no GPUs, token auth)
    Case(
        "cluster: GPUs it lacks",
        "python jobs/sync.py --set scaling.use_gpu=true",
        2,
        "scaling.use_gpu=true with scaling.num_workers=2 needs 2 GPU(s) but the Ray cluster at {HEAD} has 0",
        head=True,
    ),
    Case(
        "cluster: CPUs it lacks",
        "python jobs/local_sgd.py --set scaling.num_workers=3",
        2,
        "scaling.num_workers=3 x scaling.cpus_per_worker=1 needs 3 CPUs but the Ray cluster at {HEAD} has 2; a range "
        "such as scaling.num_workers=2-3 runs on what fits",
        head=True,
    ),
    Case(
        "cluster: no token",
        "python jobs/sync.py",
        2,
        "Ray at {HEAD} wants its auth token: RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN "
        f"{SLURM_ENV}",
        head=True,
        token=False,
    ),
    Case(
        "cluster: wrong token",
        "python jobs/sync.py",
        2,
        "Ray at {HEAD} wants its auth token: the token RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN gives is not this "
        f"cluster's {SLURM_ENV}",
        env="RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={F}/wrong-token",
        head=True,
    ),
    Case(
        "cluster: the dashboard's port",
        "python jobs/sync.py",
        2,
        "{DASH} is not a Ray cluster: it answered 'HTTP/1.0 ' to gRPC; give the head's GCS address (RAY_ADDRESS as "
        "`raydist env` prints it), not its dashboard's or another service's",
        env="RAY_ADDRESS={DASH}",
        head=True,
    ),
]


def shown(case: Case) -> str:
    env = case.env
    if case.head:
        env = " ".join(
            filter(
                None,
                [
                    "" if "RAY_ADDRESS=" in env else "RAY_ADDRESS={HEAD}",
                    "RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={TOKEN}"
                    if case.token and "RAY_AUTH_MODE=" not in env
                    else "",
                    env,
                ],
            )
        )
    return f"{env} {case.command}" if env else case.command


def argv(command: str, values: dict[str, str]) -> list[str]:
    words = shlex.split(fill(command, values))
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    assert words[0] == "raydist", words[0]
    return [sys.executable, "-m", "raydist.cli", *words[1:]]


def fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


def machine_values() -> dict[str, str]:
    import torch

    from raydist.config import Config
    from raydist.driver.preflight import GiB, _memory, local_cpus

    cfg = Config()
    cfg.async_ps.cpus_per_server = 64
    return {"TORCH": torch.__version__, "MEM": f"{_memory() / GiB:.1f}", "CPUS": str(local_cpus(cfg))}


@dataclass
class Outcome:
    proc: subprocess.CompletedProcess
    home: Path
    values: dict[str, str]


def run(case: Case, values: dict[str, str], root: Path, short: Path) -> Outcome:
    """Run `case` with a HOME of its own under `root` and a TMPDIR under `short` (Ray's socket paths are under it,
    and may not be longer than 107 bytes)."""
    home = Path(tempfile.mkdtemp(prefix="home-", dir=root))
    tmp = Path(tempfile.mkdtemp(prefix="tmp-", dir=short))
    env = {
        k: v for k, v in clean_env(HOME=str(home), TMPDIR=str(tmp)).items() if not k.startswith(("SLURM_", "RAYDIST_"))
    }
    for assignment in shlex.split(fill(shown(case).removesuffix(case.command), values)):
        name, _, value = assignment.partition("=")
        env[name] = value
    proc = subprocess.run(
        argv(case.command, values), cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    return Outcome(proc, home, values)


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory) -> dict[int, Outcome]:
    """The outcome of every case this session runs (all, or those -k / -m select), in parallel: the local ones at
    once, the head's (marked slow: they start Ray) once the head is up."""
    from tests.support.rayhead import ray_head

    wanted = {
        item.callspec.params["index"]
        for item in request.session.items
        if item.module is request.module and "index" in getattr(item, "callspec", SimpleNamespace(params={})).params
    }

    root = tmp_path_factory.mktemp("bad-inputs")
    short = Path(tempfile.mkdtemp(prefix="rdb-", dir="/tmp"))
    scratch = root / "F"
    scratch.mkdir()
    for name, text in FILES.items():
        (scratch / name).write_text(text)
    values = {"F": str(scratch), **machine_values()}
    done: dict[int, Outcome] = {}
    # Two pools: the head's cases start as soon as it is up instead of queueing behind the local ones.
    with ThreadPoolExecutor(3) as pool, ThreadPoolExecutor(2) as head_pool:
        local = {i: pool.submit(run, c, values, root, short) for i, c in enumerate(CASES) if not c.head and i in wanted}
        if any(c.head for i, c in enumerate(CASES) if i in wanted):
            # stop_wait_s: `ray start --block` does not end on SIGTERM; what is left is killed after it. No warm
            # interpreter: every case is refused before a worker starts, and its torch import is CPU spent for none.
            with ray_head(num_cpus=2, num_gpus=0, stop_wait_s=1, warm=False) as head:
                at_head = {
                    **values,
                    "HEAD": head.gcs_address,
                    "TOKEN": head.token_path,
                    "DASH": head.dashboard_url.removeprefix("http://"),
                }
                remote = {
                    i: head_pool.submit(run, c, at_head, root, short)
                    for i, c in enumerate(CASES)
                    if c.head and i in wanted
                }
                done.update({i: f.result() for i, f in remote.items()})
        done.update({i: f.result() for i, f in local.items()})
    shutil.rmtree(short, ignore_errors=True)
    assert sorted(p.name for p in scratch.iterdir()) == sorted(FILES), "a case wrote into {F}"
    return done


@pytest.mark.parametrize(
    "index", [pytest.param(i, marks=[pytest.mark.slow] if c.head else [], id=shown(c)) for i, c in enumerate(CASES)]
)
def test_refused_with_one_line_its_exit_status_and_nothing_written(outcomes, index):
    case, out = CASES[index], outcomes[index]
    if "use_gpu" in case.command and not case.head:
        import torch

        if torch.cuda.device_count() >= 2:
            pytest.skip("this machine has the GPUs the case asks for")
    proc = out.proc
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == [f"raydist: error: {fill(case.line, out.values)}"], proc.stderr[-3000:]
    assert proc.returncode == case.code, proc.stderr[-3000:]
    assert proc.stdout == "", proc.stdout[-3000:]
    assert not any(out.home.iterdir()), f"written: {sorted(map(str, out.home.rglob('*')))}"


def code(text: str) -> str:
    """`text` as markdown code in a table cell: '|' escaped, and a longer fence around text holding a backtick."""
    text = text.replace("|", "\\|")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def markdown() -> str:
    rows = ["| # | input | command | exit | stderr, its only line |", "|---|---|---|---|---|"]
    for i, c in enumerate(CASES, 1):
        rows.append(f"| {i} | {c.what} | {code(shown(c))} | {c.code} | {code(f'raydist: error: {c.line}')} |")
    return "\n".join(rows) + "\n"


def test_the_docs_table_lists_every_case():
    text = DOCS.read_text()
    assert f"{BEGIN}\n\n{markdown()}\n{END}" in text, (
        "docs/bad-inputs.md is stale: paste `python tests/test_bad_inputs.py`"
    )


def test_at_least_25_kinds_of_bad_input():
    assert len({c.what for c in CASES}) == len(CASES) >= 25


if __name__ == "__main__":
    print(f"{BEGIN}\n\n{markdown()}\n{END}")
