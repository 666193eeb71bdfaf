"""Admission through the real daemon: full queues and unmeetable deadlines are shed
at once, expired work is answered and not run, realtime holds while bulk floods."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator

import msgpack
import numpy as np
import pytest
import zmq
from support import connect

from edged.client import Client
from edged.loadgen.launch import DaemonProcess
from edged.loadgen.sweep import Stream, run_load
from edged.wire.codec import encode_request

CONFIG = """
[classes.realtime]
order = 0
queue_capacity = 32
deadline_ms = 50
max_batch = 4
inline_max_us = 300

[classes.standard]
order = 1
queue_capacity = 64
max_batch = 1

[classes.bulk]
order = 2
queue_capacity = 8
deadline_ms = 60000
max_batch = 4
batch_wait_us = 500
nice = 10
"""
HEAVY_INPUTS = [{"name": "image", "dtype": "float32", "shape": [-1, 3, 64, 64]}]
LIGHT_INPUTS = [{"name": "x", "dtype": "float32", "shape": [-1, 64]}]


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    folder = tempfile.mkdtemp(prefix="ed-ovl-", dir="/tmp")
    config = f"{folder}/edged.toml"
    with open(config, "w") as f:
        f.write(CONFIG)
    endpoint = f"ipc://{folder}/edged.sock"
    with DaemonProcess([endpoint], config=config, log_path=f"{folder}/daemon.log") as daemon:
        daemon.wait_serving()
        yield endpoint


def send_all(endpoint: str, requests: list[list]) -> dict[int, dict]:
    """Send every request at once on one DEALER socket; return each id's one reply header."""
    sock = connect(zmq.Context.instance(), endpoint)
    try:
        for frames in requests:
            sock.send_multipart(frames, copy=False)
        replies: dict[int, dict] = {}
        end = time.monotonic() + 60
        while len(replies) < len(requests) and time.monotonic() < end:
            if sock.poll(1000):
                header = msgpack.unpackb(sock.recv_multipart()[0])
                assert header["id"] not in replies, f"request {header['id']} answered twice"
                replies[header["id"]] = header
        assert len(replies) == len(requests), "some requests got no reply"
        return replies
    finally:
        sock.close()


def heavy(request_id: int, rows: int = 1, **fields) -> list:
    return encode_request(
        request_id, model="cnn-heavy", inputs={"image": np.zeros((rows, 3, 64, 64), np.float32)}, **fields
    )


def class_stats(endpoint: str, name: str) -> dict:
    with Client(endpoint) as client:
        return client.stats()["classes"][name]


def test_full_queue_sheds_at_once_with_a_retry_hint(endpoint):
    before = class_stats(endpoint, "bulk")
    replies = send_all(endpoint, [heavy(i, klass="bulk") for i in range(100)])
    shed = [r for r in replies.values() if r["status"] == "OVERLOADED"]
    ok = [r for r in replies.values() if r["status"] == "OK"]
    assert len(shed) + len(ok) == 100
    assert len(shed) >= 50, "a queue of 8 cannot have taken most of 100 requests sent at once"
    for reply in shed:
        assert reply["retry_after_ms"] > 0
        assert "queue_capacity" in reply["error"]
        assert reply["timing_us"]["total"] < 50_000  # immediate, with a wide margin for a loaded CI box
    after = class_stats(endpoint, "bulk")
    assert after["shed"]["queue_full"] - before["shed"]["queue_full"] == len(shed)
    assert after["backend_rows"] - before["backend_rows"] == len(ok), "shed work must never run"


def test_a_deadline_shorter_than_one_run_is_shed_at_once_and_never_run(endpoint):
    before = class_stats(endpoint, "standard")
    replies = send_all(endpoint, [heavy(i, klass="standard", deadline_ms=0.001) for i in range(5)])
    for reply in replies.values():
        assert reply["status"] == "OVERLOADED"
        assert "cannot meet the deadline" in reply["error"] and "longer deadline" in reply["error"]
    after = class_stats(endpoint, "standard")
    assert after["shed"]["deadline"] - before["shed"]["deadline"] == 5
    assert after["backend_rows"] == before["backend_rows"], "shed work must never run"


def test_realtime_keeps_answering_while_bulk_is_flooded(endpoint):
    streams = [Stream("realtime", "mlp-light", 50, 50.0), Stream("bulk", "cnn-heavy", 1000, 60000.0)]
    realtime, bulk = run_load(endpoint, streams, {"mlp-light": LIGHT_INPUTS, "cnn-heavy": HEAVY_INPUTS}, 3.0)
    for row in (realtime, bulk):
        answered = row["ok"] + row["overloaded"] + row["deadline_exceeded"] + row["other"]
        assert answered == row["sent"] and row["lost"] == 0 and row["duplicated"] == 0, row
    assert bulk["overloaded"] > 0, "the flood was not a flood"
    assert realtime["ok_fraction"] >= 0.95, realtime
    assert realtime["latency_us"]["p99"] < 100_000, realtime  # gross margin: benchmarks carry the real figures
    # Beside each round trip, the daemon's own span of it (timing_us), which is a part of it.
    assert 0 < realtime["in_daemon_us"]["p99"] <= realtime["latency_us"]["p99"], realtime


def test_a_load_whose_replies_are_all_in_ends_with_its_run_not_its_patience_for_lost_replies(endpoint):
    """The generator waited out its whole patience for lost replies (bulk's is 30 s in the GPU
    benchmark) when every reply came in before its run ended: a 1 s run took 31 s."""
    started = time.monotonic()
    (row,) = run_load(endpoint, [Stream("realtime", "mlp-light", 20, 1000.0)], {"mlp-light": LIGHT_INPUTS}, 1.0, 20_000)
    assert row["ok"] == row["sent"] > 0, row
    assert time.monotonic() - started < 6.0  # 1 s of load: five times over, and far from 21 s


def test_class_counters_add_up(endpoint):
    """Every request lands in exactly one counter. The test makes each kind itself
    (completed, shed for a full queue, shed for its deadline), so the sums are not
    zeros that prove nothing."""
    before = class_stats(endpoint, "bulk")
    # First those that cannot meet their deadline (a full queue would shed them first).
    requests = [heavy(100 + i, klass="bulk", deadline_ms=0.001) for i in range(3)]
    requests += [heavy(i, klass="bulk") for i in range(60)]
    send_all(endpoint, requests)
    after = class_stats(endpoint, "bulk")
    delta = {key: after[key] - before[key] for key in ("received", "admitted", "completed", "failed", "expired")}
    shed = {key: after["shed"][key] - before["shed"][key] for key in ("queue_full", "deadline")}
    assert delta["received"] == len(requests)
    assert delta["completed"] > 0 and shed["queue_full"] > 0 and shed["deadline"] > 0, (delta, shed)
    assert after["queue_depth"] == 0
    assert delta["received"] == delta["admitted"] + sum(shed.values())
    assert delta["admitted"] == delta["completed"] + delta["failed"] + delta["expired"]
    assert after["received"] == after["admitted"] + sum(after["shed"].values())
    assert after["admitted"] == after["completed"] + after["failed"] + after["expired"] + after["queue_depth"]
