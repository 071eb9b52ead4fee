"""The console's progress bar and Ray Train's quieted lines, without Ray: raydist/observability/console.py."""

from __future__ import annotations

import io
import json
import logging
import re
import sys

from raydist.observability import console
from raydist.observability.console import MetricsTail, ProgressBar


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_are_bounded_and_say_step_loss_accuracy_rate_and_eta():
    out, clock = io.StringIO(), Clock()
    bar = ProgressBar("sync", 1000, samples_per_step=64, stream=out, tty=False, clock=clock)
    for step in range(1, 1001):
        clock.t = step * 0.02
        bar.update(step, loss=1.0 / step, test_accuracy=0.5 + step / 4000 if step % 50 == 0 else None)
    bar.close()
    lines = out.getvalue().splitlines()
    # the first step, each tenth (100, 200, ..., 1000), and no second line for the last step at close
    assert len(lines) == 11, lines
    assert lines[0].startswith("[raydist] sync: step 1/1000 (0%) loss 1")
    assert lines[1].startswith(
        "[raydist] sync: step 100/1000 (10%) loss 0.01 test_accuracy 0.525 3200 samples/s ETA 0:18"
    )
    assert lines[-1].startswith("[raydist] sync: step 1000/1000 (100%)") and "ETA" not in lines[-1]


def test_plain_close_adds_the_final_step_only_when_not_shown_and_nothing_after_a_failure():
    out = io.StringIO()
    bar = ProgressBar("async", 100, stream=out, tty=False, clock=Clock())
    bar.update(1)
    bar.update(35, loss=0.5, extra={"staleness": "1.5"})
    bar.update(37)
    bar.close()
    assert out.getvalue().splitlines()[1:] == [
        "[raydist] async: step 35/100 (35%) loss 0.5 staleness 1.5",
        "[raydist] async: step 37/100 (37%) loss 0.5 staleness 1.5",
    ]
    failed = io.StringIO()
    bar = ProgressBar("sync", 100, stream=failed, tty=False, clock=Clock())
    bar.update(1)
    bar.update(5)  # within the first tenth: no line
    bar.close(completed=False)
    assert failed.getvalue().splitlines() == ["[raydist] sync: step 1/100 (1%)"]


def test_terminal_bar_redraws_in_place_and_other_output_clears_it(monkeypatch):
    term, clock = Terminal(), Clock()
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(sys, "stderr", term)
    bar = ProgressBar("sync", 200, samples_per_step=10, stream=term, clock=clock)
    assert sys.stderr is not term  # guarded while the bar is up
    for step in range(1, 201):
        clock.t = step * 0.05
        bar.update(step, loss=0.25, test_accuracy=0.9)
        if step == 100:
            print("(RayTrainWorker pid=1) [raydist] a worker's line", file=sys.stderr)
    bar.close()
    assert sys.stderr is term  # given back
    text = term.getvalue()
    assert "\n" not in text.split("a worker's line\n")[0]  # no plain lines: the bar was redrawn with \r
    assert text.count("\r") > 20 and text.count("\n") == 2  # the worker's line, and the bar left at the end
    assert "\r\x1b[K(RayTrainWorker pid=1)" in text  # cleared before the other line
    last = text.rstrip("\n").rsplit("\r", 1)[-1]
    assert "200/200 100%" in last and "loss 0.25" in last and "acc 0.9" in last and "200 samples/s" in last
    mid = [seg for seg in text.split("\r") if re.search(r" 5\d/200 ", seg)][0]  # redrawn every 0.2 s: 4 or 5 steps
    assert "ETA 0:07" in mid and "|" in mid


def test_the_bar_fits_the_terminal():
    bar = ProgressBar("local_sgd", 10_000, stream=Terminal(), tty=True, clock=Clock())
    bar.update(5, loss=1.23456, test_accuracy=0.5, extra={"x": "y" * 200})
    assert len(bar.bar_line(width=80)) == 79
    bar.close()


def test_metrics_tail_follows_only_what_is_appended(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 999, "loss": 9.0}) + "\n")  # an earlier session's
    out, clock = io.StringIO(), Clock()
    bar = ProgressBar("sync", stream=out, tty=False, clock=clock)
    tail = MetricsTail(str(path), bar)
    tail.read()
    assert bar.step is None
    with path.open("a") as f:
        f.write(json.dumps({"session_at_step": 0, "total_steps": 20, "samples_per_step": 64}) + "\n")
        for step in range(1, 3):
            f.write(json.dumps({"step": step, "loss": float(step), "time_s": float(step)}) + "\n")
        f.write('{"step": 3, "lo')  # half a line: read once it ends
    clock.t = 1.0
    tail.read()
    assert (bar.total, bar.step, bar.loss) == (20, 2, 1.5)
    with path.open("a") as f:
        f.write('ss": 3.0, "time_s": 3.0}\n' + json.dumps({"eval_at_step": 3, "test_accuracy": 0.75}) + "\n")
    clock.t = 2.0
    tail.read()
    assert (bar.step, bar.loss, bar.test_accuracy) == (3, 3.0, 0.75)
    tail.stop()
    bar.close()
    assert out.getvalue().splitlines() == [
        "[raydist] sync: step 2/20 (10%) loss 1.5",  # the first line; the rate needs a second of steps
        "[raydist] sync: step 3/20 (15%) loss 3 test_accuracy 0.75 64 samples/s ETA 0:17",  # at close
    ]


def test_a_restart_gets_one_line_and_a_heal_replacement_none(tmp_path):
    path = tmp_path / "metrics.jsonl"
    out = io.StringIO()
    bar = ProgressBar("sync", stream=out, tty=False, clock=Clock())
    tail = MetricsTail(str(path), bar)
    with path.open("a") as f:
        for record in (
            {"session_at_step": 0, "total_steps": 100, "world_size": 2},
            {"step": 25, "loss": 1.0},
            {"session_at_step": 20, "total_steps": 100, "world_size": 2},
            {"step": 30, "loss": 1.0},
            {"session_at_step": 0, "total_steps": 100, "world_size": 2, "from_peer": True},
            {"step": 31, "loss": 1.0},
        ):
            f.write(json.dumps(record) + "\n")
    tail.read()
    restarts = [ln for ln in out.getvalue().splitlines() if "restarted" in ln]
    assert restarts == ["[raydist] sync: the worker group restarted with 2 workers, from the checkpoint at step 20"]
    assert bar.step == 31  # the replacement's session record did not send the bar back to step 0


class Collect(logging.Handler):
    """Stands for Ray Train's file handlers (not StreamHandlers: the filter leaves them alone)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_ray_train_info_lines_leave_the_console_but_not_the_log_files():
    """The filter quiet_ray_train_logs puts on the console handlers in a worker (the log files keep everything);
    run.verbose leaves it off (`train_worker`) and sets Ray Train's own log level to INFO."""
    import ray.train.v2._internal.execution.context as ctx_module

    shown, kept = io.StringIO(), Collect()
    root = logging.getLogger()
    console_handler = logging.StreamHandler(shown)
    old_level = root.level
    ray_logger = logging.getLogger("ray")  # Ray's own console handler; it does not propagate to the root
    root.addHandler(console_handler)
    root.addHandler(kept)
    ray_logger.addHandler(console_handler)
    ray_logger.addHandler(kept)
    root.setLevel(logging.INFO)
    try:
        assert console.quiet_ray_train_logs() >= 1
        by_path = logging.getLogger(ctx_module.__file__)  # Ray Train 2.60 names this logger after its file
        by_path.handle(
            by_path.makeRecord(
                by_path.name, logging.INFO, ctx_module.__file__, 1, "Reporting training result 1: ...", None, None
            )
        )
        logging.getLogger("raydist.something").info("[raydist] ours")
        by_path.warning("a warning stays")
        util = logging.getLogger("ray.train.v2._internal.util")  # a survivor's collective after its peer died
        util.error(
            "Error in training function:\nTraceback ...\nRuntimeError: [gloo] Read error: Connection reset by peer"
        )
        util.error("Error in training function:\nTraceback ...\nValueError: the user's own bug stays")
    finally:
        for logger in (root, ray_logger):
            logger.removeHandler(console_handler)
            logger.removeHandler(kept)
        root.setLevel(old_level)
    assert "Reporting training result" not in shown.getvalue()
    assert "[raydist] ours" in shown.getvalue() and "a warning stays" in shown.getvalue()
    assert "Connection reset by peer" not in shown.getvalue() and "the user's own bug stays" in shown.getvalue()
    assert "Reporting training result 1: ..." in kept.messages
    assert any("Connection reset by peer" in m for m in kept.messages)
    assert console.ray_train_log_level(False) == "WARNING" and console.ray_train_log_level(True) == "INFO"


def test_the_controllers_placement_tracebacks_leave_the_console_but_not_the_log_files():
    """quiet_controller_logs, as unpickling raydist's torch backend runs it in Ray Train's controller: before Ray
    Train has made its console handlers, so the filter goes on them at the controller logger's first record."""
    import pickle

    from raydist.engines.raytrain_backend import QuietTorchConfig

    controller = logging.getLogger(console.CONTROLLER_LOGGER)
    ray_train = logging.getLogger("ray.train")
    shown, kept = io.StringIO(), Collect()
    pickle.loads(pickle.dumps(QuietTorchConfig(backend="gloo").backend_cls()))  # what the controller does
    handler = logging.StreamHandler(shown)  # made after: as Ray Train's LoggingManager does at the controller's start
    ray_train.addHandler(handler)
    ray_train.addHandler(kept)
    try:
        controller.error("Error in control loop iteration: The worker group startup timed out\nTraceback ...")
        controller.warning("a warning stays")
    finally:
        ray_train.removeHandler(handler)
        ray_train.removeHandler(kept)
        controller.filters.clear()
    assert "Error in control loop" not in shown.getvalue() and "a warning stays" in shown.getvalue()
    assert any(m.startswith("Error in control loop iteration") for m in kept.messages)


def test_verbose_flag_sets_the_config_key():
    from raydist.job import parse_job_args

    assert parse_job_args("sync", []).run.verbose is False
    assert parse_job_args("sync", ["--verbose"]).run.verbose is True
    assert parse_job_args("sync", ["--set", "run.verbose=true"]).run.verbose is True


def test_a_survivors_traceback_is_kept_off_the_console_when_a_peer_died_including_a_strategys_own_signs():
    """Ray Train's "Error in training function" of a worker whose peer died goes to the log files only: the
    collectives' signs, and those a strategy declares for its own machinery (heal's lighthouse, in its registry
    entry); any other error reaches the console."""

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("ray.train", logging.ERROR, __file__, 1, message, None, None)

    assert console._peer_lost(record("Error in training function:\nRuntimeError: Connection reset by peer"))
    assert console._peer_lost(record("Error in training function:\nRuntimeError: lighthouse quorum failed"))
    assert not console._peer_lost(record("Error in training function:\nValueError: your own bug"))
    assert not console._peer_lost(record("lighthouse quorum failed"))  # not a training function's traceback
