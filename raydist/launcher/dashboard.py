"""The run in the Ray dashboard's Train run list (raydist.driver.train_view): each start registered late, in a
thread, and settled before the view is told what came next."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from raydist.launcher.output import say
from raydist.launcher.settings import LaunchConfig, to_dict

REGISTER_AFTER_S = 5.0  # the dashboard's run list gets a start this long after it began, or at its first step


def view_for(cfg: LaunchConfig, label: str, command: list[str]):
    from raydist.driver.train_view import RunDescription, TrainView

    return TrainView(
        RunDescription(
            name=cfg.name,
            strategy=label,
            num_workers=cfg.max_workers,
            cpus_per_worker=cfg.cpus_per_worker,
            use_gpu=cfg.use_gpu,
            max_failures=cfg.max_restarts,
            storage_dir=cfg.storage_dir,
            config={"command": command, **to_dict(cfg)},
            backend={"command": " ".join(command)},
        )
    )


class RunList:
    """One run's registrations; `view` and `local` are set once Ray is up (a start may be due before)."""

    def __init__(self, name: str, command: list[str], clock: Callable[[], float] = time.monotonic):
        self.name, self.command, self._clock = name, command, clock
        self.view = None
        self.local = False  # the embedded instance
        self._registering: threading.Thread | None = None
        self._register_at: float | None = None
        self._at_step = True

    def due(self, at_step: bool = True) -> None:
        """A start began: its registration is due after REGISTER_AFTER_S, or at its first step (`at_step`)."""
        self._register_at, self._at_step = self._clock() + REGISTER_AFTER_S, at_step

    def due_on_ray(self) -> None:
        """Ray came up under a start that began before it: the start is registered once it has run REGISTER_AFTER_S
        on Ray, not at once although it has stepped. A script that ends in those seconds is never registered, and
        its command does not wait for Ray Train's import and state actor (nobody would see it: its dashboard ends
        with the command)."""
        if self._register_at is not None:
            self.due(at_step=False)

    def maybe_register(self, group, stepped: bool) -> None:
        if self._register_at is None:
            return
        if (stepped and self._at_step) or self._clock() >= self._register_at:
            self.register(group)

    def register(self, group) -> None:
        """Write this start to the dashboard's run list, in a thread: it imports much of Ray Train and may start
        its state actor, CPU the scripts need while they start (so: after the first step, or REGISTER_AFTER_S).
        Nothing when the run list is turned off (RAY_TRAIN_ENABLE_STATE_TRACKING=0): no stand-ins to start."""
        self._register_at = None
        if self.view is not None and not self.view.enabled:
            return
        if self.local:  # its stand-ins and Ray Train's state actor start now: lowered as they start
            from raydist.driver import yielding

            yielding.soon()
        self._registering = threading.Thread(target=self._register_now, args=(group,), daemon=True)
        self._registering.start()

    def _register_now(self, group) -> None:
        try:
            actors = group.actors()
        except Exception as e:  # the dashboard is a view: the run goes on without it
            self.view.enabled = False
            say(
                f"{self.name}: the dashboard's Train view will not show this run ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else '-'})"
            )
            return
        self.view.running(actors, actors[0], " ".join(self.command))

    def settled(self, group=None, final: bool = False) -> None:
        """Wait for the dashboard registration of the current start (before the view is told what came next);
        a start that ended before its registration was due is registered now. Not at the end of a run on the
        embedded instance that was not registered yet: its dashboard ends with this process, so nobody would see it."""
        if final and self.local and self._registering is None:
            self.view.enabled = False
            return
        if group is not None and self._register_at is not None:
            self.register(group)
        if self._registering is not None:
            # Also at the end of a local run: a registration still going when Ray shuts down would start a new
            # local instance (Ray connects a remote call automatically).
            self._registering.join(timeout=30)
