"""The per-job directory on the shared filesystem (mode 0700): token, bring-up plan, node records, connection file."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from raydist.atomic import write_json_atomic
from raydist.errors import RaydistError


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the batch step decides before any node starts; every node reads it."""

    job_id: int
    nodes: tuple[str, ...]
    head: str
    head_ip: str
    head_iface: str
    head_why: str
    block_start: int
    block_size: int
    dashboard_host: str
    temp_dir: str
    token_path: str
    object_store_memory: int | None
    login_host: str
    config_source: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        data = dict(data)
        data["nodes"] = tuple(data["nodes"])
        return cls(**data)


class JobDir:
    def __init__(self, path: Path | str):
        self.path = Path(path)

    token = property(lambda self: self.path / "token")
    plan_file = property(lambda self: self.path / "plan.json")
    connection = property(lambda self: self.path / "connection.env")
    nodes_dir = property(lambda self: self.path / "nodes")

    def create(self) -> None:
        # The parent may be shared by the user's jobs; the job's own dir holds the token and is private.
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.path.exists():
            raise RaydistError(
                f"job dir {self.path} already exists: a previous job with this id left it; remove it and resubmit"
            )
        self.path.mkdir(mode=0o700)
        os.chmod(self.path, 0o700)  # mkdir's mode is masked by the umask
        self.nodes_dir.mkdir(mode=0o700)

    def write_token(self) -> Path:
        """A fresh 256-bit token, created 0600 from the first byte (never world-readable, as ~/.ray/auth_token is)."""
        fd = os.open(self.token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        os.chmod(self.token, 0o600)
        return self.token

    def read_token(self) -> str:
        try:
            return self.token.read_text().strip()
        except OSError as e:
            raise RaydistError(f"cannot read the job's token {self.token}: {e.strerror}") from None

    def write_plan(self, plan: Plan) -> None:
        write_json_atomic(self.plan_file, dataclasses.asdict(plan))

    def read_plan(self, wait: float = 0.0) -> Plan:
        # A shared filesystem may show the plan to other nodes a moment late.
        deadline = time.monotonic() + wait
        while True:
            try:
                return Plan.from_dict(json.loads(self.plan_file.read_text()))
            except FileNotFoundError:
                if time.monotonic() >= deadline:
                    raise RaydistError(
                        f"no bring-up plan at {self.plan_file}: is job_dir on a filesystem every node shares?"
                    ) from None
                time.sleep(0.5)

    def write_record(self, node: str, **fields: Any) -> None:
        """This node's bring-up state, for the readiness wait's report ('started', 'failed' + error...)."""
        path = self.nodes_dir / f"{node}.json"
        try:
            current = json.loads(path.read_text())
        except (OSError, ValueError):
            current = {"node": node}
        current.update(fields, updated=time.time())
        try:
            write_json_atomic(path, current)
        except OSError:
            pass  # the job dir is gone: the job is ending

    def records(self) -> dict[str, dict[str, Any]]:
        out = {}
        for p in sorted(self.nodes_dir.glob("*.json")):
            try:
                out[p.stem] = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
        return out

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
