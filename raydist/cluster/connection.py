"""The connection file a running job writes (shell-style KEY=VALUE lines) and what `raydist env`/`status` read."""

from __future__ import annotations

import dataclasses
import os
import shlex
import time
from pathlib import Path

from raydist.errors import RaydistError

CONNECTION_ENV = "RAYDIST_CONNECTION"
# What a shell needs to submit to the cluster: the jobs API address and the token.
EXPORTED = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")


@dataclasses.dataclass(frozen=True)
class Connection:
    job_id: int
    head: str
    nodes: tuple[str, ...]
    head_ip: str
    gcs_port: int
    dashboard_host: str
    dashboard_port: int
    client_port: int
    token_path: str
    login_host: str
    user: str = ""

    @property
    def dashboard_url(self) -> str:
        host = self.head_ip if self.dashboard_host in ("0.0.0.0", "cluster") else self.dashboard_host
        return f"http://{host}:{self.dashboard_port}"

    @property
    def gcs_address(self) -> str:
        return f"{self.head_ip}:{self.gcs_port}"

    @property
    def tunnel(self) -> str:
        """Forwards the dashboard (and with it `ray job submit`) to a laptop through the login node."""
        target = f"{self.user}@{self.login_host}" if self.user else self.login_host
        host = self.dashboard_url.split("//", 1)[1]
        return f"ssh -N -L {self.dashboard_port}:{host} {target or '<login-node>'}"

    def variables(self) -> dict[str, str]:
        return {
            "RAYDIST_SLURM_JOB_ID": str(self.job_id),
            "RAY_ADDRESS": self.dashboard_url,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": self.token_path,
            "RAYDIST_DASHBOARD_URL": self.dashboard_url,
            "RAYDIST_GCS_ADDRESS": self.gcs_address,
            "RAYDIST_CLIENT_ADDRESS": f"ray://{self.head_ip}:{self.client_port}",
            "RAYDIST_HEAD": self.head,
            "RAYDIST_HEAD_IP": self.head_ip,
            "RAYDIST_NODES": ",".join(self.nodes),
            "RAYDIST_DASHBOARD_HOST": self.dashboard_host,
            "RAYDIST_DASHBOARD_PORT": str(self.dashboard_port),
            "RAYDIST_GCS_PORT": str(self.gcs_port),
            "RAYDIST_CLIENT_PORT": str(self.client_port),
            "RAYDIST_LOGIN_HOST": self.login_host,
            "RAYDIST_USER": self.user,
            "RAYDIST_TUNNEL": self.tunnel,
        }

    def render(self) -> str:
        head = (
            f"# raydist: Ray cluster of SLURM job {self.job_id} on {','.join(self.nodes)} "
            f"(written {time.strftime('%Y-%m-%d %H:%M:%S')})\n"
            f'# Submit from a shell:  eval "$(raydist env --job {self.job_id})"; ray job submit -- python ...\n'
            f"# From a laptop: run RAYDIST_TUNNEL's command, then use RAY_ADDRESS=http://localhost:"
            f"{self.dashboard_port} with a copy of the token.\n"
        )
        return head + "".join(f"{k}={shlex.quote(v)}\n" for k, v in self.variables().items())

    def write(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.render())
        os.replace(tmp, path)

    def export_lines(self, path: Path | None = None) -> str:
        v = self.variables()
        lines = [f"export {k}={shlex.quote(v[k])}" for k in EXPORTED]
        if path is not None:
            lines.append(f"export {CONNECTION_ENV}={shlex.quote(str(path))}")
        return "\n".join(lines) + "\n"


def parse(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            continue
        words = shlex.split(value)
        out[key.strip()] = words[0] if words else ""
    return out


def read(path: Path) -> Connection:
    try:
        v = parse(path.read_text())
    except OSError as e:
        raise RaydistError(f"cannot read connection file {path}: {e.strerror}") from None
    try:
        return Connection(
            job_id=int(v["RAYDIST_SLURM_JOB_ID"]),
            head=v["RAYDIST_HEAD"],
            nodes=tuple(v["RAYDIST_NODES"].split(",")),
            head_ip=v["RAYDIST_HEAD_IP"],
            gcs_port=int(v["RAYDIST_GCS_PORT"]),
            dashboard_host=v["RAYDIST_DASHBOARD_HOST"],
            dashboard_port=int(v["RAYDIST_DASHBOARD_PORT"]),
            client_port=int(v["RAYDIST_CLIENT_PORT"]),
            token_path=v["RAY_AUTH_TOKEN_PATH"],
            login_host=v.get("RAYDIST_LOGIN_HOST", ""),
            user=v.get("RAYDIST_USER", ""),
        )
    except (KeyError, ValueError) as e:
        raise RaydistError(f"connection file {path} is incomplete or damaged ({e})") from None


def find(job_root: Path, job_id: int | None = None, explicit: str | None = None) -> Path:
    """--connection, else $RAYDIST_CONNECTION, else the given job's file, else the newest job's file."""
    if explicit:
        return Path(explicit)
    if job_id is None and os.environ.get(CONNECTION_ENV):
        return Path(os.environ[CONNECTION_ENV])
    if job_id is not None:
        path = job_root / str(job_id) / "connection.env"
        if not path.is_file():
            raise RaydistError(
                f"no connection file for job {job_id} at {path}: the job is not running, "
                f"not ready yet, or uses another job_dir"
            )
        return path
    found = sorted(job_root.glob("*/connection.env"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise RaydistError(f"no running raydist cluster found under {job_root} (pass --job ID or --connection FILE)")
    return found[-1]
