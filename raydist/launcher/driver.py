"""`raydist launch`'s loop: start the group, watch it, ask the policy, act; output, logs, stacks, summary.

The loop acts on what `raydist.launcher.policy.decide` says; `raydist.launcher.group.Group` does the Ray work.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from raydist.atomic import write_json_atomic
from raydist.errors import RaydistError
from raydist.launcher import policy
from raydist.launcher.errorfile import describe as describe_error
from raydist.launcher.group import Group, capacity, group_size
from raydist.launcher.settings import LaunchConfig, to_dict
from raydist.launcher.summary import LaunchSummary
from raydist.warm.client import COLD_BY_CHOICE, NO_WARM
from raydist.summary import RESULT_ENV

POLL_S = 0.2  # how often output is relayed and the ranks are looked at
STOP_POLL_S = 1.0  # how often the cluster's stop request and node drains are read (GCS reads)
REGISTER_AFTER_S = 5.0  # the dashboard's run list gets a start this long after it began, or at its first step
GROW_CHECK_S = 30.0  # how often an elastic run below MAX looks for room for more (as Ray Train's resize check)


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
            self.files[r.rank].write(f"=== raydist launch: start {restarts + 1}, rank {r.rank} on {r.node} "
                                     f"(pid {r.pid}) at {time.strftime('%Y-%m-%d %H:%M:%S')} ===\n")

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


class Interrupts:
    """SIGTERM/SIGINT to the launcher become a STOP event: the ranks get stop_signal and their grace."""

    def __init__(self):
        self.why: str | None = None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._note)

    def _note(self, signum, _frame) -> None:
        if self.why is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop waiting for the grace period
        self.why = f"raydist launch received {signal.Signals(signum).name}"


@dataclass(frozen=True)
class RankEnv:
    """What every rank gets of the caller's environment (raydist.launcher.environment.merged puts it together with
    the node's on the rank's node): its exported variables, and those the user named (--env, --export NAME)."""

    caller: dict[str, str]
    named: dict[str, str]


class LaunchRun:
    """One `raydist launch`: runs the group until it completes, fails, or is stopped; returns its summary."""

    def __init__(self, cfg: LaunchConfig, command: list[str], cwd: str, started: float,
                 connect: Callable[[LaunchConfig], str], *, label: str = "launch", hand_over: bool = True,
                 embedded: bool = False, caller_env: dict[str, str] | None = None):
        """`label`: the run's strategy in the dashboard's run list; `hand_over`: write summary.json and
        $RAYDIST_RESULT_FILE (a job on the launch engine writes its own summary instead); `embedded`: `connect`
        starts the embedded instance (the first start then begins before it, `starts_before_ray`); `caller_env`:
        the environment raydist launch was started with (default: this process's), exported as cfg.export says."""
        from raydist.launcher.environment import Export, exported, given

        self.cfg, self.command, self.cwd, self.started, self.connect = cfg, command, cwd, started, connect
        caller = dict(os.environ) if caller_env is None else caller_env
        export = Export.parse(cfg.export)
        self.env = RankEnv(exported(caller, export), given(caller, export, cfg.env))
        self.label, self.hand_over, self.embedded = label, hand_over, embedded
        self.restarts = 0
        self.failures: list[str] = []
        self.interrupts = Interrupts()
        self.timeline: dict[str, float] = {}
        self.first_step_unix: float | None = None
        self.run_id = uuid.uuid4().hex[:12]
        self._registering: threading.Thread | None = None
        self._register_at: float | None = None
        self.console: Console | None = None

    def _registered(self, group: Group | None = None, final: bool = False) -> None:
        """Wait for the dashboard registration of the current start (before the view is told what came next);
        a start that ended before its registration was due is registered now. Not at the end of a run on the
        embedded instance that was not registered yet: its dashboard ends with this process, so nobody would see it."""
        if final and self.ray == "local" and self._registering is None:
            self.view.enabled = False
            return
        if group is not None and self._register_at is not None:
            self._register(group)
        if self._registering is not None:
            # Also at the end of a local run: a registration still going when Ray shuts down would start a new
            # local instance (Ray connects a remote call automatically).
            self._registering.join(timeout=30)

    def _mark(self, what: str) -> None:
        self.timeline.setdefault(what, round(time.perf_counter() - self.started, 3))

    def run(self) -> LaunchSummary:
        group = self._start_here() if starts_before_ray(self.cfg, self.embedded) else None
        try:
            with self._relaying(group):
                self.ray = self.connect(self.cfg)
            self.interrupts.install()  # after ray.init, which installs a SIGTERM handler of its own
            self._mark("connected")
            self.view = self._view()
            self.console = self.console or Console(self.cfg)
        except BaseException:
            if group is not None:
                group.end()
                self.console.close()
            raise
        decision = None
        try:
            while True:
                if group is not None and group.view is None:  # started before Ray: its view now
                    group.view = self.view
                else:
                    group = self._start()
                decision = self._supervise(group)
                if decision.action == policy.Action.STOP:
                    self._stop(group, decision.reason)
                if decision.action != policy.Action.RESTART:
                    break
                if decision.counts:
                    self.failures.append(decision.reason)
                say(decision.reason)
                self._registered(group)
                group.end()
                self.view.restarting(decision.reason)
                self.restarts += 1
            return self._finish(group, decision)
        except BaseException as e:
            self._registered(group, final=True)
            self.view.end(error=e)
            raise
        finally:
            self.console.close()
            if group is not None:
                group.end()

    def _view(self):
        from raydist.driver.train_view import RunDescription, TrainView

        c = self.cfg
        return TrainView(RunDescription(
            name=c.name, strategy=self.label, num_workers=c.max_workers, cpus_per_worker=c.cpus_per_worker,
            use_gpu=c.use_gpu, max_failures=c.max_restarts, storage_dir=c.storage_dir,
            config={"command": self.command, **to_dict(c)}, backend={"command": " ".join(self.command)}))

    def _start(self) -> Group:
        import ray

        n = group_size(self.cfg, capacity(self.cfg, ray.nodes()))
        group = Group(self.cfg, self.view, n, self.restarts, loopback=self.ray == "local")
        group.place()
        self._mark("placed")
        group.start(self.command, self.cwd, self.run_id, self.env)
        self._mark("started")
        self._announce(group)
        return group

    def _start_here(self) -> Group:
        """The first start on the embedded instance, before it is up: the agents in this process."""
        self.interrupts.install()  # the ranks may train before Ray is up: a Ctrl-C then stops them gracefully too
        group = Group.here(self.cfg, self.label)
        self._mark("placed")
        try:
            group.start(self.command, self.cwd, self.run_id, self.env)
            self._mark("started")
            self.console = Console(self.cfg)
            self._announce(group)
        except BaseException:
            group.end()
            raise
        return group

    @contextlib.contextmanager
    def _relaying(self, group: Group | None):
        """While Ray starts: the ranks started before it print to the console as they go (the loop's own polls
        begin once Ray is up)."""
        if group is None:
            yield
            return
        connected = threading.Event()

        def relay() -> None:
            while not connected.wait(POLL_S):
                for rank, lines in group.poll():
                    if lines:
                        self._mark("first_output")
                    self.console.lines(rank, lines)

        thread = threading.Thread(target=relay, name="raydist-relay", daemon=True)
        thread.start()
        try:
            yield
        finally:
            connected.set()
            thread.join()

    def _announce(self, group: Group) -> None:
        """This start's log headers and its line on the console; its dashboard registration is due."""
        self.console.attempt(self.restarts, group.ranks)
        self._register_at = time.monotonic() + REGISTER_AFTER_S
        ranks = ", ".join(f"{r.rank}@{r.node}" + (f"/{r.slot.place.iface}" if r.slot.place.iface else "")
                          for r in group.ranks)
        say(f"{self.cfg.name}: {group.n} ranks ({ranks}); MASTER_ADDR={group.ranks[0].slot.place.ip}; "
            f"logs {self.console.logs}" + warm_note(group.ranks))

    def _register(self, group: Group) -> None:
        """Write this start to the dashboard's run list, in a thread: it imports much of Ray Train and may start
        its state actor, CPU the scripts need while they start (so: after the first step, or REGISTER_AFTER_S)."""
        self._register_at = None
        self._registering = threading.Thread(target=self._register_now, args=(group,), daemon=True)
        self._registering.start()

    def _register_now(self, group: Group) -> None:
        try:
            actors = group.actors()
        except Exception as e:  # the dashboard is a view: the run goes on without it
            self.view.enabled = False
            say(f"{self.cfg.name}: the dashboard's Train view will not show this run ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else '-'})")
            return
        self.view.running(actors, actors[0], " ".join(self.command))

    def _supervise(self, group: Group) -> policy.Decision:
        """Poll until something happens that the policy decides about."""
        next_stop_check, next_grow_check = 0.0, time.monotonic() + GROW_CHECK_S
        while True:
            stepped = False
            for rank, lines in group.poll():
                if lines:
                    self._mark("first_output")
                self.console.lines(rank, lines)
                first = rank.status.get("first_step_unix")
                stepped = stepped or bool(first)
                if first and self.first_step_unix is None:
                    self.first_step_unix = first
            if self._register_at is not None and (stepped or time.monotonic() >= self._register_at):
                self._register(group)
            event = self._event(group)
            if event is None and time.monotonic() >= next_stop_check:
                next_stop_check = time.monotonic() + STOP_POLL_S
                event = self._stop_event(group)
            if event is None and self.cfg.elastic and time.monotonic() >= next_grow_check:
                next_grow_check = time.monotonic() + GROW_CHECK_S
                event = self._grow_event(group)
            if event is not None:
                return policy.decide(event, len(self.failures), self.cfg)
            time.sleep(POLL_S)

    def _event(self, group: Group) -> policy.Event | None:
        if self.interrupts.why:
            return policy.Event(policy.Kind.STOP, detail=self.interrupts.why)
        for r in group.ranks:
            if r.lost:
                return policy.Event(policy.Kind.LOST, r.rank, r.node, r.pid, detail=r.lost)
        self._note_exit_faults(group)
        failed = [r for r in group.ranks if r.exit_code not in (None, 0) and not r.exit_fault]
        if failed:
            r = max(failed, key=lambda r: (r.ended_s_ago, -r.rank))  # the first to fail; its peers followed
            return policy.Event(policy.Kind.EXITED, r.rank, r.node, r.pid, r.exit_code,
                                describe_error(r.error) or r.last_line)
        if all(r.exit_code == 0 or r.exit_fault for r in group.ranks):
            faults = [r.exit_fault for r in group.ranks if r.exit_fault]
            if faults:
                return policy.Event(policy.Kind.EXIT_FAULT, detail="; ".join(faults))
            return policy.Event(policy.Kind.COMPLETED)
        return self._hang([r for r in group.ranks if r.returned_s_ago is None], group)

    def _note_exit_faults(self, group: Group) -> None:
        """A rank whose script had returned and that then died by a signal, or has been silent without exiting for
        exit_timeout_s (its stack dumped, then killed): an exit fault, reported, never restarted."""
        for r in group.ranks:
            how = None if r.exit_fault else policy.exit_fault(r.returned_s_ago, r.silent_s, r.exit_code,
                                                              self.cfg.exit_timeout_s)
            who = f"rank {r.rank} on {r.node} (pid {r.pid})"
            if how == "signal":
                r.exit_fault = f"{who} was then killed by signal {-r.exit_code} on its way out"
            elif how == "hung":
                where = self._write_stacks(group.dump_stacks([r]), "exit-")
                group.kill(r)
                r.exit_fault = (f"{who} then printed nothing and did not exit for {self.cfg.exit_timeout_s:g} s "
                                f"(exit_timeout_s); its stack is in {where / f'exit-rank{r.rank}.txt'}; killed")
            if how:
                say(f"exit fault: {r.exit_fault}")

    def _hang(self, training: list, group: Group) -> policy.Event | None:
        """A training hang among the ranks whose scripts have not returned (a rank on its way out has its own
        bound, exit_timeout_s)."""
        now = time.monotonic()
        running = [r for r in training if r.exit_code is None]
        acts = [policy.Activity(r.rank, now - r.silent_s, r.state) for r in running]
        if policy.hung_rank(acts, now, self.cfg.hang_timeout_s) is None:
            return None
        stacks = group.dump_stacks()
        where = self._write_stacks(stacks)
        acts = [policy.Activity(a.rank, a.last_active, a.state, _in_collective(stacks.get(a.rank, {}).get("text", "")))
                for a in acts]
        bad = policy.culprit(acts)
        r = group.ranks[bad.rank]
        state = " (its process was stopped)" if bad.state in ("T", "t") else ""
        return policy.Event(policy.Kind.HUNG, r.rank, r.node, r.pid, detail=(
            f"printed nothing and reported no step for {now - bad.last_active:.0f} s (hang_timeout_s="
            f"{self.cfg.hang_timeout_s:g}){state}; every rank's stack is in {where}"))

    def _write_stacks(self, stacks: dict[int, dict[str, Any]], prefix: str = "") -> Path:
        where = Path(self.cfg.run_dir) / "stacks" / f"start{self.restarts + 1}"
        where.mkdir(parents=True, exist_ok=True)
        for rank, s in stacks.items():
            (where / f"{prefix}rank{rank}.txt").write_text(f"# {s.get('how')}, {s.get('seconds', 0):.2f} s\n{s['text']}\n")
        return where

    def _grow_event(self, group: Group) -> policy.Event | None:
        import ray

        # Room beyond what the group holds now: free CPUs (and GPUs) anywhere, so that other jobs' share counts.
        free = ray.available_resources()
        more = int(free.get("CPU", 0) // self.cfg.cpus_per_worker + 1e-9)
        if self.cfg.use_gpu:
            more = min(more, int(free.get("GPU", 0)))
        if self.cfg.procs_per_node:
            more -= more % self.cfg.procs_per_node
        fits = group_size(self.cfg, min(group.n + more, capacity(self.cfg, ray.nodes())))
        if fits <= group.n:
            return None
        return policy.Event(policy.Kind.GROW, detail=f"{fits} of workers={self.cfg.workers} fit the cluster again "
                                                     f"(running {group.n})")

    def _stop_event(self, group: Group) -> policy.Event | None:
        from raydist.cluster.preemption import draining_nodes, stop_requested

        try:
            request = stop_requested()
            draining = draining_nodes()
        except Exception:  # a GCS that does not answer now is the poll's business, not the stop check's
            return None
        if request is not None:
            return policy.Event(policy.Kind.STOP, detail=request.describe())
        ours = {r.slot.place.node_id: r.node for r in group.ranks}
        drained = [ours[n] for n in draining if n in ours]
        if drained:
            return policy.Event(policy.Kind.STOP, detail=f"node(s) {', '.join(sorted(set(drained)))} being drained "
                                                         f"(preemption)")
        return None

    def _stop(self, group: Group, reason: str) -> None:
        """stop_signal to every rank, then up to grace_s (less when the cluster ends sooner) for them to exit."""
        from raydist.cluster.preemption import stop_requested

        grace = self.cfg.grace_s
        try:
            request = stop_requested()
        except Exception:
            request = None
        if request is not None and request.deadline_unix is not None:
            grace = max(0.0, min(grace, request.deadline_unix - time.time() - 5))
        say(f"{reason}: sending {self.cfg.stop_signal} to every rank; they have {grace:.0f} s to exit")
        group.send(self.cfg.stop_signal)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            polled = group.poll()
            for rank, lines in polled:
                self.console.lines(rank, lines)
            if all(r.exit_code is not None or r.lost for r in group.ranks):
                return
            time.sleep(POLL_S)
        say(f"ranks still running after {grace:.0f} s: killing them")

    def _finish(self, group: Group, decision: policy.Decision) -> LaunchSummary:
        status = {policy.Action.DONE: "completed", policy.Action.STOP: "stopped",
                  policy.Action.FINISHED_FAULTY: "exit_fault"}.get(decision.action, "failed")
        if status == "failed":
            self.failures.append(decision.reason)
        summary = LaunchSummary(
            run_name=self.cfg.name, run_dir=self.cfg.run_dir, ray=self.ray, command=self.command,
            workers=len(group.ranks), status=status, exit_code=decision.exit_code, reason=decision.reason,
            restarts=self.restarts, wall_s=round(time.perf_counter() - self.started, 3),
            ranks=[{"rank": r.rank, "node": r.node, "iface": r.slot.place.iface, "pid": r.pid,
                    "exit_code": r.exit_code, "warm": r.warm, "exit_fault": r.exit_fault} for r in group.ranks],
            failures=self.failures, logs=str(self.console.logs), startup_s=self._startup(),
            error=self._root_cause(group) if status == "failed" else None)
        self._registered(group, final=True)
        if status == "failed":
            self.view.end(error=RaydistError(decision.reason))
        else:
            self.view.end(stop_reason=decision.reason if status == "stopped" else None)
        if self.hand_over:
            summary.write()
            if os.environ.get(RESULT_ENV):
                write_json_atomic(Path(os.environ[RESULT_ENV]), summary.to_dict())
        return summary

    @staticmethod
    def _root_cause(group: Group) -> dict[str, Any] | None:
        """What the first failed rank wrote to TORCHELASTIC_ERROR_FILE (a script decorated with @record)."""
        failed = [r for r in group.ranks if r.error and not r.exit_fault]
        if not failed:
            return None
        r = max(failed, key=lambda r: (r.ended_s_ago, -r.rank))
        return {"rank": r.rank, "node": r.node, **r.error}

    def _startup(self) -> dict[str, float]:
        out = dict(self.timeline)
        if self.first_step_unix is not None:
            from raydist.driver.session import process_start_time

            out["first_step"] = round(self.first_step_unix - process_start_time(), 3)
        return out


def warm_note(ranks) -> str:
    """How many ranks the nodes' warm interpreters forked, and why the others could not be (SLURM bring-up only)."""
    warm = sum(r.warm for r in ranks)
    why = sorted({r.cold_why for r in ranks if not r.warm and r.cold_why not in (NO_WARM, COLD_BY_CHOICE)})
    if not warm and not why:
        return ""
    return f"; {warm} of them forked with torch imported" + (f" (others: {'; '.join(why)})" if why else "")


def starts_before_ray(cfg: LaunchConfig, embedded: bool) -> bool:
    """Whether the first start begins before Ray is up: on the embedded instance (one machine, sized for the run)
    where the group's size does not depend on what Ray says fits (not elastic) and Ray would place the whole group
    on its one node (no procs_per_node that asks for several)."""
    return embedded and not cfg.elastic and cfg.procs_per_node in (0, cfg.max_workers)


COLLECTIVE_FRAMES = ("torch/distributed/", "torch/nn/parallel/distributed.py", "torch/autograd/", "_engine_run_backward")


def _in_collective(stack: str) -> bool | None:
    """Whether a dumped stack waits on its peers (in torch.distributed, or in a DDP backward's all-reduce)."""
    if not stack.strip() or stack.startswith("("):
        return None
    return any(frame in stack for frame in COLLECTIVE_FRAMES)

