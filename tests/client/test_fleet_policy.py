"""edged.client.fleet's decisions without sockets: a call settles once, hedges after the running
p95, and gives up at once when every daemon is set aside past its end."""

from __future__ import annotations

from edged.client.call import Call
from edged.client.fleet import HEDGE_MIN_SAMPLES, Fleet
from edged.wire.codec import Reply, Status


def recorder() -> tuple[list[tuple[int, float | None]], object]:
    sent: list[tuple[int, float | None]] = []

    def send(index: int, deadline_ms: float | None) -> int:
        sent.append((index, deadline_ms))
        return len(sent)  # request ids 1, 2, ...

    return sent, send


def reply(request_id: int, status: Status = Status.OK, **header: object) -> Reply:
    return Reply(request_id, status, {"status": status.value, **header})


def test_a_call_settles_once_and_a_second_reply_is_refused_as_late() -> None:
    fleet = Fleet(["a", "b"], hedge=True, hedge_after_ms=10)
    sent, send = recorder()
    call = Call(fleet, "m", None, 1000, started=0.0)
    call.advance(0.0, send)
    call.advance(10.0, send)  # the hedge
    assert [index for index, _ in sent] == [0, 1]
    first, second = reply(2), reply(1)
    assert call.on_reply(2, first, 12.0, send) and call.done and call.reply is first
    assert not call.on_reply(1, second, 13.0, send)  # both replies came in one read: the loser is late
    assert call.reply is first
    assert (fleet.counters[1].hedge_won, fleet.counters[0].ok) == (1, 0)


def test_the_hedge_delay_is_the_running_p95_of_the_model_once_known() -> None:
    fleet = Fleet(["a", "b"], hedge=True)
    assert fleet.hedge_delay_ms("m") is None  # nothing observed: no hedging yet
    for ms in range(1, HEDGE_MIN_SAMPLES + 1):
        fleet.latencies.observe("m", float(ms))
    assert fleet.hedge_delay_ms("m") == 20.0  # the 95th of 1..20 ms
    assert Fleet(["a"], hedge=True).hedge_delay_ms("m") is None  # one daemon: nobody to hedge to


def test_every_daemon_set_aside_past_the_end_settles_with_the_refusal_at_once() -> None:
    fleet = Fleet(["a", "b"])
    sent, send = recorder()
    call = Call(fleet, "m", 100.0, 1000, started=0.0)
    call.advance(0.0, send)
    call.on_reply(1, shed := reply(1, Status.OVERLOADED, retry_after_ms=5000.0), 1.0, send)
    call.on_reply(2, reply(2, Status.OVERLOADED, retry_after_ms=5000.0), 2.0, send)
    assert call.done and call.reply is not shed and call.reply.status is Status.OVERLOADED  # the last one
    assert sent == [(0, 100.0), (1, 99.0)]  # the retry carried what was left of the deadline
    later = Call(fleet, "m", None, 1000, started=3.0)
    later.advance(3.0, send)
    # Nothing sent: both are set aside past its end; it settles with a refusal they gave.
    assert later.done and later.reply is not None and later.reply.status is Status.OVERLOADED and len(sent) == 2


def test_a_slow_daemon_gets_no_calls_until_its_estimate_decays() -> None:
    fleet = Fleet(["a", "b", "c"])
    for index, rtt_ms in ((0, 30.0), (1, 1.0), (2, 1.2)):
        fleet.observe_rtt(index, 0.0, rtt_ms)
    assert {fleet.pick(1.0, set()) for _ in range(30)} == {1, 2}  # b and c share; a, 25x slower, none
    assert 0 in {fleet.pick(4000.0, set()) for _ in range(3)}  # seconds later: a gets another look


def test_the_first_copy_carries_the_callers_deadline_as_given_even_one_the_daemon_refuses() -> None:
    sent, send = recorder()
    call = Call(Fleet(["a", "b"]), "m", 0.0, 1000, started=5.0)
    call.advance(5.0, send)  # deadline_ms = 0 is for the daemon to refuse (INVALID_ARGUMENT), not for the client
    assert sent == [(0, 0.0)] and not call.done


def test_a_daemon_that_leaves_takes_no_new_copy_and_its_copy_in_flight_settles_the_call_once() -> None:
    fleet = Fleet(["a", "b"], followed=True)
    sent, send = recorder()
    call = Call(fleet, "m", None, 1000, started=0.0)
    call.advance(0.0, send)
    assert sent == [(0, None)]  # the copy is at a
    assert fleet.follow(["b"]) == [] and fleet.members() == ["b"]  # a leaves the records
    assert fleet.settled_leavers() == []  # its copy is in flight: its socket stays open
    assert fleet.pick(1.0, set()) == 1 and fleet.pick(1.0, set()) == 1  # new copies go to b alone
    answer = reply(1)
    assert call.on_reply(1, answer, 2.0, send) and call.done and call.reply is answer
    assert not call.on_reply(1, reply(1), 3.0, send)  # a second reply to it is late: settled once
    assert fleet.settled_leavers() == [0]  # now a's socket may close, and its slot is free
    assert fleet.follow(["b", "c"]) == [0] and fleet.endpoints == ["c", "b"]  # c takes the free slot
    assert fleet.counters[0].sent == 0  # nothing of a's carried over


def test_a_daemon_back_in_the_records_before_its_socket_closed_keeps_it() -> None:
    fleet = Fleet(["a", "b"], followed=True)
    fleet.sent(0)
    fleet.follow(["b"])
    assert fleet.follow(["a", "b"]) == [] and fleet.members() == ["a", "b"]  # no second socket for a
    fleet.ended(0)
    assert fleet.settled_leavers() == []


def test_a_followed_name_with_no_address_yet_waits_for_one_rather_than_failing_at_once() -> None:
    fleet = Fleet([], followed=True)
    looked_up: list[bool] = []
    fleet.on_no_daemon = lambda: looked_up.append(True)
    sent, send = recorder()
    call = Call(fleet, "m", None, 1000, started=0.0)
    call.advance(0.0, send)
    assert not call.done and looked_up and call.wake_at() == 5.0  # looks again in SEND_POLL_MS
    fleet.follow(["a"])
    call.advance(5.0, send)
    assert sent == [(0, None)]


def test_copies_left_unanswered_are_forgotten_once_past_their_time() -> None:
    """A daemon that never answers: each call settled without its copy's reply left it
    remembered (so that a reply without an id goes to no later call), and for good."""
    fleet = Fleet(["ipc:///tmp/a.sock"])
    for request_id in range(1000):
        fleet.leave_unanswered({request_id: 0}, until=float(request_id) + 10, now=float(request_id))
    assert len(fleet._unanswered[0]) <= 11
    assert fleet.owner(None, 0, now=2000.0, awaited=lambda: [7]) == 7  # none left by then: the one awaited


def test_a_reply_without_an_id_after_a_timeout_is_not_the_next_calls() -> None:
    """A call that timed out left its copy remembered until its own end, which had passed:
    the copy's refusal, come late without an id, was taken by the next call on that daemon."""
    fleet = Fleet(["a"])
    _, send = recorder()
    timed_out = Call(fleet, "m", None, 100, started=0.0)
    timed_out.advance(0.0, send)
    timed_out.advance(100.0, send)
    assert timed_out.done and timed_out.reply is None
    following = Call(fleet, "m", None, 100, started=101.0)
    following.advance(101.0, send)
    # The late refusal of the first copy, its id unread: none of the following call's.
    assert fleet.owner(None, 0, 102.0, awaited=lambda: list(following.copies)) is None
