"""The stand-in: while the loop's thread runs an idle top-class lane's dear job itself,
another thread serves the sockets, and every guarantee of the worker path holds."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator

import pytest
import zmq
from support import RunningDaemon, connect, exchange, header, random_input, receive, short_dir, wait_for
from support.models import save_sleeper, sleep_for

from edged.wire.codec import encode_request

# The sleeper's run of 32000 takes 2-3 s here; nothing may trip the watchdog.
CONFIG = """
[server]
model_repository = "{repository}"

[classes.realtime]
deadline_ms = 60000
stuck_after_ms = 60000
{realtime}
[classes.standard]

[classes.bulk]
"""
LONG_RUN = 32000
ASK_AFTER_S = 0.2  # into the long run, the other requests are sent


def start(own_daemon, realtime: str = "") -> Iterator[RunningDaemon]:
    repository = short_dir()
    save_sleeper(repository)
    yield own_daemon(CONFIG.format(repository=repository, realtime=realtime))
    shutil.rmtree(repository, ignore_errors=True)


@pytest.fixture
def running(own_daemon) -> Iterator[RunningDaemon]:
    yield from start(own_daemon)


def realtime_stats(sock: zmq.Socket) -> dict:
    return exchange(sock, [header(id="s", op="stats")]).header["classes"]["realtime"]


def teach(sock: zmq.Socket) -> None:
    """One long run, inline (its warm-up priced it cheap), so the lane prices the sleeper dear."""
    taught = encode_request("taught", model="sleeper", klass="realtime", inputs=sleep_for(4000))
    assert exchange(sock, taught, 60_000).status == "OK"


def test_while_the_loops_thread_runs_a_dear_job_the_stand_in_answers_everyone_else(
    context: zmq.Context, running: RunningDaemon
) -> None:
    sock, other = connect(context, running.ipc), connect(context, running.ipc)
    teach(sock)
    before = realtime_stats(other)
    started = time.monotonic()
    sock.send_multipart(encode_request("long", model="sleeper", klass="realtime", inputs=sleep_for(LONG_RUN)))
    time.sleep(ASK_AFTER_S)
    asked = time.monotonic()
    health = exchange(other, [header(id="h", op="health")])
    light = encode_request("light", model="mlp-light", klass="standard", inputs=random_input("mlp-light", 1, 0))
    served = exchange(other, light)
    answered_s = time.monotonic() - asked
    long = receive(sock, 60_000)
    long_s = time.monotonic() - started
    assert health.header["state"] == "serving" and served.status == "OK", (health.header, served.header)
    assert long.status == "OK" and long.output()[0, 0] == LONG_RUN * 512
    # Without a stand-in they would wait for the rest of the long run: they must take a fifth of it at most.
    rest_s = long_s - ASK_AFTER_S
    assert answered_s * 5 < rest_s, f"the others waited {answered_s:.2f} s of the run's last {rest_s:.2f} s"
    after = realtime_stats(other)
    assert after["aside"] - before["aside"] == 1, after
    assert after["completed"] - before["completed"] == 1 and after["queue_depth"] == 0


def test_with_stand_in_off_the_dear_job_runs_on_the_lanes_worker(context: zmq.Context, own_daemon) -> None:
    for running in start(own_daemon, realtime="stand_in = false"):
        sock = connect(context, running.ipc)
        teach(sock)
        request = encode_request("dear", model="sleeper", klass="realtime", inputs=sleep_for(2000))
        assert exchange(sock, request, 60_000).status == "OK"
        stats = realtime_stats(sock)
        assert stats["aside"] == 0 and stats["backend_calls"] - stats["inline"] >= 1, stats


def test_a_sigterm_during_a_dear_job_on_the_loops_thread_drains_it(
    context: zmq.Context, running: RunningDaemon
) -> None:
    """The handler runs when the call returns (Python runs handlers on the main thread)
    and only leaves the news: the loop drains, and the call's reply goes out first."""
    sock = connect(context, running.ipc)
    teach(sock)
    sock.send_multipart(encode_request("long", model="sleeper", klass="realtime", inputs=sleep_for(LONG_RUN)))
    time.sleep(ASK_AFTER_S)
    running.process.process.send_signal(signal.SIGTERM)
    reply = receive(sock, 60_000)
    assert reply.status == "OK", reply.header
    assert running.stop() == 0
    assert "draining" in running.log()


def test_a_sighup_during_a_dear_job_on_the_loops_thread_reloads_after_it(
    context: zmq.Context, running: RunningDaemon
) -> None:
    """Python runs signal handlers on the main thread, inside the call here: the reload
    starts when the call returns, and the new inline path serves on the loop's thread."""
    sock, other = connect(context, running.ipc), connect(context, running.ipc)
    teach(sock)
    sock.send_multipart(encode_request("long", model="sleeper", klass="realtime", inputs=sleep_for(LONG_RUN)))
    time.sleep(ASK_AFTER_S)
    os.kill(running.pid, signal.SIGHUP)
    long = receive(sock, 60_000)
    assert long.status == "OK" and long.output()[0, 0] == LONG_RUN * 512, long.header
    wait_for(lambda: "reloaded:" in running.log(), 30, "the reload")
    inline_before = realtime_stats(other)["inline"]
    light = encode_request("after", model="mlp-light", klass="realtime", inputs=random_input("mlp-light", 1, 0))
    assert exchange(other, light).status == "OK"
    assert realtime_stats(other)["inline"] == inline_before + 1, "after the reload, a light request left the loop"
    assert running.stop() == 0


def test_an_aside_call_past_stuck_after_ms_is_answered_and_the_loops_thread_is_not_given_up(
    context: zmq.Context, own_daemon
) -> None:
    """The watchdog answers an overrunning aside call's request, as a worker's, but the
    loop's thread is not a worker: none is started in its place, and the next dear job
    runs aside again."""
    repository = short_dir()
    save_sleeper(repository)
    config = CONFIG.format(repository=repository, realtime="").replace(
        "stuck_after_ms = 60000", "stuck_after_ms = 1000"
    )
    running = own_daemon(config)
    try:
        sock, other = connect(context, running.ipc), connect(context, running.ipc)
        teach(sock)
        # About 5 s here: five times the watchdog's limit.
        sock.send_multipart(encode_request("stuck", model="sleeper", klass="realtime", inputs=sleep_for(64_000)))
        stuck = receive(sock, 60_000)
        assert stuck.status == "INTERNAL" and "has not returned after 1000 ms" in stuck.header["error"], stuck.header
        light = encode_request("light", model="mlp-light", klass="standard", inputs=random_input("mlp-light", 1, 0))
        assert exchange(other, light).status == "OK"
        # Once the call returns, the next dear job runs aside again, and is answered OK.
        wait_for(lambda: realtime_stats(other)["late_dropped"] == 1, 60, "the stuck call to return")
        time.sleep(0.2)  # the call's late result is counted just before the loop's thread takes the role back
        before = realtime_stats(other)
        again = encode_request("again", model="sleeper", klass="realtime", inputs=sleep_for(2000))
        assert exchange(sock, again, 60_000).status == "OK"
        after = realtime_stats(other)
        assert after["aside"] - before["aside"] == 1, after
        health = exchange(other, [header(id="h", op="health")]).header
        assert health["lanes"]["realtime"] == "ok", health
        log = running.log()
        assert "has not returned after 1000 ms on the socket loop's thread: answered" in log
        assert "starting a new worker" not in log, log[-2000:]
    finally:
        shutil.rmtree(repository, ignore_errors=True)
