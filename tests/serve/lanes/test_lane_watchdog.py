"""A backend call that does not return: the lane's watchdog answers its request,
replaces the worker, shows it in health, and the late result is never sent."""

from __future__ import annotations

import shutil
import signal
import time

import zmq
from support import connect, exchange, header, nothing_more, random_input, receive, short_dir, wait_for
from support.models import save_sleeper, sleep_for

from edged.wire.codec import encode_request

CONFIG = """
[server]
model_repository = "{repository}"

[classes.realtime]
order = 0

[classes.standard]
order = 1
deadline_ms = 60000
stuck_after_ms = 200
# The sleeper, priced cheap by its warm-up, runs on the worker: a loop's inline call is not watched.
inline_max_us = 0

[classes.bulk]
order = 2
"""


def test_a_hung_call_is_answered_its_worker_replaced_and_its_late_result_dropped(context: zmq.Context, own_daemon):
    repository = short_dir()
    save_sleeper(repository)
    running = own_daemon(CONFIG.format(repository=repository))
    control = connect(context, running.ipc)
    hung = connect(context, running.ipc)

    started = time.monotonic()
    hung.send_multipart(encode_request("hung", model="sleeper", klass="standard", inputs=sleep_for(16000)))
    reply = receive(hung, 10_000)
    answered_after = time.monotonic() - started
    assert reply.status == "INTERNAL", reply.header
    assert "has not returned after 200 ms" in reply.header["error"]
    assert answered_after < 5.0, f"the watchdog took {answered_after:.1f} s to answer"

    wait_for(lambda: "starting a new worker" in running.log(), 5, "the watchdog's log line")
    wait_for(
        lambda: exchange(control, [header(id="h", op="health")]).header["lanes"]["standard"] == "ok",
        30,
        "the standard lane to recover",
    )
    ok = exchange(
        control, encode_request("after", model="mlp-light", klass="standard", inputs=random_input("mlp-light", 1, 0))
    )
    assert ok.status == "OK"

    # The hung call finishes eventually; its result must not become a second reply.
    def standard_stats() -> dict:
        return exchange(control, [header(id="s", op="stats")]).header["classes"]["standard"]

    wait_for(lambda: standard_stats()["late_dropped"] == 1, 60, "the hung call to return")
    assert nothing_more(hung, wait_ms=500), "a request was answered twice"
    stats = standard_stats()
    assert stats["failed"] == 1 and stats["queue_depth"] == 0
    assert running.stop() == 0
    shutil.rmtree(repository, ignore_errors=True)


def test_a_call_that_hangs_across_a_reload_is_answered_and_its_retired_lane_loads_no_new_worker(
    context: zmq.Context, own_daemon
):
    """SIGHUP while a call hangs: its lane is retired, and the watchdog answers the call
    INTERNAL as the limit passes, without loading a new worker (every model) for a lane
    that a reload replaced, whose worker would only end (before: it did)."""
    repository = short_dir()
    save_sleeper(repository)
    running = own_daemon(CONFIG.format(repository=repository).replace("stuck_after_ms = 200", "stuck_after_ms = 4000"))
    hung = connect(context, running.ipc)
    started = time.monotonic()
    hung.send_multipart(encode_request("hung", model="sleeper", klass="standard", inputs=sleep_for(400_000)))
    time.sleep(0.3)
    running.process.process.send_signal(signal.SIGHUP)
    wait_for(lambda: "reloaded" in running.log(), 30, "the reload")
    reply = receive(hung, 20_000)
    assert reply.status == "INTERNAL" and "has not returned after 4000 ms" in reply.header["error"], reply.header
    assert time.monotonic() - started < 15
    assert "starting a new worker" not in running.log()
    running.process.process.kill()
    shutil.rmtree(repository, ignore_errors=True)
