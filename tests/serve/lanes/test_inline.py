"""The inline path: a class's loop runs a job priced within its inline_max_us itself,
when its lane is idle.

It must stay safe when the lane's workers come and go, follow the prices the lane keeps
measuring (a model that turns out dear leaves it, and comes back once cheap again), and
never run a size not yet measured.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq
from support import RunningDaemon, connect, decoded, exchange, header, random_input, run_edged, short_dir, wait_for
from support.backends import CountingBackend
from support.models import save_sleeper, sleep_for
from support.stream_models import padder
from support.transport import Replies

from edged.config.classes import ClassConfig
from edged.models.repository import discover
from edged.protocol import encode_request
from edged.serve.admission import Shed
from edged.serve.lanes.lane import Lane

# Realtime's watchdog fires at 200 ms; the sleeper's long runs take 0.8 s and 1.6 s here.
# Its inline cap is set (the deadline would derive a long one).
CONFIG = """
[server]
model_repository = "{repository}"

[classes.realtime]
deadline_ms = 60000
stuck_after_ms = 200
inline_max_us = 1000

[classes.standard]

[classes.bulk]
"""


@pytest.fixture
def running(own_daemon) -> Iterator[RunningDaemon]:
    repository = short_dir()
    save_sleeper(repository)
    yield own_daemon(CONFIG.format(repository=repository))
    shutil.rmtree(repository, ignore_errors=True)


def realtime_stats(sock: zmq.Socket) -> dict:
    return exchange(sock, [header(id="s", op="stats")]).header["classes"]["realtime"]


def light(request_id: object) -> list:
    return encode_request(request_id, model="mlp-light", klass="realtime", inputs=random_input("mlp-light", 1, 0))


def test_inline_requests_survive_the_watchdog_replacing_the_lanes_worker(
    context: zmq.Context, running: RunningDaemon
) -> None:
    """Reproduced bug: the inline path borrowed the runners of the lane's first worker.
    Once the watchdog gave up on that worker and its hung call returned, the worker
    closed them, and every inline request after that was answered INTERNAL."""
    sock, watcher = connect(context, running.ipc), connect(context, running.ipc)
    assert exchange(sock, light("before")).status == "OK"
    # A long run on the loop teaches the lane the sleeper is slow, so the next one goes to the worker.
    slow = encode_request("taught", model="sleeper", klass="realtime", inputs=sleep_for(8000))
    assert exchange(sock, slow, 60_000).status == "OK"
    hung = exchange(sock, encode_request("hung", model="sleeper", klass="realtime", inputs=sleep_for(16000)))
    assert hung.status == "INTERNAL" and "has not returned" in hung.header["error"], hung.header
    # The abandoned worker's call returns and that worker ends: its runners are gone now.
    wait_for(lambda: realtime_stats(watcher)["late_dropped"] == 1, 60, "the hung call to return")

    before = realtime_stats(watcher)["inline"]
    for i in range(20):
        reply = exchange(sock, light(i))
        assert reply.status == "OK", reply.header
    assert realtime_stats(watcher)["inline"] - before == 20, "the light requests did not run on the loop's thread"


def test_a_model_whose_runs_turn_dear_leaves_the_loop_and_comes_back_once_cheap_again(
    context: zmq.Context, running: RunningDaemon
) -> None:
    """The sleeper's cost follows a value. Priced cheap, it runs inline; one slow run
    (about 40 ms, forty times the cap) raises its price past the cap, so the next go to
    the lane's worker, whose cheap runs bring the price back down, and inline they go
    again: the decision follows what the lane keeps measuring."""
    sock, watcher = connect(context, running.ipc), connect(context, running.ipc)

    def ran_inline(n: int) -> bool:
        before = realtime_stats(watcher)["inline"]
        request = encode_request("s", model="sleeper", klass="realtime", inputs=sleep_for(n))
        assert exchange(sock, request, 60_000).status == "OK"
        return realtime_stats(watcher)["inline"] > before

    assert ran_inline(0)
    assert ran_inline(400), "the slow run, priced cheap, did not run inline"
    assert realtime_stats(watcher)["prices"]["sleeper"]["first_row_ms"] > 1.0
    assert not ran_inline(0), "a model priced past the cap ran inline"
    assert any(ran_inline(0) for _ in range(300)), "cheap runs on the worker never brought the model back"


@pytest.fixture
def padder_repository() -> Iterator[Path]:
    """The padder, imported and warmed up at 1000 samples."""
    root = short_dir()
    source = padder(root / "src" / "padder.onnx")
    done = run_edged("import", str(source), "--repository", str(root / "repo"), "--shape", "x=1x1000")
    assert done.returncode == 0, done.stderr
    yield root / "repo"
    shutil.rmtree(root, ignore_errors=True)


def test_a_size_not_yet_measured_never_runs_inline(context: zmq.Context, own_daemon, padder_repository: Path) -> None:
    """The padder's cost follows its samples. Warmed up at 1000, a request of 1100 is
    priced by extrapolation (well under the inline limit): it runs on the lane, which
    measures it; the next of that size runs inline."""
    running = own_daemon(CONFIG.format(repository=padder_repository))
    sock, watcher = connect(context, running.ipc), connect(context, running.ipc)

    def ran_inline(samples: int) -> bool:
        before = realtime_stats(watcher)
        x = np.random.default_rng(samples).standard_normal((1, samples), dtype=np.float32)
        reply = exchange(sock, encode_request(samples, model="padder", klass="realtime", inputs={"x": x}))
        assert reply.status == "OK", reply.header
        after = realtime_stats(watcher)
        assert after["completed"] == before["completed"] + 1
        return after["inline"] > before["inline"]

    # Warmed up at one size: start-up says what that means for its price.
    assert "model 'padder' takes inputs of any size and warms up at one size (x [1, 1000])" in running.log()
    assert ran_inline(1000), "a measured size, cheap, did not run inline"
    assert ran_inline(900), "a size below one measured did not run inline"
    assert not ran_inline(1100), "a size past those measured ran inline before it was measured"
    # The worker measures the first 1100 just after its reply leaves: the next request may
    # come before that, and go to the worker again.
    assert any(ran_inline(1100) for _ in range(5)), "a size measured once never ran inline"


def test_a_shed_at_a_guessed_price_sets_no_remeasure_going_padder(padder_repository: Path) -> None:
    """A request far past every size measured, with a deadline shorter than its guessed
    price, is shed; re-timing the warm-up sample (1000 samples) could not correct a
    guess about 200,000, so the lane runs nothing for it, then or later."""
    backend = CountingBackend()
    model = next(m for m in discover(padder_repository, "onnxruntime") if m.name == "padder")
    lane = Lane(ClassConfig("realtime", order=0, inline_max_us=300), [model], backend)
    lane.start()
    lane.own()
    backend.counting = True
    try:
        x = np.zeros((1, 200_000), np.float32)
        request = decoded(encode_request(1, model="padder", klass="realtime", deadline_ms=0.001, inputs={"x": x}))
        measured = model.signature.measure(request)
        shed = lane.offer(Replies().route(1), request, model, *measured, time.monotonic_ns())
        assert isinstance(shed, Shed) and shed.beyond_one_run and "priced past the largest input" in shed.message
        time.sleep(0.5)  # a remeasure would have run within a few ms
    finally:
        lane.crew.stop(2.0)
    assert backend.calls == []


def test_the_shared_endpoints_loop_runs_inline_only_what_the_shortest_deadline_can_wait_for(
    own_daemon, context: zmq.Context
) -> None:
    """The default class's loop reads the shared endpoints, where a realtime request may
    come: with realtime's deadline at 2 ms, standard's loop runs inline nothing dearer than
    a tenth of it, so cnn-heavy's 1.4 ms call goes to a worker, where standard's own 200 ms
    deadline would have let its loop run it. So from start-up on, until it has read no such
    deadline for a while (LoopDeadlines, tests/serve/lanes/test_lanes.py)."""
    running = own_daemon("[classes.realtime]\ndeadline_ms = 2\n[classes.standard]\n[classes.bulk]\n")
    sock = connect(context, running.ipc)
    try:
        for i in range(10):
            request = encode_request(i, model="cnn-heavy", klass="standard", inputs=random_input("cnn-heavy", 1, i))
            assert exchange(sock, request).header["status"] == "OK"
        standard = exchange(sock, [header(id="s", op="stats")]).header["classes"]["standard"]
    finally:
        sock.close(linger=0)
    assert standard["loop_deadline_ms"] == 2.0 and standard["inline_max_us"] <= 200, standard
    assert standard["inline"] == 0, standard


def test_a_loop_caps_its_inline_calls_by_the_shortest_deadline_it_reads(own_daemon, context: zmq.Context) -> None:
    """A request's own deadline counts too: one standard request sent with 5 ms on the shared
    endpoints brings that loop's cap down to 0.5 ms, and no other loop's; a realtime one sent
    there with 2 ms, both the loop that read it and realtime's, which admits it."""
    running = own_daemon()
    sock = connect(context, running.ipc)

    def stats() -> dict:
        return exchange(sock, [header(id="s", op="stats")]).header["classes"]

    def sent(deadline_ms: float, **fields: str) -> None:
        request = encode_request(1, model="mlp-light", deadline_ms=deadline_ms, inputs=light_input, **fields)
        assert exchange(sock, request).header["status"] in ("OK", "OVERLOADED")

    light_input = random_input("mlp-light", 1, 0)
    try:
        before = stats()
        sent(5.0)
        standard_short = stats()
        sent(2.0, klass="realtime")
        realtime_short = stats()
    finally:
        sock.close(linger=0)
    # At start, the shared endpoints' loop takes every class's deadline as one it may read.
    assert before["standard"]["loop_deadline_ms"] == before["realtime"]["loop_deadline_ms"] == 20.0, before
    after = standard_short
    assert after["standard"]["loop_deadline_ms"] == 5.0 and after["standard"]["inline_max_us"] <= 500, after
    assert after["realtime"]["loop_deadline_ms"] == 20.0 and after["bulk"]["loop_deadline_ms"] == 5000.0, after
    after = realtime_short
    assert after["standard"]["loop_deadline_ms"] == after["realtime"]["loop_deadline_ms"] == 2.0, after
    assert after["bulk"]["loop_deadline_ms"] == 5000.0, after
