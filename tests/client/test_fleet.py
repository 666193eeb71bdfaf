"""One client over several daemons, on real daemons over ipc: failover after kill -9,
after a drain and after OVERLOADED; hedging gives one result and counts the loser.

The shared session daemon is the healthy one in each test; each test harms a daemon of
its own with one class (`standard`, every daemon's default class), which starts fast.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
import zmq
from support import (
    ENGINES,
    Reference,
    RunningDaemon,
    assert_close,
    connect,
    exchange,
    header,
    random_input,
    short_dir,
    wait_for,
)

from edged.cli.commands import main
from edged.client import AsyncClient, Client, NoReply, Overloaded
from edged.client.fleet import EndpointCounters
from edged.wire.codec import encode_request

StartDaemon = Callable[..., RunningDaemon]
T = TypeVar("T")
ONE_CLASS = "[server]\ndrain_timeout_ms = 120000\n[classes.standard]\ndeadline_ms = 60000\n{extra}"


def victim(own_daemon: StartDaemon, extra: str = "") -> RunningDaemon:
    return own_daemon(ONE_CLASS.format(extra=extra))


def mlp_input() -> dict[str, np.ndarray]:
    return random_input("mlp-light", 1, 0)


def admitted(sock: zmq.Socket) -> int:
    return exchange(sock, [header(id="s", op="stats")]).header["classes"]["standard"]["admitted"]


def occupy(context: zmq.Context, running: RunningDaemon) -> zmq.Socket:
    """A second or more of cnn-heavy on the daemon's one standard worker, admitted (512 rows:
    256 took 0.5 s on a Xeon with AVX-512, and a loaded box's next calls came later)."""
    sock, watcher = connect(context, running.ipc), connect(context, running.ipc)
    before = admitted(watcher)
    images = random_input("cnn-heavy", rows=512, seed=1)
    sock.send_multipart(encode_request("long", model="cnn-heavy", deadline_ms=60_000, inputs=images))
    wait_for(lambda: admitted(watcher) == before + 1, 10, "the long request was admitted")
    return sock


def warm(client: Client) -> None:
    """Call until both daemons have answered: a fresh client's sockets connect in the
    background, and a call skips a daemon not yet connected."""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        client.infer("mlp-light", random_input("mlp-light", 1, 0))
        if all(counters.ok for counters in client.counters().values()):
            return
    raise AssertionError(f"the client did not reach both daemons: {client.counters()}")


def tries(client: Client | AsyncClient, within_s: float = 10.0) -> Iterator[dict[str, EndpointCounters]]:
    """The counters before each try of a call, for `within_s`. Bounded in time, not in
    calls: the client picks a daemon by its load and a decaying average of its round trips
    (edged.client.fleet.LATENCY_DECAY_MS), so one whose first round trip was slow, as on a busy
    box, goes unpicked for seconds, however many calls are made meanwhile."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        yield client.counters()


def went_first_to(client: Client | AsyncClient, endpoint: str, before: dict[str, EndpointCounters]) -> bool:
    """Whether the call made since `before` sent its first copy to `endpoint`: a copy, not a hedge."""
    now, then = client.counters()[endpoint], before[endpoint]
    return now.sent > then.sent and now.hedged == then.hedged


def first_copy_to(client: Client, endpoint: str, call: Callable[[], T]) -> tuple[T, float, dict[str, EndpointCounters]]:
    """Repeat `call` until its first copy goes to `endpoint` (which daemon the client picks
    is not fixed); that call's result, its time in seconds, and the counters from just before it."""
    for before in tries(client):
        started = time.monotonic()
        result = call()
        took_s = time.monotonic() - started
        if went_first_to(client, endpoint, before):
            return result, took_s, before
    raise AssertionError(f"no call went to {endpoint}: {client.counters()}")


def since(client: Client | AsyncClient, endpoint: str, before: dict[str, EndpointCounters]) -> tuple[int, ...]:
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

    sent_at_exit: list[int] = []

    async def run() -> list[object]:
        async with AsyncClient([doomed.ipc, daemon.ipc], timeout_ms=5000) as client:
            while not all(counters.ok for counters in client.counters().values()):  # both connected
                await client.infer("mlp-light", inputs[0])

            async def one(i: int) -> object:
                await asyncio.sleep(i * 0.005)  # 0.6 s of calls, several in flight at any moment
                if i == calls // 3:
                    # SIGKILL takes effect once the process is next scheduled, and its sockets
                    # close as it exits: on a busy box, copies reach it until then (22 did, on
                    # CI). Counted from its exit, while the other calls go on.
                    os.kill(doomed.pid, signal.SIGKILL)
                    await asyncio.to_thread(doomed.process.process.wait, 10)
                    sent_at_exit.append(client.counters()[doomed.ipc].sent)
                return await client.infer("mlp-light", inputs[i], deadline_ms=400)

            before = client.counters()
            results = await asyncio.gather(*(one(i) for i in range(calls)), return_exceptions=True)
            counters = client.counters()
        # Exactly one OK per call. Once the exit was seen (ZMQ_IMMEDIATE: at once, on ipc),
        # no copy went to the dead daemon, but for those racing the disconnect: 0-2 on a
        # quiet box, 4 at load 10 (its I/O thread saw it later). A client that missed the
        # disconnect would send it about half of the calls after the exit.
        assert sum(counters[e].ok - before[e].ok for e in counters) == calls, counters
        assert counters[doomed.ipc].sent - sent_at_exit[0] <= 10, (sent_at_exit, counters)
        return results

    results = asyncio.run(run())
    for i, result in enumerate(results):
        assert isinstance(result, dict), f"call {i}: {result!r}"
        assert_close(result["scores"], reference.run("mlp-light", inputs[i]))
    assert doomed.process.process.wait(10) == -signal.SIGKILL


def test_no_copy_goes_to_a_daemon_known_dead(own_daemon: StartDaemon, daemon: RunningDaemon) -> None:
    doomed = victim(own_daemon)
    with Client([doomed.ipc, daemon.ipc], timeout_ms=5000) as client:
        warm(client)
        doomed.process.process.kill()
        doomed.process.process.wait(10)
        time.sleep(0.1)  # the client's I/O thread sees the ipc connection close (well under a millisecond)
        before = client.counters()
        for _ in range(4):  # with both equally quick so far, round robin would offer the dead one a copy
            client.infer("mlp-light", mlp_input(), deadline_ms=1000)
        # ZMQ_IMMEDIATE: a send to a daemon not connected fails at once and the call goes
        # on; without it the copy would queue for a reconnect, and wait out half the deadline.
        assert since(client, doomed.ipc, before)[0] == 0, client.counters()
        assert since(client, daemon.ipc, before)[:2] == (4, 4)


def test_a_drain_sends_calls_to_the_other_daemon_and_sets_the_draining_one_aside(
    context: zmq.Context, own_daemon: StartDaemon, daemon: RunningDaemon
) -> None:
    draining = victim(own_daemon)
    with Client([draining.ipc, daemon.ipc], timeout_ms=5000) as client:
        warm(client)
        long = occupy(context, draining)
        draining.process.process.send_signal(signal.SIGTERM)
        # The loop acts on the signal at its next turn: a health request may be answered first.
        watcher = connect(context, draining.ipc)
        health = [header(id="h", op="health")]
        wait_for(lambda: exchange(watcher, health).header["state"] == "draining", 10, "health says draining")
        _, _, before = first_copy_to(client, draining.ipc, lambda: client.infer("mlp-light", mlp_input()))
        # That call met UNAVAILABLE and went on; the next two do not try the draining daemon.
        client.infer("mlp-light", mlp_input())
        client.infer("mlp-light", mlp_input())
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
        _, _, before = first_copy_to(client, full.ipc, lambda: client.infer("mlp-light", mlp_input()))
        client.infer("mlp-light", mlp_input())  # within its retry_after_ms: not tried
        assert since(client, full.ipc, before) == (1, 0, 1, 0, 0, 0, 0, 0)
        assert since(client, daemon.ipc, before)[:2] == (2, 2)


def test_a_call_still_awaited_at_its_end_is_no_reply_not_an_earlier_refusal(
    context: zmq.Context, own_daemon: StartDaemon, short_tmp: Path
) -> None:
    """One daemon answers OVERLOADED, the other never: the call ended with that refusal and its
    retry hint, passing a hung daemon off as a busy one (a review's probe). NoReply, naming it."""
    full = victim(own_daemon, "queue_capacity = 1\n")
    silent = context.socket(zmq.ROUTER)
    silent.linger = 0
    silent.bind(f"ipc://{short_tmp}/silent.sock")
    try:
        occupy(context, full)  # its one place is taken for about a second
        with Client([full.ipc, f"ipc://{short_tmp}/silent.sock"], timeout_ms=800) as client:
            with pytest.raises(NoReply, match="OVERLOADED from a daemon before"):
                client.infer("mlp-light", mlp_input())
    finally:
        silent.close()


def test_a_daemon_without_one_model_is_set_aside_for_that_model_alone(
    own_daemon: StartDaemon, daemon: RunningDaemon
) -> None:
    """A daemon answers UNAVAILABLE for a model that failed to load there: the fleet set that
    daemon aside for every model, a second each time, and with half the calls for that model
    it took 0.5% of the other model's (a review's probe). The reply says `scope` "model"."""
    root = short_dir()
    for model in ("mlp-light", "cnn-heavy"):
        shutil.copytree(ENGINES / model, root / model)
    (root / "cnn-heavy" / "model.onnx").write_bytes(b"not an ONNX file")
    server = f'[server]\nmodel_repository = "{root}"\non_model_failure = "skip"\n'
    lacking = own_daemon(server + "[classes.standard]\ndeadline_ms = 60000\n")
    image = random_input("cnn-heavy", 1, 0)
    with Client([lacking.ipc, daemon.ipc], timeout_ms=10_000) as client:
        warm(client)
        before = client.counters()[lacking.ipc]
        for _ in range(40):
            assert client.infer("cnn-heavy", image)["logits"].shape == (1, 10)  # by the other daemon
            client.infer("mlp-light", mlp_input())
        after = client.counters()[lacking.ipc]
    assert after.unavailable > before.unavailable  # it was asked, and said so
    assert after.ok - before.ok >= 8, (before, after)  # a fifth of mlp-light's calls at least: about half


def test_no_reply_within_half_the_deadline_is_retried_on_the_other_daemon(
    own_daemon: StartDaemon, daemon: RunningDaemon
) -> None:
    silent = victim(own_daemon)
    with Client([silent.ipc, daemon.ipc], timeout_ms=5000) as client:
        warm(client)
        silent.pause()
        try:
            reply, took_s, before = first_copy_to(
                client, silent.ipc, lambda: client.infer_reply("mlp-light", mlp_input(), deadline_ms=1000)
            )
        finally:
            silent.resume()
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
        first = random_input("mlp-light", 1, 7)
        slow.pause()
        try:
            result, took_s, before = first_copy_to(client, slow.ipc, lambda: client.infer("mlp-light", first))
        finally:
            slow.resume()
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


def test_edged_bench_over_several_endpoints_reports_each_daemon(
    daemon: RunningDaemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fleet.json"
    argv = ["bench", "--endpoint", daemon.ipc, "--endpoint", daemon.tcp, "--mix", "realtime:mlp-light:200:50"]
    assert main([*argv, "--duration", "0.5", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    (stream,) = figures["streams"]
    assert stream["calls"] > 0 and stream["results"] == stream["calls"]
    assert set(figures["daemons"]) == {daemon.ipc, daemon.tcp}
    for endpoint, per_daemon in figures["daemons"].items():
        assert per_daemon["client"]["sent"] > 0, endpoint
        assert per_daemon["daemon"]["realtime"]["completed"] > 0, endpoint
    assert sum(d["client"]["sent"] for d in figures["daemons"].values()) == figures["copies_sent"]
    assert daemon.ipc in capsys.readouterr().out


def test_the_async_client_hedges_too_and_counts_the_late_reply(
    own_daemon: StartDaemon, daemon: RunningDaemon, reference: Reference
) -> None:
    slow = victim(own_daemon)
    first = random_input("mlp-light", 1, 9)

    async def run() -> None:
        async with AsyncClient([slow.ipc, daemon.ipc], timeout_ms=5000, hedge=True, hedge_after_ms=50) as client:
            while not all(counters.ok for counters in client.counters().values()):  # both connected
                await client.infer("mlp-light", first)
            slow.pause()
            try:
                for before in tries(client):  # until a call's first copy goes to the stopped daemon
                    started = time.monotonic()
                    result = await client.infer("mlp-light", first)
                    took_s = time.monotonic() - started
                    if went_first_to(client, slow.ipc, before):
                        break
                else:
                    raise AssertionError(f"no call went to the stopped daemon: {client.counters()}")
            finally:
                slow.resume()
            assert_close(result["scores"], reference.run("mlp-light", first))
            assert took_s < 1.0, f"the hedged call took {took_s:.2f} s"
            end = time.monotonic() + 10
            while since(client, slow.ipc, before)[7] == 0 and time.monotonic() < end:
                await asyncio.sleep(0.01)
            assert since(client, slow.ipc, before) == (1, 0, 0, 0, 0, 0, 0, 1)
            assert since(client, daemon.ipc, before) == (1, 1, 0, 0, 0, 1, 1, 0)

    asyncio.run(run())
