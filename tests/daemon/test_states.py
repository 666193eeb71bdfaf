"""The daemon's life cycle as a table: the moves it allows, the one it refuses, and
what the health and stats ops show for each state."""

from __future__ import annotations

import threading

import pytest

from edged.daemon.lifecycle import REPORTED_STATES, Lifecycle, State


def test_a_reload_serves_throughout_and_a_stop_drains() -> None:
    life = Lifecycle()
    assert (life.state, life.reported, life.open) == (State.STARTING, "starting", False)
    life.move(State.SERVING)
    life.move(State.RELOADING)
    assert (life.reported, life.open) == ("serving", True)
    life.move(State.SERVING)
    life.move(State.DRAINING)
    assert (life.reported, life.open, life.stopping) == ("draining", False, True)


def test_a_stop_before_serving_still_reports_starting() -> None:
    life = Lifecycle()
    life.move(State.STOPPING)
    assert (life.reported, life.open, life.stopping) == ("starting", False, True)


def test_a_move_the_table_does_not_list_raises() -> None:
    life = Lifecycle()
    with pytest.raises(RuntimeError, match="cannot go from starting to draining"):
        life.move(State.DRAINING)
    assert life.state is State.STARTING


def test_the_reported_states_are_protocol_v1s_three() -> None:
    assert REPORTED_STATES == ("starting", "serving", "draining")


def test_only_the_thread_that_steers_may_move_the_state() -> None:
    life = Lifecycle()
    failures: list[BaseException] = []

    def a_loop() -> None:
        try:
            life.move(State.SERVING)
        except RuntimeError as exc:
            failures.append(exc)

    thread = threading.Thread(target=a_loop, name="serve-realtime")
    thread.start()
    thread.join()
    message = "the daemon's life is steered by its own thread only, not by 'serve-realtime'"
    assert [str(exc) for exc in failures] == [message]
    assert life.state is State.STARTING
    life.move(State.SERVING)  # its own thread still may
