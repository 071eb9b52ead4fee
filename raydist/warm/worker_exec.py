"""Ray's worker processes forked by the node's warm interpreter: the `py_executable` of raydist's Ray jobs.

Ray starts each of its Python workers (Ray Train's controller, its helper actors, the training workers) as
`exec <py_executable> default_worker.py ARGS` (ray._private.runtime_env.context). With this file as that
executable, the node's warm interpreter (raydist.warm.server: torch imported, Ray by a server of the
job) forks the worker instead, and this small process stands in for it: Ray's stdout and stderr files are handed
over with the request, the worker's exit code comes back as this process's own, and a signal sent to this process
is passed on.
Ray itself finds the worker by the pid the worker registers with (its own), as always.

Ray's worker set-up comes through here too where the node's Ray was started with raydist.warm.ray_python as
its interpreter: `setup_worker.py ARGS` (Ray's, a fresh interpreter importing Ray for every worker of a job with a
runtime_env) is done here without Ray for the one context raydist's jobs have, and handed to Ray's own
setup_worker.py for any other.

Where there is no warm interpreter (RAYDIST_WARM_SOCKET unset, or nothing listening), or it declines the request
(another environment that acts at start-up), this process becomes `python default_worker.py ARGS` itself: the
worker starts the cold way, exactly as without raydist. Run by path with `python -I -S`, it imports nothing but
the standard library's smallest modules and wire.py beside it, so the cold way costs a few milliseconds more than
before.
"""

import json
import os
import signal
import sys

if __name__ == "__main__":  # run by path with `python -I -S`: neither raydist nor this directory is on sys.path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import wire

    del sys.path[0]
else:
    from raydist.warm import wire

ANSWER_TIMEOUT_S = 60.0  # it listens before its imports are done (and a Ray job's server imports Ray first)
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def cold(args, why):
    """The worker the way Ray starts it without raydist."""
    if why:
        print(f"[raydist] this Ray worker starts without the warm interpreter: {why}", file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, *args])


def forked(path, args):
    """The worker's pid and the connection its exit code comes over, or None and why not."""
    try:
        body = wire.request_body([sys.executable, *args], dict(os.environ), os.getcwd(), None)
        conn, answers, answer = wire.ask(path, body, [1, 2], ANSWER_TIMEOUT_S)
    except (OSError, ValueError) as e:
        return None, None, f"the warm interpreter at {path} did not answer ({type(e).__name__}: {e})"
    pid, why = wire.started(answer)
    if pid is None:
        conn.close()
        return None, None, why
    return pid, answers, ""


def wait(pid, answers):
    """The worker's exit code (-N for signal N); the connection closing without one means the warm interpreter
    died, and the worker with it."""

    def forward(sig, _frame):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    return wire.exit_code(answers)


SETUP_WORKER = "setup_worker.py"
CONTEXT_FIELDS = {"command_prefix", "env_vars", "py_executable", "override_worker_entrypoint", "java_jars"}
CONTEXT_ARG, LANGUAGE_ARG = "--serialized-runtime-env-context=", "--language="


def setup_worker(args):
    """What Ray's setup_worker.py (ray/_private/workers/setup_worker.py, RuntimeEnvContext.exec_worker) does with
    `args` (its own path, the worker's command, the worker's language and the runtime_env's context), done here
    for the context of raydist's jobs: into the job's working_dir where it has one (`cd DIR &&`), its variables
    set (as given: Ray would expand a `$`), then `exec <py_executable> ARGS` where the py_executable is this file,
    so this process goes on as it. Returns the worker's ARGS; None for any other context (another interpreter,
    another command prefix, another language), which Ray's own setup_worker.py then handles."""
    worker, context, language = [], None, None
    for arg in args[1:]:
        if arg.startswith(CONTEXT_ARG):
            context = arg[len(CONTEXT_ARG) :]
        elif arg.startswith(LANGUAGE_ARG):
            language = arg[len(LANGUAGE_ARG) :]
        elif arg.startswith(("--serialized-runtime-env", "--language")):
            return None  # a form this file does not read the way argparse would
        else:
            worker.append(arg)
    try:
        ctx = json.loads(context or "")
    except ValueError:
        return None
    if language != "PYTHON" or not isinstance(ctx, dict) or set(ctx) - CONTEXT_FIELDS or not worker:
        return None
    directory = _cd_only(ctx.get("command_prefix") or [])
    if directory is False or ctx.get("override_worker_entrypoint") or ctx.get("java_jars"):
        return None
    if str(ctx.get("py_executable") or "").split(" ") != [sys.executable, "-I", "-S", os.path.abspath(__file__)]:
        return None  # another interpreter: Ray's own set-up execs it
    env = ctx.get("env_vars") or {}
    if not isinstance(env, dict) or any("$" in str(v) for v in env.values()):
        return None  # Ray expands ${VAR} in them
    try:
        if directory:
            os.chdir(directory)
    except OSError:
        return None  # Ray's own set-up fails there the same way
    os.environ.update({str(k): str(v) for k, v in env.items()})
    return worker


def _cd_only(prefix):
    """The directory of the one command prefix Ray's working_dir gives (`cd DIR &&`, DIR quoted for the shell):
    None without a prefix, False for any other prefix (conda's activation, say)."""
    if not prefix:
        return None
    if len(prefix) != 3 or prefix[0] != "cd" or prefix[2] != "&&":
        return False
    import shlex

    try:
        words = shlex.split(str(prefix[1]))
    except ValueError:  # not one shell word
        return False
    return words[0] if len(words) == 1 else False


def main(args):
    if args and os.path.basename(args[0]) == SETUP_WORKER:
        worker = setup_worker(args)
        if worker is None:
            cold(args, "")  # Ray's set-up, as the raylet asked for it
        args = worker
    path = os.environ.get(wire.WARM_ENV, "")
    if not path:
        cold(args, "")
    pid, answers, why = forked(path, args)
    if pid is None:
        cold(args, why)
    code = wait(pid, answers)
    if code < 0:  # died of a signal: so does this stand-in, so that Ray sees what it would have seen
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
