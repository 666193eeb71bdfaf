"""Many requests in flight on one socket, and a client that vanishes with requests in
flight: replies are matched by id, each comes exactly once, and nobody else suffers."""

from __future__ import annotations

from collections import Counter

import numpy as np
import zmq
from support import Reference, RunningDaemon, assert_close, connect, exchange, header, receive, wait_for

from edged.client import Client
from edged.wire.codec import encode_request

PIPELINED = 1000
STANDARD_QUEUE_CAPACITY = 128  # the default class's, in the shared daemon's built-in config


def standard_stats(sock: zmq.Socket) -> dict:
    return exchange(sock, [header(id="stats", op="stats")]).header["classes"]["standard"]


def test_thousand_pipelined_requests_are_each_answered_once_and_correctly(
    context: zmq.Context, endpoint: str, reference: Reference
) -> None:
    """Send all, then receive. Uneven row counts (1 to 4) make the daemon's batches
    mix requests of different sizes, so a reply with a neighbour's rows would show."""
    rng = np.random.default_rng(1000)
    rows = rng.integers(1, 5, size=PIPELINED)
    xs = [rng.standard_normal((int(n), 64), dtype=np.float32) for n in rows]
    expected = np.split(reference.run("mlp-light", {"x": np.concatenate(xs)}), np.cumsum(rows)[:-1])
    sock = connect(context, endpoint)
    sock.sndhwm = sock.rcvhwm = 0  # the client's own queues must not be what limits the test
    before = standard_stats(sock)
    for i, x in enumerate(xs):
        sock.send_multipart(encode_request(i, model="mlp-light", deadline_ms=60_000, inputs={"x": x}), copy=False)
    replies = [receive(sock) for _ in range(PIPELINED)]
    assert sock.poll(200) == 0, "a reply came beyond one per request"

    ids = Counter(reply.header["id"] for reply in replies)
    assert sorted(ids) == list(range(PIPELINED))
    assert set(ids.values()) == {1}
    statuses = Counter(reply.status for reply in replies)
    # Shedding on arrival is the daemon's right, so an OVERLOADED reply is correct;
    # anything else is not. How many are shed depends on the box's speed, but a queue
    # is only full once it holds its capacity, and a minute's deadline cannot expire.
    assert set(statuses) <= {"OK", "OVERLOADED"}, statuses
    assert statuses["OK"] >= STANDARD_QUEUE_CAPACITY, statuses
    for reply in replies:
        if reply.status == "OK":
            assert_close(reply.output(), expected[reply.header["id"]])
        else:
            assert reply.header["retry_after_ms"] > 0
            assert reply.payloads == []
    after = standard_stats(sock)
    calls, completed = after["backend_calls"] - before["backend_calls"], after["completed"] - before["completed"]
    assert completed == statuses["OK"]
    assert calls < completed, f"{completed} requests in {calls} backend calls: no batch mixed them"


def test_a_client_vanishing_mid_flight_harms_no_one(
    context: zmq.Context, daemon: RunningDaemon, reference: Reference
) -> None:
    watcher = connect(context, daemon.ipc)

    def bulk() -> dict:
        return exchange(watcher, [header(id="w", op="stats")]).header["classes"]["bulk"]

    before = bulk()
    leaver = connect(context, daemon.ipc)
    image = np.random.default_rng(0).standard_normal((1, 3, 64, 64), dtype=np.float32)
    x = np.random.default_rng(1).standard_normal((1, 64), dtype=np.float32)
    for i in range(100):  # a quarter of a second of cnn-heavy work or more: still in flight at the close
        leaver.send_multipart(encode_request(i, model="cnn-heavy", klass="bulk", inputs={"image": image}))
    for i in range(100, 400):
        leaver.send_multipart(encode_request(i, model="mlp-light", klass="bulk", inputs={"x": x}))
    wait_for(lambda: bulk()["received"] - before["received"] >= 400, 10, "the leaver's requests arrived")
    in_flight = bulk()["queue_depth"]
    leaver.close(linger=0)
    assert in_flight > 0, "the leaver left too late for this test to mean anything"

    # What is checked is that the others are served, and correctly: deadlines roomy enough
    # for a busy 2-core box (realtime's own 20 ms once expired here in a CI run, and with
    # two suites at once bulk's lane, starved behind the gone client's queue, priced it
    # at 6.5 s and shed a 5 s request: an honest answer, but not what this test checks).
    with Client(daemon.ipc, timeout_ms=70_000) as client:
        for klass in ("realtime", "standard", "bulk"):
            for seed in range(5):
                xs = np.random.default_rng(seed).standard_normal((2, 64), dtype=np.float32)
                deadline_ms = 60_000 if klass == "bulk" else 5000
                scores = client.infer("mlp-light", {"x": xs}, klass=klass, deadline_ms=deadline_ms)["scores"]
                assert_close(scores, reference.run("mlp-light", {"x": xs}))
        logits = client.infer("cnn-heavy", {"image": image}, deadline_ms=5000)["logits"]
        assert_close(logits, reference.run("cnn-heavy", {"image": image}))
        assert client.health()["state"] == "serving"
    # Replies to the gone client are dropped, and its work leaves the queue all the same.
    wait_for(lambda: bulk()["queue_depth"] == 0, 10, "the bulk queue drained")
