"""How a request reaches a node's warm interpreter and how it answers, for its server (raydist/warm/server.py),
the agent's side (raydist.warm.client) and Ray's stand-in worker (raydist/warm/worker_exec.py).

A request is a 4-byte length with file descriptors attached (SCM_RIGHTS: the child's stdout and stderr, one fd for
both; where the node's server hands a request on to a Ray job's server, the agent's connection first), then that
many bytes of JSON {"argv", "env", "cwd", "niceness"}. The server answers JSON lines on the same connection:
{"pid": N} or {"declined": "why"}, and later {"exit": code} (Popen's returncode convention: -N for signal N).

Standard library only, and only what worker_exec.py imported before (and `time`, built in): that stand-in is on the
path of every Ray worker's start. Both it and the server are run by path, without the raydist package, and load
this file by path too.
"""

import json
import os
import signal
import socket
import struct
import time

WARM_ENV = "RAYDIST_WARM_SOCKET"
"""Where the node's warm interpreter listens: set by the SLURM bring-up in its Ray's environment (so in every
agent's and every Ray worker's), or beside the embedded instance (raydist.warm.client.start_for_embedded)."""
MAX_REQUEST = 16 << 20
NO_ANSWER = "the warm interpreter did not answer"
_LENGTH = struct.Struct("!I")


def request_body(argv: list[str], env: dict[str, str], cwd: str, niceness: int | None) -> bytes:
    return json.dumps({"argv": argv, "env": env, "cwd": cwd, "niceness": niceness}).encode()


def send_request(conn: socket.socket, body: bytes, fds: list[int]) -> None:
    socket.send_fds(conn, [_LENGTH.pack(len(body))], fds)
    conn.sendall(body)


def ask(path: str, body: bytes, fds: list[int], timeout: float):
    """The server at `path` asked to start a child: (the connection, its answers as a binary file, the first
    answer). The timeout covers the first answer too: the server listens before its imports are done. On OSError
    or ValueError (no JSON) the connection is closed and the error raised."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(timeout)
        conn.connect(path)
        send_request(conn, body, fds)
        answers = conn.makefile("rb")
        answer = json.loads(answers.readline() or b"{}")
        conn.settimeout(None)
    except (OSError, ValueError):
        conn.close()
        raise
    return conn, answers, answer


def started(answer: dict) -> tuple[int | None, str]:
    """The child's pid from the first answer, or None and why the server declined."""
    if "pid" in answer:
        return int(answer["pid"]), ""
    return None, str(answer.get("declined", NO_ANSWER))


def exit_code(answers) -> int:
    """The child's exit code, from the answers after its pid. A connection that closes without one means the
    server died, and the child with it (its death signal: SIGKILL)."""
    try:
        for line in answers:
            answer = json.loads(line)
            if "exit" in answer:
                return int(answer["exit"])
    except (OSError, ValueError):
        pass
    return -signal.SIGKILL


def read_request(conn: socket.socket, max_fds: int, timeout: float) -> tuple[dict, list[int], bytes]:
    """One request as the server reads it: (its JSON, the fds that came with it, its bytes as they came, to be
    handed on as they are). EOFError where the peer closed without sending; ValueError for a malformed request,
    whose fds are closed."""
    deadline = time.monotonic() + timeout
    conn.settimeout(timeout)
    head, fds, _, _ = socket.recv_fds(conn, _LENGTH.size, max_fds)
    if not head and not fds:
        raise EOFError
    size = _LENGTH.unpack(head)[0] if len(head) == _LENGTH.size else 0
    try:
        if not fds or not 0 < size <= MAX_REQUEST:
            raise ValueError("a malformed request")
        body = b""
        while len(body) < size:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise ValueError("a truncated request")
            body += chunk
        return json.loads(body), fds, body
    except BaseException:
        close_fds(fds)
        raise


def send_answer(conn: socket.socket, message: dict) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
