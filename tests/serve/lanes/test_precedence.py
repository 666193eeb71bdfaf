"""Precedence between lanes: a lower class yields while a higher one has work, and its
calls are capped by max_call_ms."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq
from support import (
    REPO_ROOT,
    connect,
    exchange,
    header,
    random_input,
    receive,
    wait_for,
)

from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry, Variant
from edged.protocol import encode_request
from edged.serve.lanes.batching import Job
from edged.serve.lanes.precedence import Precedence
from edged.serve.lanes.worker import Worker
from edged.serve.pricing import ServiceTimes
from edged.wire.codec import TensorSpec
from edged.wire.signature import Signature

ENGINES = REPO_ROOT / "engines"


@dataclass
class FakeBacklog:
    depth: int = 0
    work_ns: int = 0
    yielded: int = 0

    def yielding(self, waiting: bool) -> None:
        self.yielded += not waiting


def test_a_yielding_worker_waits_while_a_higher_class_has_work_and_goes_when_it_is_done() -> None:
    precedence, realtime, bulk = Precedence(), FakeBacklog(), FakeBacklog()
    precedence.join(0, realtime)
    precedence.join(2, bulk)
    realtime.depth = 1
    went = threading.Event()

    def bulk_worker() -> None:
        precedence.wait_turn(2)
        went.set()

    thread = threading.Thread(target=bulk_worker)
    thread.start()
    assert not went.wait(0.2), "bulk started while realtime had work"
    assert not precedence.busy_above(0), "nothing is above the highest class"
    realtime.depth = 0
    precedence.idle()
    assert went.wait(5), "bulk never went once realtime was idle"
    thread.join()


# --- on a real daemon ---------------------------------------------------------------


def class_stats(sock: zmq.Socket, klass: str) -> dict:
    return exchange(sock, [header(id="s", op="stats")]).header["classes"][klass]


def heavy(request_id: str, rows: int, klass: str, seed: int = 0) -> tuple[list, dict[str, np.ndarray]]:
    inputs = random_input("cnn-heavy", rows, seed)
    return encode_request(request_id, model="cnn-heavy", klass=klass, deadline_ms=60_000, inputs=inputs), inputs


def test_bulk_starts_no_call_while_realtime_computes_and_then_runs_capped_calls(
    context: zmq.Context, own_daemon
) -> None:
    """The defaults: bulk yields to realtime, and its calls are sized to a quarter of
    realtime's 20 ms deadline, however much of it waits. Realtime's watchdog waits a
    minute here: its long call takes most of a second, more on a busy box."""
    running = own_daemon("[classes.realtime]\nstuck_after_ms = 60000\n[classes.standard]\n[classes.bulk]\n")
    rt, bulk, watcher = (connect(context, running.ipc) for _ in range(3))
    frames, _ = heavy("long", 512, "realtime")  # most of a second of compute, on realtime's lane
    rt.send_multipart(frames)
    wait_for(lambda: class_stats(watcher, "realtime")["backend_calls"] == 1, 10, "realtime's call to start")
    before = class_stats(watcher, "bulk")
    for i in range(64):
        bulk.send_multipart(heavy(f"b{i}", 1, "bulk", seed=i)[0])
    wait_for(lambda: class_stats(watcher, "bulk")["admitted"] - before["admitted"] == 64, 10, "bulk to queue")
    time.sleep(0.1)  # room for a bulk call to start, were bulk not yielding
    during = class_stats(watcher, "bulk")
    assert not rt.poll(0), "realtime's call ended too soon for this test to mean anything"
    assert during["backend_calls"] == before["backend_calls"], "bulk started a call while realtime computed"
    assert receive(rt, 60_000).status == "OK"
    assert all(receive(bulk, 60_000).status == "OK" for _ in range(64))
    after = class_stats(watcher, "bulk")
    calls = after["backend_calls"] - before["backend_calls"]
    rows_per_call = (after["backend_rows"] - before["backend_rows"]) / calls
    # Uncapped, 64 queued requests go in calls of max_batch (16); a 5 ms cap holds about 3 rows here.
    assert rows_per_call <= 8, f"{calls} calls of {rows_per_call:.1f} rows each: the cap did not hold"


def sized_job(rows: int, row_ns: int) -> Job:
    """A job of a model priced by its row size (a dynamic dimension besides the batch)."""
    signature = Signature((TensorSpec("x", "float32", (-1, -1)),), (TensorSpec("y", "float32", (-1, -1)),))
    model = ModelEntry("padder", "", signature, Variant("fp32", "onnxruntime", Path("unused.onnx")))
    x = np.zeros((rows, 8), np.float32)
    return Job(None, 1, model, {"x": x}, ("y",), 0, 10**18, rows * row_ns, rows=rows, elements=8)


def test_a_size_priced_call_is_capped_by_its_own_price_not_the_lanes_average_of_every_size() -> None:
    """Cheap small sizes pull the lane's per-row average down; a call of a large size must
    still be capped by what its rows cost: 2 ms a row under a 5 ms cap is 2 rows."""
    service = ServiceTimes()
    for _ in range(20):
        service.observe("padder", 100_000, 1, 8)  # 0.1 ms a row, at a small size
    klass = ClassConfig("bulk", order=2, max_batch=16, yields=True, max_call_ms=5.0)
    worker = Worker(klass, [], None, None, None, None, service, Precedence())
    assert worker._row_cap(sized_job(1, 2_000_000)) == 2
    assert worker._row_cap(sized_job(1, 10_000_000)) == 1  # a job is never split
