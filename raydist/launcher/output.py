"""What `raydist launch` shows: each rank's lines (its log file, and the console for the ranks `output` chooses),
raydist's own one-line messages, and the relay of the ranks' lines while Ray is still starting."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raydist.launcher.settings import LaunchConfig
from raydist.warm.client import COLD_BY_CHOICE, NO_WARM

POLL_S = 0.2  # how often output is relayed and the ranks are looked at


class Console:
    """Each rank's lines to its log file; the chosen ranks' lines, prefixed, to stdout."""

    def __init__(self, cfg: LaunchConfig, out=None):
        self.cfg, self.out = cfg, out or sys.stdout
        self.logs = Path(cfg.run_dir) / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.files: dict[int, Any] = {}

    def attempt(self, restarts: int, ranks) -> None:
        for f in self.files.values():
            f.close()
        self.files = {r.rank: open(self.logs / f"rank{r.rank}.log", "a", buffering=1) for r in ranks}
        for r in ranks:
            self.files[r.rank].write(
                f"=== raydist launch: start {restarts + 1}, rank {r.rank} on {r.node} "
                f"(pid {r.pid}) at {time.strftime('%Y-%m-%d %H:%M:%S')} ===\n"
            )

    def lines(self, rank, lines: list[str]) -> None:
        if not lines:
            return
        f = self.files.get(rank.rank)
        if f:
            f.write("\n".join(lines) + "\n")
        if self.cfg.output == "all" or (self.cfg.output == "rank0" and rank.rank == 0):
            prefix = f"[rank {rank.rank} {rank.node}] "
            self.out.write("".join(prefix + ln + "\n" for ln in lines))
            self.out.flush()

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def say(msg: str) -> None:
    print(f"[raydist] {msg}", file=sys.stderr, flush=True)


def warm_note(ranks) -> str:
    """How many ranks the nodes' warm interpreters forked, and why the others could not be (SLURM bring-up only)."""
    warm = sum(r.warm for r in ranks)
    why = sorted({r.cold_why for r in ranks if not r.warm and r.cold_why not in (NO_WARM, COLD_BY_CHOICE)})
    if not warm and not why:
        return ""
    return f"; {warm} of them forked with torch imported" + (f" (others: {'; '.join(why)})" if why else "")


@contextlib.contextmanager
def relaying(group, console: Console, mark: Callable[[str], None]):
    """While Ray starts: the ranks started before it print to the console as they go (the loop's own polls
    begin once Ray is up). `group` None: nothing started yet, nothing to relay."""
    if group is None:
        yield
        return
    connected = threading.Event()

    def relay() -> None:
        while not connected.wait(POLL_S):
            for rank, lines in group.poll():
                if lines:
                    mark("first_output")
                console.lines(rank, lines)

    thread = threading.Thread(target=relay, name="raydist-relay", daemon=True)
    thread.start()
    try:
        yield
    finally:
        connected.set()
        thread.join()
