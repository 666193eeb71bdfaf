"""What a lane's workers hold when the watchdog or a stop takes over: a second hung call, a
re-timing, a job waiting its turn behind a higher class. In-process, on the real ONNX
Runtime backend, whose calls the test holds at gates (support.backends.KeyedGates)."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

import numpy as np
import pytest
from support import REPO_ROOT, decoded, raised_on_thread
from support.backends import KeyedGates, KeyedRunner
from support.transport import Replies

from edged.config.classes import ClassConfig
from edged.daemon.stopping import stop_lanes
from edged.models.repository import ModelEntry, discover
from edged.serve.admission import Shed
from edged.serve.lanes.batching import Job
from edged.serve.lanes.lane import Lane
from edged.serve.lanes.precedence import Precedence
from edged.wire.codec import Status, decode_reply, encode_request

REPLIES = Replies()


@pytest.fixture(scope="module")
def models() -> dict[str, ModelEntry]:
    return {m.name: m for m in discover(REPO_ROOT / "engines", "onnxruntime")}


def started(klass: ClassConfig, models: list[ModelEntry], backend: KeyedGates, **kwargs) -> Lane:
    lane = Lane(klass, models, backend, **kwargs)
    lane.start()
    lane.own()
    return lane


def job(model: ModelEntry, x: np.ndarray, route: str, cost_ns: int = 0) -> Job:
    now = time.monotonic_ns()
    inputs = {model.signature.inputs[0].name: x}
    deadline_ns = now + 60 * 10**9
    rows = model.signature.rows(inputs)
    return Job(
        REPLIES.route(route), route, model, inputs, model.signature.output_names, now, deadline_ns, cost_ns, rows=rows
    )


def led_by(key: float) -> np.ndarray:
    return np.full((1, 64), key, np.float32)


def statuses(count: int, timeout_s: float = 10) -> dict[str, Status]:
    got: dict[str, Status] = {}
    for _ in range(count):
        route, frames = REPLIES.queue.get(timeout=timeout_s)
        assert route not in got, f"request {route} answered twice"
        got[route] = decode_reply([bytes(f) for f in frames]).status
    return got


def hang_and_take_over(lane: Lane, backend: KeyedGates, key: float, route: str) -> None:
    """A request whose call hangs at `key`'s gate, answered by the watchdog; waits for the replacement."""
    lane.enqueue(job(lane.crew._models[0], led_by(key), route))
    assert backend.entered[key].wait(5)
    time.sleep(0.15)
    lane.crew.check_stuck(time.monotonic_ns())
    assert statuses(1) == {route: Status.INTERNAL}
    end = time.monotonic() + 30
    while lane.crew.health != "ok" and time.monotonic() < end:
        time.sleep(0.01)


def test_a_second_hung_call_leaves_a_worker_serving_even_where_a_thread_ident_is_reused(models):
    """Threads given up on were kept by ident, which a new thread may get once the old one
    ends: the second replacement then found itself given up on at birth and ended, the lane
    with no worker and its health "ok"."""
    backend = KeyedGates()
    lane = started(ClassConfig("t", order=0, inline_max_us=0, stuck_after_ms=100), [models["mlp-light"]], backend)
    backend.armed = True
    first_gate, second_gate = backend.gate(1.0), backend.gate(2.0)
    first = lane.crew._threads[0]
    hang_and_take_over(lane, backend, 1.0, "A")
    first_gate.set()  # its call returns, and the thread given up on ends
    first.join(5)
    hang_and_take_over(lane, backend, 2.0, "B")
    lane.enqueue(job(models["mlp-light"], led_by(0.5), "C"))
    try:
        assert statuses(1, timeout_s=5) == {"C": Status.OK}
    finally:
        second_gate.set()
        lane.crew.stop(5.0)


def test_a_settled_hung_call_no_longer_counts_as_work_in_flight(models):
    backend = KeyedGates()
    lane = started(ClassConfig("t", order=0, inline_max_us=0, stuck_after_ms=100), [models["mlp-light"]], backend)
    backend.armed = True
    gate = backend.gate(4.0)
    lane.enqueue(job(models["mlp-light"], led_by(4.0), "A", cost_ns=5_000_000))
    assert backend.entered[4.0].wait(5)
    time.sleep(0.15)
    lane.crew.check_stuck(time.monotonic_ns())
    assert statuses(1) == {"A": Status.INTERNAL}
    try:
        assert lane.backlog.work_ns == 0
        assert lane.crew.calls.progress(time.monotonic_ns(), 1.0) == (0, 0)  # before: (5 ms, 5 ms), for good
    finally:
        gate.set()
        lane.crew.stop(5.0)


def test_a_re_timing_whose_calls_each_fit_the_watchdogs_limit_is_not_taken_for_hung(models):
    """Re-timing makes several calls; watched as one, 4 of 120 ms passed a 300 ms limit and
    the worker was replaced after one request with a hopeless deadline."""
    backend = KeyedGates()
    model = models["mlp-light"]
    lane = started(ClassConfig("t", order=0, inline_max_us=0, stuck_after_ms=300), [model], backend)
    loads = backend.loads
    backend.armed, backend.delay_s = True, 0.12
    request = decoded(encode_request(1, model="mlp-light", deadline_ms=1e-3, inputs={"x": led_by(0.5)}))
    shed = lane.offer(REPLIES.route("short"), request, model, *model.signature.measure(request), time.monotonic_ns())
    assert isinstance(shed, Shed) and lane.backlog.depth == 1  # the re-timing, queued
    end = time.monotonic() + 5
    while lane.backlog.depth and time.monotonic() < end:
        lane.crew.check_stuck(time.monotonic_ns())  # as the steering thread does
        time.sleep(0.02)
    backend.delay_s = 0
    lane.crew.stop(5.0)
    assert lane.backlog.depth == 0 and backend.loads == loads, "the re-timing's worker was replaced"


def test_a_stop_answers_a_job_waiting_its_turn_behind_a_hung_higher_class(models):
    """A bulk worker took J and waits while realtime's call hangs; the stop answers that call
    INTERNAL, which ended bulk's wait: J ran after the stop had returned (its reply lost as
    the loops close), now it is answered UNAVAILABLE by the stop."""
    precedence, backend = Precedence(), KeyedGates()
    light, heavy = models["mlp-light"], models["cnn-heavy"]
    realtime = started(
        ClassConfig("rt", order=0, inline_max_us=0, stuck_after_ms=0), [light], backend, precedence=precedence
    )
    bulk_class = ClassConfig("bulk", order=1, yields=True, inline_max_us=0, max_call_ms=0)
    bulk = started(bulk_class, [heavy], backend, precedence=precedence)
    backend.armed = True
    gate = backend.gate(7.0)
    realtime.enqueue(job(light, led_by(7.0), "hung"))
    assert backend.entered[7.0].wait(5)
    bulk.enqueue(job(heavy, np.zeros((1, 3, 64, 64), np.float32), "J"))
    end = time.monotonic() + 5
    while not bulk.crew.jobs.empty() and time.monotonic() < end:
        time.sleep(0.005)
    time.sleep(0.05)  # J taken, its worker waiting its turn
    try:
        stop_lanes([realtime, bulk], time.monotonic() + 0.3)
        got: dict[str, Status] = {}
        while not REPLIES.queue.empty():
            got.update(statuses(1))
        assert got == {"hung": Status.INTERNAL, "J": Status.UNAVAILABLE}
        time.sleep(0.2)
        with pytest.raises(queue.Empty):  # nor run afterwards
            REPLIES.queue.get(timeout=0.3)
    finally:
        gate.set()


def test_a_yielding_lanes_re_timing_waits_while_a_higher_class_has_work(models):
    """It computes as a call does: run beside realtime's work it slowed that work, and priced
    the model under that contention."""
    precedence, backend = Precedence(), KeyedGates()
    light = models["mlp-light"]
    realtime = started(
        ClassConfig("rt", order=0, inline_max_us=0, stuck_after_ms=0), [light], backend, precedence=precedence
    )
    bulk = started(ClassConfig("bulk", order=1, yields=True, inline_max_us=0), [light], backend, precedence=precedence)
    backend.armed = True
    gate = backend.gate(7.0)
    realtime.enqueue(job(light, led_by(7.0), "busy"))
    assert backend.entered[7.0].wait(5)
    request = decoded(encode_request(1, model="mlp-light", deadline_ms=1e-3, inputs={"x": led_by(0.5)}))
    shed = bulk.offer(REPLIES.route("short"), request, light, *light.signature.measure(request), time.monotonic_ns())
    assert isinstance(shed, Shed)
    time.sleep(0.3)
    assert bulk.backlog.depth == 1, "the re-timing ran while realtime had work"
    gate.set()
    assert statuses(1) == {"busy": Status.OK}
    end = time.monotonic() + 5
    while bulk.backlog.depth and time.monotonic() < end:
        time.sleep(0.01)
    assert bulk.backlog.depth == 0
    realtime.crew.stop(5.0)
    bulk.crew.stop(5.0)


def steer_until(lane: Lane, done: Callable[[], bool], what: str) -> None:
    """The steering thread's housekeeping of `lane`, as it comes due, until `done`."""
    end = time.monotonic() + 15
    while not done() and time.monotonic() < end:
        now = time.monotonic_ns()
        lane.crew.check_stuck(now)
        time.sleep(max(min(lane.crew.next_check_ns(now) - now, 10**8), 0) / 1e9)
    assert done(), what


def test_a_lane_whose_new_worker_fails_to_load_answers_unavailable_and_tries_again(models):
    """The hung call still holds what a new worker needs (a GPU's memory): the load fails. The
    lane, left with no worker, answers what it is given UNAVAILABLE (before: admitted and never
    answered), says so in health, and serves again once a later try loads."""
    backend = KeyedGates()
    light = models["mlp-light"]
    lane = started(ClassConfig("t", order=0, inline_max_us=0, stuck_after_ms=100), [light], backend)
    backend.armed = True
    gate = backend.gate(3.0)
    lane.enqueue(job(light, led_by(3.0), "A"))
    assert backend.entered[3.0].wait(5)
    time.sleep(0.15)
    backend.failing = {"mlp-light"}

    try:
        steer_until(lane, lambda: not REPLIES.queue.empty(), "A answered")
        assert statuses(1) == {"A": Status.INTERNAL}
        steer_until(lane, lambda: "failed to load" in lane.crew.health, "health to say so")
        lane.enqueue(job(light, led_by(0.5), "C"))
        steer_until(lane, lambda: not REPLIES.queue.empty(), "C answered")
        assert statuses(1) == {"C": Status.UNAVAILABLE}
        assert lane.backlog.depth == 0
        backend.failing = set()
        gate.set()
        steer_until(lane, lambda: lane.crew.health == "ok", "a later try to load")
        lane.enqueue(job(light, led_by(0.5), "D"))
        assert statuses(1) == {"D": Status.OK}
    finally:
        gate.set()
        lane.crew.stop(5.0)


def test_two_workers_given_up_on_at_once_come_back_as_two(models):
    """Both replacements fail to load, then loads work again: the lane tracked one replacement,
    so one came back, health said "ok", and the lane served on half its workers for good."""
    backend = KeyedGates()
    light = models["mlp-light"]
    lane = started(ClassConfig("t", order=0, workers=2, inline_max_us=0, stuck_after_ms=100), [light], backend)
    backend.armed = True
    gates = [backend.gate(1.0), backend.gate(2.0)]
    lane.enqueue(job(light, led_by(1.0), "A"))
    lane.enqueue(job(light, led_by(2.0), "B"))
    assert backend.entered[1.0].wait(5) and backend.entered[2.0].wait(5)
    time.sleep(0.15)
    backend.failing = {"mlp-light"}
    try:
        steer_until(lane, lambda: "failed to load" in lane.crew.health, "health to say so")
        assert statuses(2) == {"A": Status.INTERNAL, "B": Status.INTERNAL}
        backend.failing = set()
        steer_until(lane, lambda: lane.crew.health == "ok", "the lane to recover")
        serving = [thread for thread in lane.crew._workers() if thread.is_alive()]
        assert len(serving) == 2, f"{len(serving)} of 2 workers serve"
    finally:
        for gate in gates:
            gate.set()
        lane.crew.stop(5.0)


def test_once_a_stop_closed_the_calls_what_a_worker_takes_is_answered_unavailable_never_run(models):
    """The stop answers the calls under way and what is queued; a worker that takes a job
    after that moment (woken by those very answers, or between two of the stop's reads)
    ran it, its reply lost as the loops closed. No call begins once the calls are closed."""
    backend = KeyedGates()
    light = models["mlp-light"]
    lane = started(ClassConfig("t", order=0, inline_max_us=0), [light], backend)
    backend.armed = True
    gate = backend.gate(9.0)
    lane.crew.close_calls()
    lane.enqueue(job(light, led_by(9.0), "late"))
    try:
        assert statuses(1) == {"late": Status.UNAVAILABLE}
        assert not backend.entered[9.0].is_set(), "the call ran"
        assert lane.backlog.depth == 0
    finally:
        gate.set()
        lane.crew.stop(5.0)


def test_a_new_worker_that_fails_to_load_one_model_closes_those_it_loaded(models):
    """Tried again every 2 s, each failed try left open the models it had loaded before the
    one that failed (on a GPU, device memory each time)."""
    backend = KeyedGates()
    light, heavy = models["mlp-light"], models["cnn-heavy"]
    lane = started(ClassConfig("t", order=0, inline_max_us=0, stuck_after_ms=100), [light, heavy], backend)
    held_by_the_first = backend.open_runners  # its worker's, which hangs and keeps them
    backend.armed = True
    gate = backend.gate(5.0)
    lane.enqueue(job(light, led_by(5.0), "A"))
    assert backend.entered[5.0].wait(5)
    time.sleep(0.15)
    backend.failing = {"cnn-heavy"}  # loaded after mlp-light
    loads = backend.loads
    try:
        steer_until(lane, lambda: backend.loads >= loads + 6, "three tries of a new worker")
        steer_until(lane, lambda: "failed to load" in lane.crew.health, "the third to fail")
        assert backend.open_runners == held_by_the_first
    finally:
        gate.set()
        lane.crew.stop(5.0)


class CloseFails(KeyedGates):
    """Its runners' close raises (on these runners alone: other tests' workers may still be ending)."""

    def load(self, model: ModelEntry, lane: ClassConfig) -> KeyedRunner:
        runner = super().load(model, lane)

        def close_fails() -> None:
            raise RuntimeError("a close that failed (a test's)")

        runner.close = close_fails  # type: ignore[method-assign]
        return runner


def test_a_failed_load_whose_close_fails_still_reaches_the_lanes_start(models):
    """A worker that fails to load closes what it had loaded; a close that raised there skipped
    start-up's barrier, and the lane's start waited for ever instead of saying why."""
    backend = CloseFails()
    backend.failing = {"cnn-heavy"}  # loaded after mlp-light, whose runner then fails to close
    lane = Lane(ClassConfig("t", order=0, inline_max_us=0), [models["mlp-light"], models["cnn-heavy"]], backend)
    error = raised_on_thread(lane.start, Exception, "the lane's start", timeout_s=30)  # fails if it waits for ever
    assert error is not None and "out of device memory" in str(error), error
