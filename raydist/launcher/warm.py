"""The agent's side of a node's warm interpreter (raydist.launcher.warm_server): a rank forked from a process with
torch already imported, handled like the subprocess.Popen of a rank started the cold way."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import threading

WARM_ENV = "RAYDIST_WARM_SOCKET"
"""Set by the SLURM bring-up in its Ray's environment (so in every agent's): the node's warm interpreter."""
CONNECT_TIMEOUT_S = 10.0
NO_WARM = "no warm interpreter on this node"
WARM_LOG = "warm-interpreter.log"  # beside its socket, in the job's temp dir


class WarmProcess:
    """A rank forked by the warm interpreter: the part of Popen's interface the agent uses (pid, stdout, poll,
    wait, returncode). Its exit code comes over the connection; a connection that closes without one means the
    warm interpreter died, and its children with it (SIGKILL)."""

    def __init__(self, conn: socket.socket, answers, pid: int, stdout):
        self.pid, self.stdout, self.returncode = pid, stdout, None
        self._conn, self._answers = conn, answers
        self._done = threading.Event()
        threading.Thread(target=self._watch, daemon=True, name=f"warm-rank-{pid}").start()

    def _watch(self) -> None:
        code = -signal.SIGKILL
        try:
            for line in self._answers:
                answer = json.loads(line)
                if "exit" in answer:
                    code = int(answer["exit"])
                    break
        except (OSError, ValueError):
            pass
        self.returncode = code
        self._done.set()
        self._conn.close()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"rank process {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode


def spawn(argv: list[str], env: dict[str, str], cwd: str, niceness: int | None) -> tuple[WarmProcess | None, str]:
    """The rank forked by this node's warm interpreter, or None and why not (no warm interpreter here, or it
    declined: another Python, interpreter options, ...). Its output goes to a pipe the caller reads as stdout."""
    path = os.environ.get(WARM_ENV, "")
    if not path:
        return None, NO_WARM
    if not os.path.exists(path):  # it failed to start or ended: its log is beside the socket
        return None, f"the warm interpreter is not running (its log: {os.path.join(os.path.dirname(path), WARM_LOG)})"
    read_end, write_end = os.pipe()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_TIMEOUT_S)
        conn.connect(path)
        body = json.dumps({"argv": argv, "env": env, "cwd": cwd, "niceness": niceness}).encode()
        socket.send_fds(conn, [struct.pack("!I", len(body))], [write_end])
        conn.sendall(body)
        answers = conn.makefile("rb")
        answer = json.loads(answers.readline() or b"{}")
        conn.settimeout(None)
    except (OSError, ValueError) as e:
        answer = {"declined": f"the warm interpreter did not answer ({type(e).__name__}: {e})"}
    finally:
        os.close(write_end)
    if "pid" not in answer:
        conn.close()
        os.close(read_end)
        return None, str(answer.get("declined", "the warm interpreter did not answer"))
    return WarmProcess(conn, answers, int(answer["pid"]), os.fdopen(read_end, "rb")), ""
