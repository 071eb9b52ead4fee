"""`raydist launch`'s loop: a state machine (raydist.launcher.states) that starts the group, watches it, asks the
policy (raydist.launcher.policy.decide) and acts on what it decides.

`raydist.launcher.group.Group` does the Ray work; what the ranks' polls mean is raydist.launcher.rank_events's, stop
requests and stopping are raydist.launcher.stopping's, the run's summary is raydist.launcher.outcome's.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable

from raydist.errors import RaydistError
from raydist.launcher import outcome, policy
from raydist.launcher.dashboard import RunList, view_for
from raydist.launcher.elastic import GrowChecks
from raydist.launcher.environment import RankEnv
from raydist.launcher.group import Group, capacity, group_size
from raydist.launcher.hook_records import HookRecords
from raydist.launcher.output import POLL_S, Console, relaying, say, warm_note
from raydist.launcher.rank_events import RankEvents
from raydist.launcher.settings import LaunchConfig
from raydist.launcher.states import Machine, RunState, after
from raydist.launcher.stopping import ClusterStops, Interrupts, stop_ranks
from raydist.launcher.summary import LaunchSummary
from raydist.observability import tracking


class LaunchRun:
    """One `raydist launch`: runs the group until it completes, fails, or is stopped; returns its summary."""

    def __init__(
        self,
        cfg: LaunchConfig,
        command: list[str],
        cwd: str,
        started: float,
        connect: Callable[[LaunchConfig], str],
        *,
        label: str = "launch",
        hand_over: bool = True,
        embedded: bool = False,
        caller_env: dict[str, str] | None = None,
    ):
        """`label`: the run's strategy in the dashboard's run list; `hand_over`: write summary.json and
        $RAYDIST_RESULT_FILE (a job on the launch engine writes its own summary instead); `embedded`: `connect`
        starts the embedded instance (the first start then begins before it, `starts_before_ray`); `caller_env`:
        the environment raydist launch was started with (default: this process's), exported as cfg.export says."""
        self.cfg, self.command, self.cwd, self.started, self.connect = cfg, command, cwd, started, connect
        self.env = RankEnv.of(dict(os.environ) if caller_env is None else caller_env, cfg.export, cfg.env)
        self.label, self.hand_over, self.embedded = label, hand_over, embedded
        self.machine = Machine()
        self.decision: policy.Decision | None = None  # the latest, which the state after RUNNING acts on
        self.restarts = 0
        self.failures: list[str] = []
        self.interrupts = Interrupts()
        self.timeline = outcome.Timeline(started)
        self.run_id = uuid.uuid4().hex[:12]
        self.runs = RunList(cfg.name, command)
        self.console: Console | None = None
        self.ray = ""
        self.view = None
        self.records = HookRecords(cfg.run_dir) if tracking.enabled(cfg.mlflow) and hand_over else None

    def run(self) -> LaunchSummary:
        group = self._connect()
        try:
            while not self.machine.state.terminal:
                group = self._act(group)
            return self._finish(group)
        except BaseException as e:
            self.runs.settled(group, final=True)
            self.view.end(error=e)
            raise
        finally:
            self.console.close()
            if self.records is not None:
                self.records.close()
            if group is not None:
                group.end()

    def _act(self, group: Group | None) -> Group | None:
        """The current state's work, then the move to the state it leads to (raydist.launcher.states allows it)."""
        state = self.machine.state
        if state is RunState.STARTING:
            group = self._start()
            self.machine.to(RunState.RUNNING)
        elif state is RunState.RUNNING:
            self.decision = self._supervise(group)
            self.machine.to(after(self.decision))
        elif state is RunState.RESTARTING:
            self._restart(group)
            self.machine.to(RunState.STARTING)
        elif state is RunState.STOPPING:
            stop_ranks(group, self.cfg, self.decision.reason, self.console)
            self.machine.to(RunState.STOPPED)
        return group

    def _connect(self) -> Group | None:
        """CONNECTING: join Ray, or start the embedded instance. The first start may begin before it (its ranks'
        lines relayed meanwhile) and is then RUNNING at once; else STARTING follows."""
        group = self._start_here() if starts_before_ray(self.cfg, self.embedded) else None
        try:
            with relaying(group, self.console, self.timeline.mark):
                self.ray = self.connect(self.cfg)
            self.interrupts.install()  # after ray.init, which installs a SIGTERM handler of its own
            self.timeline.mark("connected")
            self.view = self.runs.view = view_for(self.cfg, self.label, self.command)
            self.runs.local = self.ray == "local"
            self.console = self.console or Console(self.cfg)
        except BaseException:
            if group is not None:
                group.end()
                self.console.close()
            raise
        if group is not None:
            group.view = self.view  # started before Ray: its view now
            self.runs.due_on_ray()
        self.machine.to(RunState.STARTING if group is None else RunState.RUNNING)
        return group

    def _start(self) -> Group:
        import ray

        n = group_size(self.cfg, capacity(self.cfg, ray.nodes()))
        group = Group(self.cfg, self.view, n, self.restarts, loopback=self.ray == "local")
        group.place()
        self.timeline.mark("placed")
        group.start(self.command, self.cwd, self.run_id, self.env)
        self.timeline.mark("started")
        self._announce(group)
        return group

    def _start_here(self) -> Group:
        """The first start on the embedded instance, before it is up: the agents in this process."""
        self.interrupts.install()  # the ranks may train before Ray is up: a Ctrl-C then stops them gracefully too
        group = Group.here(self.cfg, self.label)
        self.timeline.mark("placed")
        try:
            group.start(self.command, self.cwd, self.run_id, self.env)
            self.timeline.mark("started")
            self.console = Console(self.cfg)
            self._announce(group)
        except BaseException:
            group.end()
            raise
        return group

    def _announce(self, group: Group) -> None:
        """This start's log headers and its line on the console; its dashboard registration is due."""
        self.console.attempt(self.restarts, group.ranks)
        self.runs.due()
        ranks = ", ".join(
            f"{r.rank}@{r.node}" + (f"/{r.slot.place.iface}" if r.slot.place.iface else "") for r in group.ranks
        )
        say(
            f"{self.cfg.name}: {group.n} ranks ({ranks}); MASTER_ADDR={group.ranks[0].slot.place.ip}; "
            f"logs {self.console.logs}" + warm_note(group.ranks)
        )

    def _supervise(self, group: Group) -> policy.Decision:
        """RUNNING: poll until something happens that the policy decides about."""
        ranks, stops, grows = RankEvents(self.cfg, group, self.restarts + 1), ClusterStops(), GrowChecks(self.cfg)
        while True:
            stepped = self._relay(group)
            # An interrupt first, then what the ranks say; the cluster's stop request and room to grow are slower
            # reads (GCS), made only when nothing else happened.
            event = self.interrupts.event() or ranks.event() or stops.event(group) or grows.event(group)
            if event is not None:
                return policy.decide(event, len(self.failures), self.cfg)
            # Only a start still running is registered: a short script's ranks may end before the embedded instance
            # is up, and the registration (Ray Train's import, its state actor) would then only delay the exit.
            self.runs.maybe_register(group, stepped)
            time.sleep(POLL_S)

    def _relay(self, group: Group) -> bool:
        """The ranks' news: their lines to the console and logs, the first step noted; whether a rank stepped."""
        stepped = False
        for rank, lines in group.poll():
            if lines:
                self.timeline.mark("first_output")
            self.console.lines(rank, lines)
            if self.records is not None and rank.rank == 0:
                self.records.note(rank.status)
            first = rank.status.get("first_step_unix")
            stepped = stepped or bool(first)
            self.timeline.stepped(first)
        return stepped

    def _restart(self, group: Group) -> None:
        """RESTARTING: the decision's line, the group ended, the dashboard told; the next start is one more."""
        reason = self.decision.reason
        if self.decision.counts:
            self.failures.append(reason)
        say(reason)
        self.runs.settled(group)
        group.end()
        self.view.restarting(reason)
        self.restarts += 1

    def _finish(self, group: Group) -> LaunchSummary:
        """A terminal state: its summary, the dashboard told, the summary handed over."""
        status, decision = self.machine.state.status, self.decision
        if status == "failed":
            self.failures.append(decision.reason)
        summary = outcome.summarize(
            self.cfg,
            group,
            decision,
            status=status,
            ray=self.ray,
            command=self.command,
            restarts=self.restarts,
            failures=self.failures,
            logs=self.console.logs,
            timeline=self.timeline,
        )
        if self.hand_over:  # the result first: what follows only tells the dashboard
            outcome.hand_over(summary)
        self.runs.settled(group, final=True)
        # The embedded instance's dashboard ends with this process: its last notice is sent, not waited for.
        wait = not self.runs.local
        if status == "failed":
            self.view.end(error=RaydistError(decision.reason), wait=wait)
        else:
            self.view.end(stop_reason=decision.reason if status == "stopped" else None, wait=wait)
        return summary


def starts_before_ray(cfg: LaunchConfig, embedded: bool) -> bool:
    """Whether the first start begins before Ray is up: on the embedded instance (one machine, sized for the run)
    where the group's size does not depend on what Ray says fits (not elastic) and Ray would place the whole group
    on its one node (no procs_per_node that asks for several)."""
    return embedded and not cfg.elastic and cfg.procs_per_node in (0, cfg.max_workers)
