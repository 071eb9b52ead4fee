"""What a job shows on its console: one progress bar per run, and Ray Train's chatter kept off it.

`ProgressBar` is the one renderer every driver uses (the Ray Train jobs through `MetricsTail`, which follows the
run's metrics.jsonl; the async parameter-server driver directly). On a terminal it redraws one line in place on
stderr; anything else written to the terminal meanwhile (a worker's line forwarded by Ray) clears it first and it is
drawn again below. Elsewhere (a pipe, a file, a SLURM log, `ray job submit`) it prints plain lines, a bounded
number per run: one when training starts, one at each tenth of the run, one at the end.

`quiet_ray_train_logs` keeps Ray Train's per-report and per-checkpoint INFO lines off a worker's console; Ray's
own log files (the dashboard's Logs view, `<session>/logs/train/`) still receive them. `run.verbose=true`
(`--verbose`) leaves them on.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

PREFIX = "[raydist] "
PLAIN_LINES = 10
"""Plain (non-terminal) progress lines per run besides the first and the last: one per tenth of the run."""
REFRESH_S = 0.2  # the fastest a terminal bar is redrawn
RATE_WINDOW_S = 10.0  # samples/s and the ETA are measured over about this much recent time
RATE_MIN_S = 1.0  # and shown once that covers at least this much
BAR_WIDTH = 24


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _rate(value: float) -> str:
    return f"{value / 1000:.1f}k" if value >= 10_000 else f"{value:.0f}"


class _Guard:
    """Stands in for sys.stdout / sys.stderr while a terminal bar is up: anything written clears the bar first,
    and the bar is drawn again (at its next refresh) only where a line has ended."""

    def __init__(self, stream: TextIO, bar: ProgressBar):
        self._stream, self._bar = stream, bar

    def write(self, text: str) -> int:
        with self._bar._lock:
            if text:
                self._bar._clear()
                self._bar._line_open = not text.endswith("\n")
            return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class ProgressBar:
    """One run's progress: step / total, samples/s, loss, test accuracy and ETA.

    `update` may be called as often as wanted (from any thread): a terminal bar is redrawn at most every
    REFRESH_S, and plain lines are printed only at the first step, at each tenth of `total` and at `close`."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        samples_per_step: int | None = None,
        stream: TextIO | None = None,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        export: Any = None,
    ):
        """export: a raydist.observability.ray_metrics.Exporter that the driver's view of the run also goes to."""
        self.label = label
        self.export = export
        self.total = total
        self.samples_per_step = samples_per_step
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(tty if tty is not None else getattr(self.stream, "isatty", lambda: False)())
        self.clock = clock
        self.step: int | None = None
        self.loss: float | None = None
        self.test_accuracy: float | None = None
        self.extra: dict[str, str] = {}
        self._given_rate: float | None = None
        self._seen: deque[tuple[float, int]] = deque()
        self._lock = threading.RLock()
        self._drawn = False  # the bar is on the terminal's current line
        self._line_open = False  # somebody else's partial line is on it
        self._last_draw = -1e9
        self._plain_bucket = -1  # the last tenth a plain line was printed for
        self._plain_step: int | None = None  # the step of the last plain line
        self._closed = False
        self._saved: tuple[TextIO, TextIO] | None = None
        if self.tty:
            self._saved = (sys.stdout, sys.stderr)
            if sys.stderr is self.stream or getattr(sys.stderr, "isatty", lambda: False)():
                sys.stderr = _Guard(sys.stderr, self)  # type: ignore[assignment]
            if getattr(sys.stdout, "isatty", lambda: False)():
                sys.stdout = _Guard(sys.stdout, self)  # type: ignore[assignment]

    # ---- state ------------------------------------------------------------------------------------------

    def new_session(self, step: int, total: int | None = None, samples_per_step: int | None = None) -> None:
        """A (re)start at `step`: the rate is measured afresh from its next steps."""
        with self._lock:
            self.total = total if total is not None else self.total
            self.samples_per_step = samples_per_step if samples_per_step is not None else self.samples_per_step
            self._seen.clear()
            self.step = step

    def update(
        self,
        step: int,
        *,
        loss: float | None = None,
        test_accuracy: float | None = None,
        samples_per_s: float | None = None,
        total: int | None = None,
        extra: dict[str, str] | None = None,
        at: float | None = None,
    ) -> None:
        """The run is at `step`; loss, test_accuracy, samples_per_s (else measured from the steps) and `extra`
        (more figures by name, e.g. staleness) replace the shown ones when given. `at`: when the step was taken,
        in seconds on a clock of the run's own (metrics.jsonl's time_s), for the rate; else when this is called."""
        with self._lock:
            if self._closed:
                return
            now = self.clock()
            taken = now if at is None else at
            if total is not None:
                self.total = total
            if self._seen and (step < self._seen[-1][1] or taken < self._seen[-1][0]):  # back to a checkpoint
                self._seen.clear()
            first = self._plain_step is None
            self.step = step
            self._seen.append((taken, step))
            while len(self._seen) > 2 and taken - self._seen[1][0] >= RATE_WINDOW_S:
                self._seen.popleft()
            if loss is not None:
                self.loss = loss
            if test_accuracy is not None:
                self.test_accuracy = test_accuracy
            if samples_per_s is not None:
                self._given_rate = samples_per_s
            if extra:
                self.extra.update(extra)
            if self.export is not None:
                sps = self._given_rate
                if sps is None and self.samples_per_step and (rate := self.steps_per_s()) is not None:
                    sps = rate * self.samples_per_step
                self.export.observe(
                    step=step, total_steps=self.total, loss=loss, test_accuracy=test_accuracy, samples_per_s=sps
                )
                self.export.maybe_export()
            if self.tty:
                if now - self._last_draw >= REFRESH_S:
                    self._draw(now)
            elif (first and step > 0) or self._bucket(step) > self._plain_bucket:
                self._plain(now)

    def steps_per_s(self) -> float | None:
        if len(self._seen) < 2:
            return None
        (t0, s0), (t1, s1) = self._seen[0], self._seen[-1]
        return (s1 - s0) / (t1 - t0) if t1 - t0 >= RATE_MIN_S and s1 > s0 else None

    def _bucket(self, step: int) -> int:
        return min(PLAIN_LINES, step * PLAIN_LINES // self.total) if self.total else -1

    # ---- rendering --------------------------------------------------------------------------------------

    def fields(self, short: bool = False) -> list[str]:
        """The figures after the step: loss, test accuracy, samples/s, ETA (those known so far); `short` for the
        terminal bar."""
        out = []
        if self.loss is not None:
            out.append(f"loss {self.loss:.3g}" if short else f"loss {self.loss:.4g}")
        if self.test_accuracy is not None:
            out.append(f"acc {self.test_accuracy:.3g}" if short else f"test_accuracy {self.test_accuracy:.4g}")
        out += [f"{name} {value}" for name, value in self.extra.items()]
        rate = self.steps_per_s()
        samples = self._given_rate
        if samples is None and rate is not None and self.samples_per_step:
            samples = rate * self.samples_per_step
        if samples is not None:
            out.append(f"{_rate(samples)} samples/s")
        if rate and self.total and self.step is not None and self.step < self.total:
            out.append(f"ETA {format_duration((self.total - self.step) / rate)}")
        return out

    def plain_line(self) -> str:
        step = self.step or 0
        where = f"step {step}/{self.total} ({100 * step // self.total}%)" if self.total else f"step {step}"
        return f"{PREFIX}{self.label}: " + " ".join([where, *self.fields()])

    def bar_line(self, width: int | None = None) -> str:
        """The terminal line: figures first, then a bar as wide as the terminal leaves room for (up to
        BAR_WIDTH), then cut to the width if even the figures do not fit."""
        width = (width or shutil.get_terminal_size((100, 24)).columns) - 1
        step = self.step or 0
        head = f"{PREFIX}{self.label}: "
        where = f"{step}/{self.total} {100 * step // self.total}%" if self.total else f"step {step}"
        figures = " ".join([where, *self.fields(short=True)])
        room = min(BAR_WIDTH, width - len(head) - len(figures) - 3)
        if self.total and room >= 5:
            done = min(room, room * step // self.total)
            full, empty = ("█", "░") if _can_encode(self.stream, "█░") else ("#", "-")
            head += f"|{full * done}{empty * (room - done)}| "
        return (head + figures)[: max(10, width)]

    def _clear(self) -> None:
        if self._drawn:
            self._raw("\r\x1b[K")
            self._drawn = False

    def _draw(self, now: float) -> None:
        if self._line_open:
            return
        self._raw("\r" + self.bar_line() + "\x1b[K")
        self._drawn = True
        self._last_draw = now

    def _plain(self, now: float) -> None:
        self._raw(self.plain_line() + "\n")
        self._plain_bucket = self._bucket(self.step or 0)
        self._plain_step = self.step

    def say(self, text: str) -> None:
        """One line of news between the bar's lines (a terminal bar is cleared first and redrawn by the next update)."""
        with self._lock:
            self._clear()
            self._raw(f"[raydist] {self.label}: {text}\n")

    def _raw(self, text: str) -> None:
        stream = self.stream._stream if isinstance(self.stream, _Guard) else self.stream
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):  # a closed or broken console is no reason to fail a run
            pass

    def close(self, completed: bool = True) -> None:
        """The final state: a terminal bar is drawn once more and left on its line; a plain line is printed unless
        the last one already showed this step (nothing when the run failed: its error line says why)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._saved is not None:
                sys.stdout, sys.stderr = self._saved
            if self.step is None:
                return
            if self.tty:
                if completed or self._drawn:
                    self._draw(self.clock())
                if self._drawn:
                    self._raw("\n")
                    self._drawn = False
            elif completed and self._plain_step != self.step:
                self._plain(self.clock())

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, kind, *_: Any) -> None:
        self.close(completed=kind is None)


def _can_encode(stream: TextIO, text: str) -> bool:
    try:
        text.encode(getattr(stream, "encoding", None) or "ascii")
        return True
    except (UnicodeEncodeError, LookupError):
        return False


class MetricsTail:
    """Follows a Ray Train run's metrics.jsonl (rank 0 writes it, on storage the driver sees too) in a thread and
    feeds the bar: each session record (a start or restart of the workers) sets the total and the samples per
    step, each step record the step and loss, each evaluation record the test accuracy. Only what this job
    appends counts (the file may hold earlier sessions' records)."""

    def __init__(self, path: str, bar: ProgressBar, poll_s: float = 0.25):
        self.path, self.bar, self.poll_s = path, bar, poll_s
        try:
            self._offset = os.path.getsize(path)
        except OSError:
            self._offset = 0
        self._partial = b""
        self._sessions = 0  # session records this job appended: each after the first is a restart
        self._losses: list[float] = []
        self._at: float | None = None  # time_s of the newest step record
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raydist-progress", daemon=True)

    def start(self) -> MetricsTail:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.read()

    def read(self) -> None:
        """Take in whatever complete records were appended since the last read."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        latest: dict[str, Any] = {}
        for raw in lines:
            try:
                r = json.loads(raw)
            except ValueError:
                continue
            if "session_at_step" in r and r.get("from_peer"):
                continue  # a heal's replacement rank 0: it takes the step it goes on from in its first step
            if "session_at_step" in r:
                self._flush(latest)
                latest = {}
                self._at = None
                self._sessions += 1
                if self._sessions > 1:
                    at = r["session_at_step"]
                    self.bar.say(
                        f"the worker group restarted with {r.get('world_size', '?')} workers, "
                        + (f"from the checkpoint at step {at}" if at else "from the start")
                    )
                self.bar.new_session(r["session_at_step"], r.get("total_steps"), r.get("samples_per_step"))
            elif "eval_at_step" in r:
                latest["test_accuracy"] = r.get("test_accuracy")
            elif "step" in r:
                latest["step"] = r["step"]
                self._at = r.get("time_s")
                if isinstance(r.get("loss"), (int, float)):
                    self._losses.append(r["loss"])
        self._flush(latest)

    def _flush(self, latest: dict[str, Any]) -> None:
        if "step" not in latest and "test_accuracy" not in latest:
            return
        step = latest.get("step", self.bar.step or 0)
        loss = sum(self._losses) / len(self._losses) if self._losses else None
        self._losses = []
        self.bar.update(step, loss=loss, test_accuracy=latest.get("test_accuracy"), at=self._at)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.read()


def start_line(label: str, run_dir: str) -> str:
    return f"{PREFIX}{label}: run directory {run_dir} (checkpoints, metrics.jsonl, summary.json)"


# ---- Ray Train's own lines ----------------------------------------------------------------------------------


def ray_train_log_level(verbose: bool) -> str:
    """For ray.train.RunConfig(logging_config=LoggingConfig(log_level=...)): Ray's knob for its `ray.train`
    loggers on the console (the controller's worker-group lines, the workers' checkpoint lines). Ray's system
    log files keep every level either way."""
    return "INFO" if verbose else "WARNING"


class _RayTrainInfo(logging.Filter):
    """Drops records below WARNING that Ray Train's own modules emit. Ray Train 2.60 logs "Reporting training
    result ..." through a logger named after its source file (not `ray.train.*`), which its log level misses."""

    def __init__(self) -> None:
        super().__init__()
        import ray.train

        self._root = os.path.dirname(os.path.abspath(ray.train.__file__))

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return not _peer_lost(record)
        ours = record.name.startswith("ray.train") or os.path.abspath(record.pathname).startswith(self._root)
        return not ours


# What a surviving worker's collective raises when a peer process died (gloo's TCP pair, NCCL's abort, torch's
# wrapper): Ray Train restarts the group or ends the run, and the driver says so in one line (MetricsTail, or the
# run's failure line). A strategy adds what its own machinery raises then (StrategySpec.quiet_signs).
_PEER_LOST_SIGNS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "DistBackendError",
    "NCCL communicator was aborted",
)


@functools.cache
def peer_lost_signs() -> tuple[str, ...]:
    from raydist import registry

    return _PEER_LOST_SIGNS + tuple(sign for spec in registry.STRATEGIES.values() for sign in spec.quiet_signs)


def _peer_lost(record: logging.LogRecord) -> bool:
    """Ray Train's "Error in training function" traceback of a survivor whose peer died (kept in the log files)."""
    message = record.getMessage()
    return message.startswith("Error in training function") and any(s in message for s in peer_lost_signs())


class _ControllerErrors(logging.Filter):
    """Drops Ray Train's controller's "Error in control loop iteration" traceback: a worker group it could not place
    or replace (a lost node), which it retries or fails the run on. The driver says in one line what happens
    next (it starts the run again, or names the dead node and exits 1)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Error in control loop iteration")


class _OnFirstRecord(logging.Filter):
    """On the controller's logger: puts `_ControllerErrors` on the console handlers at its first record (they do not
    exist yet where this is installed), and lets every record through, to the log files too."""

    def filter(self, record: logging.LogRecord) -> bool:
        quiet_ray_train_logs(_ControllerErrors())
        return True


from raydist.private_api import CONTROLLER_LOGGER  # noqa: E402


def quiet_controller_logs() -> None:
    """In Ray Train's controller: its control-loop tracebacks stay in Ray's log files, off the console."""
    logger = logging.getLogger(CONTROLLER_LOGGER)
    if not any(isinstance(f, _OnFirstRecord) for f in logger.filters):
        logger.addFilter(_OnFirstRecord())


def quiet_ray_train_logs(filt: logging.Filter | None = None) -> int:
    """In a Ray Train worker: put the filter on the console handlers Ray Train configured (file handlers are
    left alone, so Ray's log files keep everything). Returns how many handlers it filters."""
    filt = filt or _RayTrainInfo()
    count = 0
    for logger in (logging.getLogger(), logging.getLogger("ray"), logging.getLogger("ray.train")):
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                if not any(isinstance(f, type(filt)) for f in handler.filters):
                    handler.addFilter(filt)
                    count += 1
    return count
