"""raydist.train.schedule: when a run reports, evaluates, checkpoints, checks for desync and polls for a stop (pure, fast)."""

from __future__ import annotations

from dataclasses import dataclass

from raydist.train.schedule import STOP_POLL_S, Cadence, Every, Schedule


@dataclass
class FakeClock:
    now: float = 0.0

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def run_loop(
    cadence: Cadence, total: int, *, per_epoch: int = 10**9, sync_every: int = 1, start: int = 0, step_s: float = 0.01
) -> dict[str, list[int]]:
    """Steps start+1..total as the training loop takes them: the schedule asked only at sync points (every
    `sync_every` steps and the last), each due acted on and recorded. Returns the steps each thing happened at."""
    clock = FakeClock()
    schedule = Schedule.starting(cadence, start, clock.now, epochs=start // per_epoch)
    seen: dict[str, list[int]] = {"report": [], "evaluate": [], "checkpoint": [], "desync": [], "poll": []}
    for step in range(start + 1, total + 1):
        clock.advance(step_s)
        final = step == total
        if step % sync_every and not final:
            continue
        due = schedule.due(step, clock.now, epochs=step // per_epoch, final=final)
        if due.stop_poll:
            seen["poll"].append(step)
            schedule.polled(clock.now)
        if due.desync_check:
            seen["desync"].append(step)
            schedule.checked_desync(step)
        if due.evaluate:
            seen["evaluate"].append(step)
            schedule.evaluated(step // per_epoch)
        if due.checkpoint:
            seen["checkpoint"].append(step)
            schedule.checkpointed(step)
        if due.reports:
            seen["report"].append(step)
            schedule.reported(clock.now)
    return seen


def test_a_checkpoint_every_n_steps_and_at_the_last_step():
    seen = run_loop(Cadence(report_every_s=60, checkpoint=Every(10)), total=35)
    assert seen["checkpoint"] == [10, 20, 30, 35]


def test_checkpoints_stay_on_the_multiples_when_sync_points_skip_them():
    # local SGD syncs every 4 steps: a checkpoint at the first sync point at or after each multiple of 10
    seen = run_loop(Cadence(report_every_s=60, checkpoint=Every(10)), total=42, sync_every=4)
    assert seen["checkpoint"] == [12, 20, 32, 40, 42]


def test_a_resumed_run_does_not_checkpoint_where_it_resumed_and_keeps_the_multiples():
    seen = run_loop(Cadence(report_every_s=60, checkpoint=Every(10)), total=30, start=13)
    assert seen["checkpoint"] == [20, 30]


def test_checkpoint_every_0_means_at_each_epoch_end():
    seen = run_loop(Cadence(report_every_s=60, checkpoint=Every(0)), total=25, per_epoch=10)
    assert seen["checkpoint"] == [10, 20, 25]


def test_evaluation_at_each_epoch_end_and_at_the_last_step():
    seen = run_loop(Cadence(report_every_s=60, checkpoint=Every(7)), total=25, per_epoch=10)
    assert seen["evaluate"] == [10, 20, 25]
    assert seen["checkpoint"] == [7, 14, 21, 25]


def test_an_epoch_that_ends_between_sync_points_is_evaluated_at_the_next_one():
    seen = run_loop(Cadence(report_every_s=60), total=30, per_epoch=10, sync_every=4)
    assert seen["evaluate"] == [12, 20, 30]


def test_every_checkpoint_and_evaluation_is_reported_and_so_is_progress_every_report_every_s():
    seen = run_loop(Cadence(report_every_s=1.0, checkpoint=Every(6)), total=14, step_s=0.25)
    assert seen["report"] == [4, 6, 10, 12, 14]


def test_the_stop_is_polled_about_every_stop_poll_s_and_not_at_the_last_step():
    step_s = 0.3
    seen = run_loop(Cadence(report_every_s=60), total=20, step_s=step_s)
    times = [s * step_s for s in seen["poll"]]
    assert seen["poll"] and seen["poll"][-1] < 20
    gaps = [b - a for a, b in zip([0.0, *times], times)]
    assert all(STOP_POLL_S - 1e-9 <= g < STOP_POLL_S + step_s for g in gaps), gaps
    assert run_loop(Cadence(report_every_s=60), total=20, step_s=0.25)["poll"] == [4, 8, 12, 16]


def test_no_poll_before_stop_poll_s_has_passed():
    schedule = Schedule.starting(Cadence(report_every_s=60), step=0, now=5.0)
    assert not schedule.due(1, 5.0 + STOP_POLL_S / 2, epochs=0).stop_poll
    assert schedule.due(2, 5.0 + STOP_POLL_S, epochs=0).stop_poll


def test_desync_checks_every_n_steps_and_0_means_never():
    assert run_loop(Cadence(report_every_s=60, desync=Every(3)), total=10)["desync"] == [3, 6, 9]
    assert run_loop(Cadence(report_every_s=60, desync=Every(3)), total=10, sync_every=2)["desync"] == [4, 6, 10]
    assert run_loop(Cadence(report_every_s=60, desync=Every(0)), total=10)["desync"] == []


def test_the_loop_can_ask_one_step_ahead_whether_a_desync_check_is_due():
    schedule = Schedule.starting(Cadence(report_every_s=60, desync=Every(5)), step=0, now=0.0)
    assert [s for s in range(1, 16) if schedule.desync_due(s)] == list(range(5, 16))  # until one is recorded
    schedule.checked_desync(5)
    assert [s for s in range(6, 16) if schedule.desync_due(s)] == list(range(10, 16))


def test_a_stop_makes_the_step_the_last_evaluate_and_checkpoint_there():
    schedule = Schedule.starting(Cadence(report_every_s=60, checkpoint=Every(100)), step=0, now=0.0)
    due = schedule.due(7, 1.5, epochs=0)
    assert not (due.evaluate or due.checkpoint or due.final) and due.stop_poll
    ending = due.ending()
    assert ending.evaluate and ending.checkpoint and ending.final and ending.reports and not ending.stop_poll


def test_since_last_counts_from_the_last_checkpoint_and_retries_one_that_did_not_happen():
    # the PS driver: steps arrive in uneven jumps; a checkpoint the shards could not agree on is not recorded
    schedule = Schedule.starting(Cadence(report_every_s=60, checkpoint=Every(50, since_last=True)), step=0, now=0.0)
    taken = []
    for i, step in enumerate([20, 49, 53, 61, 90, 102, 104, 130, 160]):
        if schedule.due(step, float(i), epochs=0).checkpoint:
            if step == 53:
                continue  # the shards disagreed: tried again at the next poll
            taken.append(step)
            schedule.checkpointed(step)
    assert taken == [61, 130]


def test_every_crossing_rule_evaluates_the_ps_by_epochs_of_steps():
    per_epoch = 40
    schedule = Schedule.starting(Cadence(report_every_s=60), step=0, now=0.0, epochs=0)
    evaluated = []
    for step in [15, 38, 45, 79, 81, 119, 170]:
        if schedule.due(step, 0.0, epochs=step // per_epoch).evaluate:
            evaluated.append(step)
            schedule.evaluated(step // per_epoch)
    assert evaluated == [45, 81, 170]
