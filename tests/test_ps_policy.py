"""The async PS driver's restart policy: what follows the end of an attempt (pure, fast)."""

from __future__ import annotations

import pytest

from raydist.strategies.async_ps.policy import Decision, Event, Kind, Outcome, decide

DEATH = "worker 0 died (its worker process has died) on node vm"


def died(step: int = 76) -> Event:
    return Event(Outcome.DIED, step, DEATH)


def test_a_finished_attempt_goes_on_to_its_summary():
    decision = decide(Event(Outcome.FINISHED, 120), restarts=2, max_failures=3)
    assert decision.kind is Kind.CONTINUE and decision.restarts == 2


@pytest.mark.parametrize("outcome", [Outcome.DIED, Outcome.HUNG])
def test_a_dead_or_hung_actor_is_restarted_within_max_failures(outcome):
    decision = decide(Event(outcome, 65, DEATH), restarts=0, max_failures=3)
    assert decision == Decision(Kind.RESTART, 1, "failure 1 of 3")
    assert decide(Event(outcome, 65, DEATH), restarts=2, max_failures=3) == Decision(Kind.RESTART, 3, "failure 3 of 3")


def test_one_failure_more_than_max_failures_fails_the_run_with_one_line():
    decision = decide(died(), restarts=0, max_failures=0)
    assert decision.kind is Kind.RAISE and decision.restarts == 0
    assert decision.reason == (
        f"training failed: {DEATH} at step 76: failure 1, more than scaling.max_failures=0 allows"
    )
    assert decide(died(), restarts=3, max_failures=3).kind is Kind.RAISE


def test_max_failures_minus_1_restarts_without_end():
    decision = decide(died(), restarts=41, max_failures=-1)
    assert decision == Decision(Kind.RESTART, 42, "failure 42 of unlimited")


@pytest.mark.parametrize("outcome", [Outcome.INIT_FAILED, Outcome.ERROR])
def test_a_constructor_that_raised_or_the_run_s_own_error_is_not_restarted(outcome):
    decision = decide(Event(outcome, 3, "ValueError: bad model"), restarts=0, max_failures=5)
    assert decision == Decision(Kind.RAISE, 0, "training failed: ValueError: bad model")


def test_restarts_count_up_to_the_limit_then_the_run_fails():
    restarts, kinds = 0, []
    for step in (10, 20, 30, 40):
        decision = decide(died(step), restarts, max_failures=2)
        kinds.append(decision.kind)
        restarts = decision.restarts
    assert kinds == [Kind.RESTART, Kind.RESTART, Kind.RAISE, Kind.RAISE] and restarts == 2


def test_the_event_names_the_actor_and_the_step():
    assert Event(Outcome.HUNG, 54, "server shard 0 stopped answering (no answer for 5 s)").describe() == (
        "server shard 0 stopped answering (no answer for 5 s) at step 54"
    )


def test_the_driver_s_states_move_only_as_the_table_says():
    from raydist.strategies.async_ps.run_state import AFTER, Lifecycle
    from raydist.strategies.async_ps.run_state import RunState as S

    life = Lifecycle()
    # A first start that dies, a restart that trains to the end: each decision names the next state.
    for state in (
        S.SCHEDULING,
        S.RUNNING,
        AFTER[Kind.RESTART],
        S.SCHEDULING,
        S.RUNNING,
        S.FINISHING,
        AFTER[Kind.CONTINUE],
    ):
        assert life.to(state) is state
    with pytest.raises(RuntimeError, match="no move from finished to running"):
        life.to(S.RUNNING)
    life.fail()  # an interrupt after the summary leaves the session finished
    assert life.state is S.FINISHED
    with pytest.raises(RuntimeError, match="no move from initializing to finished"):
        Lifecycle().to(S.FINISHED)  # only the end of a start that trained to its end finishes the session


@pytest.mark.parametrize("at", ["scheduling", "running", "finishing"])
def test_a_raise_decision_or_an_error_ends_the_session_errored_from_any_state_of_a_start(at):
    from raydist.strategies.async_ps.run_state import AFTER, TRANSITIONS, Lifecycle
    from raydist.strategies.async_ps.run_state import RunState as S

    life = Lifecycle(S(at))
    assert life.to(AFTER[Kind.RAISE]) is S.ERRORED
    life.fail()  # the error that RAISE becomes passes the handler once more
    assert life.state is S.ERRORED and not TRANSITIONS[S.ERRORED]
