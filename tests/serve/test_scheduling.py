"""How the daemon schedules and fails work, on daemons of their own (each test changes
what a lane has learned): deadlines that pass in the queue, sheds, isolation between
classes, and backend failures, with the `lookup` and `sleeper` models of
tests/support/models.py."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq
from support import (
    RunningDaemon,
    connect,
    exchange,
    header,
    random_input,
    receive,
    short_dir,
    start_daemon,
    wait_for,
)
from support.models import PATIENT_WATCHDOGS, SLEEPER_WIDTH, TABLE, lookup_graph, save_model, save_sleeper, sleep_for

from edged.client import Client, DeadlineExceeded, Internal, Overloaded
from edged.wire.codec import encode_request
from edged.wire.endpoints import class_endpoint

StartDaemon = Callable[..., RunningDaemon]


def stats(sock: zmq.Socket, klass: str) -> dict:
    return exchange(sock, [header(id="stats", op="stats")]).header["classes"][klass]


@pytest.fixture(scope="module")
def repository() -> Iterator[Path]:
    root = short_dir()
    save_model(
        root,
        lookup_graph(),
        [{"name": "index", "dtype": "int64", "shape": [-1, 1]}],
        [{"name": "rows", "dtype": "float32", "shape": [-1, 1, 3]}],
    )
    save_sleeper(root)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def models_daemon(repository: Path, own_daemon: StartDaemon) -> RunningDaemon:
    return own_daemon(f'[server]\nmodel_repository = "{repository}"\n{PATIENT_WATCHDOGS}')


# --- deadlines and sheds ------------------------------------------------------------


def test_a_request_whose_deadline_passes_in_the_queue_is_not_run(
    context: zmq.Context, models_daemon: RunningDaemon
) -> None:
    """A job that runs far longer than its estimate (about 0.4 s), then a short-deadline
    one behind it: the second is admitted on the estimate and expires in the queue."""
    sock, watcher = connect(context, models_daemon.ipc), connect(context, models_daemon.ipc)
    sock.send_multipart(
        encode_request("long", model="sleeper", klass="bulk", deadline_ms=60_000, inputs=sleep_for(4000))
    )
    wait_for(lambda: stats(watcher, "bulk")["admitted"] == 1, 10, "the long request was admitted")
    with Client(models_daemon.ipc, timeout_ms=30_000) as client, pytest.raises(DeadlineExceeded) as caught:
        # The expiry is noticed when a worker takes the request, after the long job: wait for it.
        client.infer("sleeper", sleep_for(1), klass="bulk", deadline_ms=50, timeout_ms=60_000)
    assert "not run" in caught.value.message
    long = receive(sock, 60_000)
    assert long.status == "OK", long.header
    assert long.output()[0, 0] == 4000 * SLEEPER_WIDTH
    figures = stats(watcher, "bulk")
    assert (figures["admitted"], figures["expired"], figures["completed"]) == (2, 1, 1)
    assert figures["late_completed"] == 0  # the long one had 60 s


def test_a_request_answered_past_its_deadline_is_counted_late(models_daemon: RunningDaemon) -> None:
    """Priced from warm-up at n = 0, a call of about 0.4 s is admitted with 100 ms to spare,
    runs, and is answered OK: late, which only the late_completed counter tells."""
    with Client(models_daemon.ipc, timeout_ms=60_000) as client:
        client.infer("sleeper", sleep_for(4000), klass="standard", deadline_ms=100)
        wait_for(lambda: client.stats()["classes"]["standard"]["completed"] == 1, 10, "the stats to settle")
        figures = client.stats()["classes"]["standard"]
    assert figures["late_completed"] == 1


def test_a_deadline_below_the_models_service_time_is_shed_every_time(
    context: zmq.Context, own_daemon: StartDaemon
) -> None:
    """docs/protocol.md: a deadline_ms below the model's own service time is shed
    (OVERLOADED, at once), every time; not admitted to expire in the queue."""
    running = own_daemon()
    sock = connect(context, running.ipc)
    for klass in ("realtime", "standard", "bulk"):
        for attempt in range(3):
            frames = encode_request(
                f"{klass}-{attempt}",
                model="cnn-heavy",
                klass=klass,
                deadline_ms=0.001,
                inputs=random_input("cnn-heavy", 1, 0),
            )
            reply = exchange(sock, frames)
            assert reply.status == "OVERLOADED", (klass, attempt, reply.header)
            assert reply.header["retry_after_ms"] >= 0.1


def test_one_large_batch_does_not_lock_a_class_out(own_daemon: StartDaemon) -> None:
    """After a big request has finished and the lane is idle, a small request that the
    lane can easily serve in its deadline is served again, at least after backing off
    as long as retry_after_ms says."""
    running = own_daemon()
    small = random_input("cnn-heavy", 1, 0)
    with Client(running.ipc, timeout_ms=30_000) as client:
        client.infer("cnn-heavy", small, klass="realtime")  # about 3 ms, in a 20 ms budget
        client.infer("cnn-heavy", random_input("cnn-heavy", 128, 1), klass="realtime", deadline_ms=60_000)
        time.sleep(0.2)
        refusals = []
        for _ in range(5):
            try:
                reply = client.infer_reply("cnn-heavy", small, klass="realtime")
                break
            except Overloaded as shed:
                refusals.append(f"{shed.message} (retry after {shed.retry_after_ms} ms)")
                time.sleep(shed.retry_after_ms / 1000)
        else:
            pytest.fail(f"an idle realtime lane sheds a 1-row cnn-heavy request after every back-off: {refusals}")
    assert reply.header["timing_us"]["compute"] < 20_000


def test_long_work_in_one_class_does_not_hold_up_another(context: zmq.Context, models_daemon: RunningDaemon) -> None:
    """A standard request that runs for most of a second, then a realtime one from
    another client: realtime has its own loop and lane, so it is answered while
    standard's work is still running (the README: a realtime request never waits behind
    another class's work). The sleeper is priced by a short warm-up: its first long run,
    inline on standard's loop, teaches the lane its price, so the second runs on
    standard's worker."""
    running = models_daemon
    slow, fast, watcher = (connect(context, running.ipc) for _ in range(3))
    long_run = encode_request("slow", model="sleeper", klass="standard", deadline_ms=60_000, inputs=sleep_for(8000))
    assert exchange(slow, long_run, 60_000).status == "OK"
    calls = stats(watcher, "standard")["backend_calls"]
    slow.send_multipart(long_run)
    wait_for(lambda: stats(watcher, "standard")["backend_calls"] == calls + 1, 10, "the slow request to start")
    own = connect(context, class_endpoint(running.ipc, "realtime") or "")
    for sock in (fast, own):  # the shared endpoint, and realtime's own socket
        quick = exchange(
            sock, encode_request("quick", model="mlp-light", klass="realtime", inputs=random_input("mlp-light", 1, 0))
        )
        assert quick.status == "OK", quick.header
    assert not slow.poll(0), "the realtime request was answered only after the standard one finished"
    assert receive(slow, 60_000).status == "OK"


# --- backend failures ---------------------------------------------------------------


def index(*values: int) -> dict[str, np.ndarray]:
    return {"index": np.array(values, dtype=np.int64).reshape(-1, 1)}


def test_backend_failure_is_internal_and_the_daemon_serves_on(models_daemon: RunningDaemon) -> None:
    with Client(models_daemon.ipc) as client:
        np.testing.assert_array_equal(client.infer("lookup", index(2, 9))["rows"], TABLE[[2, 9]][:, None, :])
        with pytest.raises(Internal) as caught:
            client.infer("lookup", index(99))
        assert "backend failed" in caught.value.message
        assert set(caught.value.reply.header["timing_us"]) == {"queue", "compute", "total"}
        np.testing.assert_array_equal(client.infer("lookup", index(4))["rows"], TABLE[[4]][:, None, :])
        assert client.health()["state"] == "serving"


def test_a_failing_request_in_a_batch_fails_alone(context: zmq.Context, models_daemon: RunningDaemon) -> None:
    """bulk batches what is queued; the one bad request among them gets INTERNAL, each
    of the others its own rows."""
    sock, holder, watcher = (connect(context, models_daemon.ipc) for _ in range(3))
    # bulk's one worker is held by a long call while every lookup queues behind it, so
    # they are taken in full batches, each holding a bad request.
    holder.send_multipart(encode_request("hold", model="sleeper", klass="bulk", inputs=sleep_for(8000)))
    wait_for(lambda: stats(watcher, "bulk")["backend_calls"] == 1, 10, "the long call to start")
    rounds, per_round, bad = 5, 12, 6
    for r in range(rounds):
        for i in range(per_round):
            value = 99 if i == bad else (r + i) % 10
            # A deadline far past the long call, which a busy box stretches past bulk's 5 s.
            request = encode_request(
                f"{r}-{i}-{value}", model="lookup", klass="bulk", deadline_ms=60_000, inputs=index(value)
            )
            sock.send_multipart(request)
    wait_for(lambda: stats(watcher, "bulk")["admitted"] == 1 + rounds * per_round, 10, "the lookups to queue")
    assert not holder.poll(0), "the long call ended before the lookups queued: nothing was batched"
    for _ in range(rounds * per_round):
        reply = receive(sock, 60_000)  # the first waits out the long call, which a busy box stretches
        value = int(reply.header["id"].split("-")[2])
        if value == 99:
            assert reply.status == "INTERNAL", reply.header
        else:
            assert reply.status == "OK", reply.header
            np.testing.assert_array_equal(reply.output(), TABLE[[value]][:, None, :])
    assert receive(holder, 60_000).status == "OK"
    figures = stats(watcher, "bulk")
    assert (figures["failed"], figures["completed"]) == (rounds, rounds * (per_round - 1) + 1)
    # Run alone, the lookups make 60 rows; more means failed batches were retried one by one.
    lookup_rows = figures["backend_rows"] - 1
    assert lookup_rows > rounds * per_round, f"no batch held a bad request: {figures['backend_calls']} calls"


def test_a_batch_wait_ends_in_time_for_the_requests_it_holds() -> None:
    """A worker waited batch_wait_us to fill a batch whatever the jobs in hand had left: a
    request with a shorter deadline than the wait expired in it, and a wait of 2**40 us hung
    the lane (a review's probe). The wait leaves each held request its run."""
    bulk = "[classes.bulk]\ndeadline_ms = 60000.0\nbatch_wait_us = 2000000\n"
    running = start_daemon('[server]\ndefault_class = "bulk"\n' + bulk)
    try:
        with Client(running.ipc) as client:
            started = time.monotonic()
            scores = client.infer("mlp-light", {"x": np.ones((1, 64), np.float32)}, klass="bulk", deadline_ms=300)
            took_s = time.monotonic() - started
        assert scores["scores"].shape == (1, 10)
        assert took_s < 1.5, took_s  # not the 2 s wait: a fifth of it at most beyond the deadline
    finally:
        running.close()
