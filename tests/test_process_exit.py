"""raydist.process_exit: a job that ends at once still flushes its output, runs its exit hooks and leaves no thread."""

from __future__ import annotations

EXIT_NOW = """
import atexit, sys, threading, time
from raydist.process_exit import exit_now

out = sys.argv[1]
atexit.register(lambda: open(out + ".hook", "w").write("ran"))
def late():
    time.sleep(0.3)
    open(out + ".thread", "w").write("done")
threading.Thread(target=late).start()  # not a daemon: the exit waits for it, as Python's does
sys.stdout.write("last line, unflushed")
exit_now(3)
"""


def test_a_job_that_exits_now_loses_no_output_no_exit_hook_and_no_thread(tmp_path):
    """A job's process ends without the interpreter's teardown (raydist.process_exit): its exit status, its last
    line in a pipe, its exit hooks (Ray's shutdown, the warm interpreter's) and its threads' work all survive."""
    import subprocess
    import sys

    out = str(tmp_path / "x")
    proc = subprocess.run([sys.executable, "-c", EXIT_NOW, out], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "last line, unflushed"
    assert open(out + ".hook").read() == "ran" and open(out + ".thread").read() == "done"
