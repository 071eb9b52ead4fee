"""TCP goodput between emulated hosts, for checking shaped links:
    python tests/support/cluster/throughput.py recv PORT SENDERS      # prints {"mbit_s": ..., "bytes": ..., "seconds": ...}
    python tests/support/cluster/throughput.py send HOST PORT MBYTES
The receiver times from the first byte to the last of all senders together (fan-in shares its link)."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time


def recv(port: int, senders: int) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(senders)
    print("listening", flush=True)
    total, first, last = [0], [None], [0.0]
    lock = threading.Lock()

    def drain(conn: socket.socket) -> None:
        while True:
            data = conn.recv(1 << 20)
            now = time.perf_counter()
            if not data:
                break
            with lock:
                first[0] = first[0] or now
                last[0] = now
                total[0] += len(data)
        conn.close()

    threads = []
    for _ in range(senders):
        conn, _ = srv.accept()
        threads.append(threading.Thread(target=drain, args=(conn,)))
        threads[-1].start()
    for t in threads:
        t.join()
    seconds = last[0] - first[0]
    print(json.dumps({"bytes": total[0], "seconds": seconds, "mbit_s": total[0] * 8 / seconds / 1e6}), flush=True)


def send(host: str, port: int, mbytes: int) -> None:
    for _ in range(100):  # the receiver may not listen yet
        try:
            s = socket.create_connection((host, port), timeout=10)
            break
        except OSError:
            time.sleep(0.1)
    block = b"\0" * (1 << 20)
    for _ in range(mbytes):
        s.sendall(block)
    s.close()


if __name__ == "__main__":
    if sys.argv[1] == "recv":
        recv(int(sys.argv[2]), int(sys.argv[3]))
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
