"""A real Debian `prometheus` for tests, on a free loopback port with its own data dir; stopped by PID."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.debian import ensure
from tests.support.rayhead import free_ports


@dataclass
class Prometheus:
    url: str
    log: Path

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """An instant query: (labels, value) per series."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            data = json.load(resp)
        assert data["status"] == "success", data
        return [(r["metric"], float(r["value"][1])) for r in data["data"]["result"]]

    def targets(self) -> list[dict]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as resp:
            return json.load(resp)["data"]["activeTargets"]


@contextlib.contextmanager
def prometheus(config_text: str) -> Iterator[Prometheus]:
    binary = ensure("prometheus", ["prometheus"])
    work = Path(tempfile.mkdtemp(prefix="raydist-prom-"))
    (work / "prometheus.yml").write_text(config_text)
    port = free_ports(1)[0]
    log = work / "prometheus.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    prom = Prometheus(f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.time() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2):
                    break
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError(f"prometheus not ready in 60 s: {log.read_text()[-2000:]}") from None
                time.sleep(0.5)
        yield prom
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
