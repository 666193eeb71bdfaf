"""One client over several daemons, on real daemons over ipc: failover after kill -9,
after a drain and after OVERLOADED; hedging gives one result and counts the loser.

The shared session daemon is the healthy one in each test; each test harms a daemon of
its own with one class (`standard`, every daemon's default class), which starts fast.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

import numpy as np
import pytest
import zmq
from support import Reference, RunningDaemon, assert_close, connect, exchange, header, random_input, wait_for

from edged.client import AsyncClient, Client, Overloaded
from edged.fleet import EndpointCounters
from edged.wire.codec import encode_request

StartDaemon = Callable[..., RunningDaemon]
ONE_CLASS = "[server]\ndrain_timeout_ms = 120000\n[classes.standard]\ndeadline_ms = 60000\n{extra}"


def victim(own_daemon: StartDaemon, extra: str = "") -> RunningDaemon:
    return own_daemon(ONE_CLASS.format(extra=extra))


def admitted(sock: zmq.Socket) -> int:
    return exchange(sock, [header(id="s", op="stats")]).header["classes"]["standard"]["admitted"]


def occupy(context: zmq.Context, running: RunningDaemon) -> zmq.Socket:
    """About a second of cnn-heavy on the daemon's one standard worker, admitted."""
    sock, watcher = connect(context, running.ipc), connect(context, running.ipc)
    before = admitted(watcher)
    images = random_input("cnn-heavy", rows=256, seed=1)
    sock.send_multipart(encode_request("long", model="cnn-heavy", deadline_ms=60_000, inputs=images))
    wait_for(lambda: admitted(watcher) == before + 1, 10, "the long request was admitted")
    return sock


def warm(client: Client) -> None:
    """Call until both daemons have answered (a fresh client's sockets connect in the
    background, and a call skips a daemon not yet connected) and the next call goes to
    the first daemon; then zero the counters' meaning by returning nothing to compare."""
    first, second = client.endpoints
    for seed in range(100):
        before = client.counters()[second].ok
        client.infer("mlp-light", random_input("mlp-light", 1, seed))
        counters = client.counters()
        if counters[first].ok and counters[second].ok > before:
            return
    raise AssertionError(f"the client did not reach both daemons: {client.counters()}")


def since(client: Client, endpoint: str, before: dict[str, EndpointCounters]) -> tuple[int, ...]:
    """What changed at `endpoint` since `before`: sent, ok, shed, unavailable, timed_out, hedged, hedge_won, late."""
    now, then = client.counters()[endpoint], before[endpoint]
    keys = ("sent", "ok", "shed", "unavailable", "timed_out", "hedged", "hedge_won", "late")
    return tuple(getattr(now, key) - getattr(then, key) for key in keys)


def test_kill_9_mid_run_every_call_gets_one_ok_from_the_other_daemon(
    own_daemon: StartDaemon, daemon: RunningDaemon, reference: Reference
) -> None:
    doomed = victim(own_daemon)
    calls = 120
    inputs = [random_input("mlp-light", 1, seed) for seed in range(calls)]

    async def run() -> list[object]:
        async with AsyncClient([doomed.ipc, daemon.ipc], timeout_ms=5000) as client:

            async def one(i: int) -> object:
                await asyncio.sleep(i * 0.005)  # 0.6 s of calls, several in flight at any moment
                if i == calls // 3:
                    os.kill(doomed.pid, signal.SIGKILL)
                return await client.infer("mlp-light", inputs[i], deadline_ms=400)

            results = await asyncio.gather(*(one(i) for i in range(calls)), return_exceptions=True)
            counters = client.counters()
        # Exactly one OK per call; once the kill was seen (ZMQ_IMMEDIATE), no copy went to
        # the dead daemon: about calls / 6 before the kill, not half of all of them.
        assert counters[doomed.ipc].ok + counters[daemon.ipc].ok == calls, counters
        assert 0 < counters[doomed.ipc].sent < calls // 4, counters
        return results

    results = asyncio.run(run())
    for i, result in enumerate(results):
        assert isinstance(result, dict), f"call {i}: {result!r}"
        assert_close(result["scores"], reference.run("mlp-light", inputs[i]))
    assert doomed.process.process.wait(10) == -signal.SIGKILL


def test_a_drain_sends_calls_to_the_other_daemon_and_sets_the_draining_one_aside(
    context: zmq.Context, own_daemon: StartDaemon, daemon: RunningDaemon
) -> None:
    draining = victim(own_daemon)
    with Client([draining.ipc, daemon.ipc], timeout_ms=5000) as client:
        warm(client)
        long = occupy(context, draining)
        draining.process.process.send_signal(signal.SIGTERM)
        health = exchange(connect(context, draining.ipc), [header(id="h", op="health")]).header
        assert health["state"] == "draining"
        before = client.counters()
        for seed in range(3):
            client.infer("mlp-light", random_input("mlp-light", 1, seed))
        # The first call met UNAVAILABLE and went on; the next two did not try the draining one.
        assert since(client, draining.ipc, before) == (1, 0, 0, 1, 0, 0, 0, 0)
        assert since(client, daemon.ipc, before)[:2] == (3, 3)
    assert long.poll(30_000) and draining.process.process.wait(30) == 0


def test_overloaded_is_retried_elsewhere_and_that_daemon_skipped_until_retry_after(
    context: zmq.Context, own_daemon: StartDaemon, daemon: RunningDaemon
) -> None:
    full = victim(own_daemon, "queue_capacity = 1\n")
    with Client([full.ipc, daemon.ipc], timeout_ms=5000) as client:
        warm(client)
        occupy(context, full)  # its one place is taken for about a second
        before = client.counters()
        client.infer("mlp-light", random_input("mlp-light", 1, 0))
        client.infer("mlp-light", random_input("mlp-light", 1, 1))
        assert since(client, full.ipc, before) == (1, 0, 1, 0, 0, 0, 0, 0)
        assert since(client, daemon.ipc, before)[:2] == (2, 2)


def test_no_reply_within_half_the_deadline_is_retried_on_the_other_daemon(
    own_daemon: StartDaemon, daemon: RunningDaemon
) -> None:
    silent = victim(own_daemon)
    with Client([silent.ipc, daemon.ipc], timeout_ms=5000) as client:
        warm(client)
        before = client.counters()
        os.kill(silent.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            reply = client.infer_reply("mlp-light", random_input("mlp-light", 1, 0), deadline_ms=1000)
            took_s = time.monotonic() - started
        finally:
            os.kill(silent.pid, signal.SIGCONT)
        assert reply.status.value == "OK"
        # Given up after 500 ms, answered at once by the other daemon: well inside the deadline.
        assert 0.5 <= took_s < 1.0, f"the call took {took_s:.2f} s"
        assert since(client, silent.ipc, before)[:5] == (1, 0, 0, 0, 1)
        assert since(client, daemon.ipc, before)[:2] == (1, 1)


def test_a_hedge_returns_one_result_and_the_losers_late_reply_is_counted_and_dropped(
    own_daemon: StartDaemon, daemon: RunningDaemon, reference: Reference
) -> None:
    slow = victim(own_daemon)
    with Client([slow.ipc, daemon.ipc], timeout_ms=5000, hedge=True, hedge_after_ms=50) as client:
        warm(client)
        before = client.counters()
        os.kill(slow.pid, signal.SIGSTOP)
        try:
            first = random_input("mlp-light", 1, 7)
            started = time.monotonic()
            result = client.infer("mlp-light", first)
            took_s = time.monotonic() - started
        finally:
            os.kill(slow.pid, signal.SIGCONT)
        assert_close(result["scores"], reference.run("mlp-light", first))
        # The hedge went after 50 ms; the first copy's share (half of 5 s) never came.
        assert took_s < 1.0, f"the hedged call took {took_s:.2f} s"
        wait_for(lambda: since(client, slow.ipc, before)[7] == 1, 10, "the stopped daemon's late reply")
        assert since(client, slow.ipc, before) == (1, 0, 0, 0, 0, 0, 0, 1)
        assert since(client, daemon.ipc, before) == (1, 1, 0, 0, 0, 1, 1, 0)
        # The late reply did not become the next call's result.
        second = random_input("mlp-light", 1, 8)
        assert_close(client.infer("mlp-light", second)["scores"], reference.run("mlp-light", second))


def test_a_single_endpoint_client_neither_retries_nor_sets_aside(context: zmq.Context, own_daemon: StartDaemon) -> None:
    full = victim(own_daemon, "queue_capacity = 1\n")
    occupy(context, full)
    with Client(full.ipc, timeout_ms=5000) as client:
        for _ in range(2):  # both sent: a lone daemon is asked each time, as before
            with pytest.raises(Overloaded):
                client.infer("mlp-light", {"x": np.zeros((1, 64), np.float32)})
        assert client.counters()[full.ipc].sent == 2
