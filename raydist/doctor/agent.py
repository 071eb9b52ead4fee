"""The per-node part of `raydist doctor`: a plain class; runner.py runs one per node as a Ray actor.

Everything here is bounded by a timeout the driver passes: a peer that never answers costs seconds, not a hang.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import errno
import os
import socket
import time

from raydist.doctor import bandwidth, facts
from raydist.doctor.checks import Probe


def _probe(src_ip: str | None, dst_ip: str, port: int, timeout: float) -> Probe:
    """One TCP connect from `src_ip` (the chosen address: the path training traffic takes) to a peer's listener."""
    start = time.perf_counter()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            if src_ip:
                s.bind((src_ip, 0))
            s.connect((dst_ip, port))
        return Probe(True, ms=(time.perf_counter() - start) * 1000)
    except TimeoutError:
        return Probe(False, error=f"no answer from {dst_ip}:{port} within {timeout:g}s")
    except OSError as e:
        why = "refused" if e.errno == errno.ECONNREFUSED else (e.strerror or str(e)).lower()
        return Probe(False, error=f"{dst_ip}:{port} {why}")


class NodeDoctor:
    """One node's agent: its facts, a listener its peers probe, and a rank in the bandwidth group."""

    def __init__(self) -> None:
        self._listener: socket.socket | None = None
        self._store = None
        self._ip: str | None = None
        self._device = None

    def facts(self, where: facts.Where) -> dict:
        f = facts.gather(where)
        self._ip = f.ip
        return facts.as_dict(f)

    def now(self) -> float:
        return time.time()

    def listen(self) -> tuple[str, int] | None:
        """A listening socket on the chosen address; the kernel completes peers' connects without an accept."""
        if self._ip is None:
            return None
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((self._ip, 0))
        s.listen(128)
        self._listener = s
        return self._ip, s.getsockname()[1]

    def probe(self, targets: dict[str, tuple[str, int]], timeout: float) -> dict[str, dict]:
        if not targets:
            return {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(targets))) as pool:
            futures = {peer: pool.submit(_probe, self._ip, ip, port, timeout) for peer, (ip, port) in targets.items()}
            return {peer: dataclasses.asdict(f.result()) for peer, f in futures.items()}

    def open_store(self, world: int, timeout_s: float) -> int:
        """Rank 0: the TCP store every rank meets at, on this node's chosen address and a port the kernel picks."""
        import torch.distributed as dist

        self._store = dist.TCPStore(
            self._ip, 0, world, is_master=True, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False
        )
        return self._store.port

    def join(self, rank: int, world: int, host: str, port: int, backend: str, timeout_s: float) -> str:
        """Join the group; the group's own timeout makes a missing or hung peer an error here, not a hang."""
        import torch
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        store = self._store if rank == 0 else dist.TCPStore(host, port, world, is_master=False, timeout=timeout)
        if backend == "nccl":
            self._device = torch.device("cuda", 0)
            torch.cuda.set_device(self._device)
        else:
            self._device = torch.device("cpu")
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        return backend

    def p2p(self, nbytes: int, iters: int) -> dict:
        return bandwidth.time_ring_p2p(nbytes, iters, self._device).as_dict()

    def allreduce(self, nbytes: int, iters: int) -> dict:
        return bandwidth.time_allreduce(nbytes, iters, self._device).as_dict()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # best effort: the actor is killed right after
            pass

    def pid(self) -> int:
        return os.getpid()
