"""Checks before Ray starts: a refusal is one line and exit 2 (1: a cluster that does not answer), and nothing is
written. `check_before_ray` runs the checks every job shares (storage, Ray's address and auth settings, GPUs of
the embedded instance), then the job's own (its registry entry's `check`: `check_loop`, `check_async`, ...);
`check_cluster_fits` runs on joining a named cluster.
"""

from __future__ import annotations

import os
import socket
import tempfile

from raydist import registry
from raydist.cluster.local_auth import check_auth_env, check_token_accepted
from raydist.config import Config
from raydist.errors import ConfigError, RaydistError, UsageError


def ray_address(cfg: Config) -> str:
    """The cluster a job joins: run.address, else RAY_ADDRESS; '' (or 'local') = start the embedded instance."""
    return join_address(cfg.run.address)


def join_address(configured: str) -> str:
    """The GCS address to join: `configured`, else RAY_ADDRESS; '' for the embedded instance. After
    `eval "$(raydist env)"` RAY_ADDRESS is the dashboard's URL (for `ray job submit`): the connection file that
    RAYDIST_CONNECTION names holds the GCS address, so a driver started by hand joins the same cluster."""
    address = configured or os.environ.get("RAY_ADDRESS", "")
    connection = os.environ.get("RAYDIST_CONNECTION")
    if address.startswith(("http://", "https://")) and connection:
        from pathlib import Path

        from raydist.cluster.connection import read

        return read(Path(connection)).gcs_address
    return "" if address == "local" else address


def local_cpus(cfg: Config) -> int:
    """The CPUs the embedded local instance declares: the machine's, or more when the workers need more."""
    # Oversubscribing a small machine is fine for CPU training, refusing to start is not.
    return max(os.cpu_count() or 1, int(cfg.scaling.max_workers * cfg.scaling.cpus_per_worker + 0.999))


def address_host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a cluster address; None for 'auto' and 'local'; a malformed one is bad input (exit 2)."""
    if address in ("auto", "local"):
        return None
    scheme, sep, hostport = address.rpartition("://")
    if sep and scheme != "ray":
        raise UsageError(
            f"Ray address {address!r}: a job joins a cluster at its GCS address host:port (or "
            f"ray://host:port); a {scheme}:// address is a dashboard's, for `ray job submit --address`"
        )
    host, sep, port = hostport.rstrip("/").rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"Ray address must be host:port or ray://host:port (got {address!r})")
    return host, int(port)


# An HTTP/2 client's first bytes: the connection preface and an empty SETTINGS frame. A gRPC server (Ray's GCS,
# the Ray Client server) answers with a SETTINGS frame of its own before anything else.
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, with one line, when a named cluster does not answer (ray.init would retry for minutes),
    or when what answers is not a Ray cluster (a dashboard's port, say: ray.init would wait for ever)."""
    target = address_host_port(address)
    if target is None:
        return
    try:
        sock = socket.create_connection(target, timeout=timeout_s)
    except (OSError, UnicodeError) as e:  # UnicodeError: a host name IDNA cannot encode
        raise RaydistError(f"cannot reach Ray at {address}: {getattr(e, 'strerror', None) or e}") from None
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        sock.close()  # a TLS server answers only a TLS handshake
        return
    answer = b""
    try:
        with sock:
            sock.sendall(_HTTP2_HELLO)
            while len(answer) < 9:
                chunk = sock.recv(9 - len(answer))
                if not chunk:
                    break
                answer += chunk
    except TimeoutError:
        raise RaydistError(f"cannot reach Ray at {address}: no answer within {timeout_s:g} s") from None
    except OSError:
        pass  # reset: judged by what arrived
    if len(answer) < 9 or answer[3] != 4:
        got = repr(answer.decode("ascii", "replace")) if answer else "nothing"
        raise UsageError(
            f"{address} is not a Ray cluster: it answered {got} to gRPC; give the head's GCS address "
            f"(RAY_ADDRESS as `raydist env` prints it), not its dashboard's or another service's"
        )


def check_writable(directory: str, key: str = "run.storage_path") -> None:
    """Refuse, before Ray starts, a run directory this process cannot create or write (Ray would fail later,
    with a traceback). Creates nothing: it probes the directory, or else the nearest one that exists, with a
    temporary entry it removes at once, so that a later refusal leaves nothing behind."""
    existing = directory
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    try:
        if not os.path.isdir(existing):
            raise NotADirectoryError(20, f"{existing} is not a directory")
        if existing == directory:
            with tempfile.NamedTemporaryFile(dir=directory, prefix=".raydist-probe"):
                pass
        else:
            os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".raydist-probe"))
    except OSError as e:
        raise ConfigError(f"{key}: cannot write {directory}: {e.strerror or e}") from None


def check_local_temp_dir() -> None:
    """The embedded instance's sockets live under Ray's temp dir; a Unix socket's path has at most 107 bytes, and
    past that ray.init fails with a traceback."""
    variable = "RAY_TMPDIR" if "RAY_TMPDIR" in os.environ else "TMPDIR" if "TMPDIR" in os.environ else ""
    base = os.environ[variable] if variable else "/tmp"  # as ray._common.utils.get_default_system_temp_dir
    longest = os.path.join(base, "ray", "session_2000-01-01_00-00-00_000000_4194304", "sockets", "plasma_store")
    if len(longest.encode()) > 107:
        raise UsageError(
            f"{variable}={base}: the local Ray instance's socket paths under it (such as {longest}) "
            f"would be longer than the 107 bytes a Unix socket path can have; set a shorter "
            f"{variable}"
        )


def check_local_gpus(cfg: Config) -> None:
    """scaling.use_gpu on the embedded instance: this machine must have a GPU per worker (Ray Train would wait for
    them forever)."""
    s = cfg.scaling
    if not s.use_gpu:
        return
    import torch

    have = torch.cuda.device_count()
    if have < s.min_workers:
        raise UsageError(
            f"scaling.use_gpu=true with scaling.num_workers={s.num_workers} needs {s.min_workers} "
            f"GPU(s) but this machine has {have} that torch {torch.__version__} can use; set "
            f"scaling.use_gpu=false or fewer workers"
        )


def local_gpu_count(driver_dir: str = "/proc/driver/nvidia/gpus") -> int:
    """NVIDIA GPUs this machine's processes may use, without importing torch (the launcher's driver has none): the
    driver's device list, narrowed by CUDA_VISIBLE_DEVICES as CUDA narrows it."""
    try:
        have = len(os.listdir(driver_dir))
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return have
    return min(have, len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"]))


def check_cluster_fits(cfg: Config, address: str) -> None:
    """Right after joining a cluster: refuse a worker group its CPUs or GPUs can never hold (Ray Train would wait
    for them forever). A range (scaling.num_workers=MIN-MAX) needs room for MIN. Names the nodes Ray knows as
    dead, and the range that would run on what is left."""
    import ray

    from raydist.cluster.watch import dead_nodes

    s = cfg.scaling
    have = ray.cluster_resources()
    cpus, gpus = s.min_workers * s.cpus_per_worker, s.min_workers if s.use_gpu else 0
    if cpus > have.get("CPU", 0):
        short = (
            f"scaling.num_workers={s.num_workers} x scaling.cpus_per_worker={s.cpus_per_worker:g} needs "
            f"{cpus:g} CPUs but the Ray cluster at {address} has {have.get('CPU', 0):g}"
        )
        fits = int(have.get("CPU", 0) // s.cpus_per_worker)
    elif gpus > have.get("GPU", 0):
        short = (
            f"scaling.use_gpu=true with scaling.num_workers={s.num_workers} needs {gpus} GPU(s) but the Ray "
            f"cluster at {address} has {have.get('GPU', 0):g}"
        )
        fits = int(have.get("GPU", 0))
    else:
        return
    dead = [name.split(":", 1)[0] for name in dead_nodes()]
    died = f" (node(s) died: {', '.join(dead)})" if dead else ""
    fewer = f"; a range such as scaling.num_workers={fits}-{s.max_workers} runs on what fits" if fits >= 1 else ""
    raise UsageError(short + died + fewer)


def check_before_ray(job: str, cfg: Config, reach: bool = True) -> None:
    """Everything about `job` on `cfg` that can be checked before Ray starts: the storage, Ray's auth settings, the
    cluster's address, whether it answers (unless not `reach`) and takes the token, GPUs for the embedded
    instance, then the job's own checks (its registry entry's `check`). What a named cluster can hold is checked
    on joining it (`connect`). Writes nothing; a refusal is one line and exit 2 (1: a cluster that does not
    answer)."""
    check_writable(cfg.run.run_dir)
    from raydist.observability.tracking import check_available

    check_available(cfg.run.mlflow)
    address = ray_address(cfg)
    check_ray_target(address, reach)
    if not address:
        check_local_gpus(cfg)
    spec = registry.get(job)
    check_engine(spec, cfg)
    if spec.check:
        spec.load("check")(cfg)
    if spec.worker:
        check_checkpoint_kind(spec, cfg.run.run_dir)


def check_engine(spec: registry.StrategySpec, cfg: Config) -> None:
    """scaling.engine=launch runs only the strategies whose workers need nothing but one process group."""
    if cfg.scaling.engine != "launch" or spec.runs_as_processes or spec.name in registry.OTHER_JOBS:
        return
    fits = ", ".join(s.name for s in registry.STRATEGIES.values() if s.runs_as_processes)
    raise UsageError(
        f"scaling.engine=launch runs {fits}; {spec.name} needs Ray Train or actors of its own: "
        f"use scaling.engine=ray_train"
    )


def check_ray_target(address: str, reach: bool = True) -> None:
    """Ray's auth settings and the cluster at `address` ('' = the embedded instance): well-formed, answering,
    taking the token; or, for the embedded instance, a temp dir it can use."""
    check_auth_env(joining=bool(address))
    if address:
        address_host_port(address)
        if reach:
            check_reachable(address)
            check_token_accepted(address)
    else:
        check_local_temp_dir()


def check_checkpoint_kind(spec: registry.StrategySpec, run_dir: str) -> None:
    """A loop strategy resumes only checkpoints of its own kind: sharded (FSDP's, with DCP's `.metadata`) or whole.
    Reads the newest checkpoint's manifest only; the workers still verify the files before loading."""
    from raydist.torchkit.checkpoint import STATE_FILE, checkpoint_dirs, read_manifest

    for _, path in checkpoint_dirs(run_dir):
        try:
            names = {entry.get("name") for entry in read_manifest(path)["files"]}
        except (OSError, ValueError):
            continue  # broken: resume passes over it
        if STATE_FILE not in names:
            return  # another kind of job's checkpoint (the async PS): its own loader refuses it
        sharded = ".metadata" in names
        if sharded != _sharded(spec):
            writers = [s.name for s in registry.STRATEGIES.values() if s.worker and _sharded(s) == sharded]
            kind = f"{'sharded' if sharded else 'whole-model'} ({', '.join(writers)})"
            raise UsageError(
                f"run.name={os.path.basename(run_dir)}: its checkpoints are {kind}, which {spec.name} "
                f"cannot resume from: use a new run.name"
            )
        return


def _sharded(spec: registry.StrategySpec) -> bool:
    """Whether the entry's worker has the ShardedState capability (its marker: the driver imports no raydist.train)."""
    return getattr(spec.load("worker"), "sharded_state", False)


GiB = 2**30


def _splits(cfg: Config):
    """The data set, once its size is known to fit in memory (the driver loads it too)."""
    check_data_memory(cfg)
    from raydist.torchkit.data import load_splits

    return load_splits(cfg.data)


def check_loop(cfg: Config, data=None) -> int:
    """Every strategy's check unless it has its own: the data and model fit in memory, and every worker's shard
    fills at least one step. Returns the model's parameter count. `data`: the splits, where the caller has loaded
    them. A built-in data set and model are sized without torch (raydist.torchkit.model_size), which a Ray Train driver
    then never imports (docs/dev/decisions/driver-without-torch.md)."""
    from raydist.torchkit.model_size import builtin_params
    from raydist.torchkit.sharding import check_fits

    if cfg.model.factory or cfg.data.factory or cfg.train.loss:
        data = data or _splits(cfg)
        check_fits(cfg, len(data.train))
        return check_user_code(cfg, data)
    if data is None:
        check_data_memory(cfg)
        from raydist.torchkit.data import builtin_arrays

        data = builtin_arrays(cfg.data)
    check_fits(cfg, data.num_train)  # a bad batch size is exit 2 here, not a failed worker later
    num_params = builtin_params(cfg.model, data.num_features, data.num_classes, data.image_shape)
    check_model_memory(cfg, num_params)
    return num_params


def check_user_code(cfg: Config, data) -> int:
    """Your factories and loss, called once here on CPU as the workers will call them: the model is built (for real:
    your code may not run on torch's meta device) and two training samples go through it and the loss, which must
    give a scalar. Returns the model's parameter count."""
    import torch
    from torch.utils.data import default_collate

    from raydist.factories import loss_function
    from raydist.torchkit.models import build_model

    model = build_model(cfg.model, data)
    num_params = sum(p.numel() for p in model.parameters())
    check_model_memory(cfg, num_params)
    x, y = default_collate([data.train[i] for i in range(min(2, len(data.train)))])
    what = (
        f"train.loss={cfg.train.loss}" if cfg.train.loss else "the default loss (cross-entropy over the last dimension)"
    )
    try:
        with torch.no_grad():
            output = model(x)
            loss = loss_function(cfg.train.loss)(output.float(), y)
    except Exception as e:  # the user's forward or loss: whatever it raises, it cannot train
        first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        raise ConfigError(
            f"the model's output on two training samples does not fit {what}: {type(e).__name__}: {first.strip()}"
        ) from None
    if not (isinstance(loss, torch.Tensor) and loss.dim() == 0):
        raise ConfigError(
            f"{what} must return the batch's mean loss as a scalar tensor; got "
            f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__}"
        )
    return num_params


def _memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _copies(cfg: Config) -> tuple[int, str]:
    """How many processes on this machine hold the data set and the model: the driver, and on the embedded
    instance each worker too."""

    if ray_address(cfg):
        return 1, "the driver"
    return 1 + cfg.scaling.max_workers, f"the driver and {cfg.scaling.max_workers} local workers"


def check_data_memory(cfg: Config) -> None:
    """A synthetic data set larger than this machine's memory (a lower bound: the float64 samples generated)."""
    d = cfg.data
    if d.name != "synthetic":
        return
    per_copy = d.synthetic_samples * d.synthetic_features * 8
    copies, who = _copies(cfg)
    if per_copy * copies > _memory():
        raise ConfigError(
            f"data.synthetic_samples={d.synthetic_samples} x data.synthetic_features="
            f"{d.synthetic_features} needs at least {per_copy / GiB:.1f} GiB per copy ({who} each load "
            f"it) but this machine has {_memory() / GiB:.1f} GiB"
        )


def check_model_memory(cfg: Config, num_params: int) -> None:
    """A model larger than this machine's memory (a lower bound: fp32 weights and gradients in every copy)."""
    per_copy = num_params * 8
    copies, who = _copies(cfg)
    if per_copy * copies > _memory():
        raise ConfigError(
            f"model.name={cfg.model.name} (model.hidden={cfg.model.hidden}, model.depth="
            f"{cfg.model.depth}) has {num_params} parameters, at least {per_copy / GiB:.1f} GiB per copy "
            f"({who} each hold one) but this machine has {_memory() / GiB:.1f} GiB"
        )
