"""Clients that go wrong: one vanishes with replies pending, one stops reading. The
daemon's loop never blocks on either, drops what cannot be delivered and counts it in
`stats` as `unroutable`, and nobody else is slowed. A daemon of this module's own, so
that the counts are this module's alone."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
import zmq
from support import RunningDaemon, bounded, connect, exchange, header, start_daemon, wait_for

from edged.loadgen.launch import resident_kib
from edged.wire.codec import encode_request

X = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
IMAGE = np.random.default_rng(0).standard_normal((1, 3, 64, 64), dtype=np.float32)
# A realtime round trip takes well under a millisecond here. A loop that blocked on a
# gone or full peer would hang, or park every reply behind the drops: the typical
# round trip then grows by the drain time (hundreds of ms). The median bound is 25x
# above the expected value, the worst-case bound 2 s, so a busy box does not trip them.
TYPICAL_MS = 25.0
WORST_MS = 2000.0


def assert_served_as_usual(latencies: list[float]) -> None:
    assert float(np.median(latencies)) < TYPICAL_MS, sorted(latencies)
    assert max(latencies) < WORST_MS, sorted(latencies)[-5:]


@pytest.fixture(scope="module")
def running() -> Iterator[RunningDaemon]:
    daemon = start_daemon()
    yield daemon
    daemon.close()


def stats(sock: zmq.Socket) -> dict:
    return exchange(sock, [header(id="stats", op="stats")]).header


def round_trip_ms(sock: zmq.Socket, request_id: int) -> float:
    """One realtime mlp-light request on a socket nobody else uses; its latency."""
    started = time.perf_counter()
    # A roomy deadline: latency is what is measured here, so a slow answer must come back as one.
    frames = encode_request(request_id, model="mlp-light", klass="realtime", deadline_ms=5000, inputs={"x": X})
    reply = exchange(sock, frames)
    assert reply.status == "OK" and reply.header["id"] == request_id, reply.header
    return (time.perf_counter() - started) * 1000


def test_replies_to_a_vanished_client_are_dropped_counted_and_cost_nothing(
    context: zmq.Context, running: RunningDaemon
) -> None:
    watcher = connect(context, running.ipc)
    other = connect(context, running.ipc)
    round_trip_ms(other, 0)  # the connection's own first cost is not what is measured
    first = stats(watcher)
    rss_before = resident_kib(running.pid)
    pending_at_close, latencies = 0, []
    for round_ in range(3):
        before = stats(watcher)["classes"]["bulk"]["received"]
        leaver = connect(context, running.ipc)
        for i in range(300):  # most of a second of cnn-heavy work: nearly all of it still queued at the close
            leaver.send_multipart(encode_request(i, model="cnn-heavy", klass="bulk", inputs={"image": IMAGE}))
        wait_for(
            lambda before=before: stats(watcher)["classes"]["bulk"]["received"] - before >= 300,
            10,
            "the requests arrived",
        )
        pending_at_close += stats(watcher)["classes"]["bulk"]["queue_depth"]
        leaver.close(linger=0)
        # While the gone client's work drains, another client is served as usual.
        latencies += [round_trip_ms(other, 100 * round_ + i) for i in range(20)]
        wait_for(lambda: stats(watcher)["classes"]["bulk"]["queue_depth"] == 0, 20, "the bulk queue drained")
    dropped = stats(watcher)["unroutable"] - first["unroutable"]
    # A reply sent in the moment before ZeroMQ notices the close goes into the dying
    # connection uncounted; every later one must be counted.
    assert 0.8 * pending_at_close <= dropped <= 900, (dropped, pending_at_close)
    assert_served_as_usual(latencies)
    grown_mib = (resident_kib(running.pid) - rss_before) / 1024
    assert grown_mib < 32, f"the daemon grew by {grown_mib:.0f} MiB over three vanished clients"


def test_a_client_that_stops_reading_slows_no_one_and_its_drops_are_counted(
    context: zmq.Context, running: RunningDaemon
) -> None:
    watcher = connect(context, running.ipc)
    other = connect(context, running.ipc)
    round_trip_ms(other, 0)
    before = stats(watcher)["unroutable"]
    slow = bounded(context.socket(zmq.DEALER))  # its high-water marks must be set before it connects
    slow.linger = 0
    slow.rcvhwm = 100  # it stops reading: ZeroMQ holds its replies up to the high-water marks, then refuses
    slow.sndhwm = 0
    slow.connect(running.ipc)
    sent, latencies = 0, []
    # Long ids make replies big enough to fill the kernel's socket buffers too.
    for burst in range(20):
        for _ in range(1000):
            slow.send_multipart([header(id=f"{sent:064d}", op="health")])
            sent += 1
        latencies.append(round_trip_ms(other, burst + 1))
    wait_for(lambda: stats(watcher)["unroutable"] - before > 0, 10, "replies to the slow client were dropped")
    # Thousands of replies wait for the slow client now; others are still served at once.
    latencies += [round_trip_ms(other, 100 + i) for i in range(20)]
    received = 0
    while slow.poll(500):  # quiet for half a second: the daemon has answered all it sent
        slow.recv_multipart()
        received += 1
    slow.close(linger=0)
    dropped = stats(watcher)["unroutable"] - before
    assert received >= 1000, f"only {received} replies were held for the slow client"
    # Nothing lost without a trace: each reply was either delivered or counted as dropped.
    assert received + dropped == sent, (received, dropped, sent)
    assert_served_as_usual(latencies)
