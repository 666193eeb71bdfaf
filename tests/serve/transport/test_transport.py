"""The socket loop with replies sent from other threads, as lane workers send them:
no request waits for the loop's tick, and a reply after close is dropped, not sent
on a closed socket."""

from __future__ import annotations

import inspect
import queue
import select
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import zmq
from support import bounded
from support.transport import NoSockets

from edged.serve.transport import Transport
from edged.serve.transport.server import Server

CLIENTS = 4
ROUND_TRIPS = 500
# Far longer than any round trip may take: a request that waits for the tick fails.
TICK_MS = 60_000
REPLY_TIMEOUT_MS = 5_000


@pytest.fixture
def echo(short_tmp: Path) -> Iterator[tuple[Server, str]]:
    """A Server whose every request two worker threads answer with its own frames."""
    endpoint = f"ipc://{short_tmp}/echo.sock"
    server = Server((endpoint,), 1 << 20)
    jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
    running = True

    def work() -> None:
        while (job := jobs.get()) is not None:
            server.reply(*job)

    workers = [threading.Thread(target=work, daemon=True) for _ in range(2)]
    for worker in workers:
        worker.start()

    def handle(route: Any, frames: list[Any], _received_ns: int, _klass: str | None) -> None:
        jobs.put((route, [bytes(frame) for frame in frames]))

    steering = SimpleNamespace(
        handle=handle,
        keep_running=lambda: running,
        tick=lambda: None,
        serve_tick=lambda: None,
        spin_deadline_ns=lambda: 0,
    )
    loop = threading.Thread(target=server.run, args=(steering, TICK_MS), name="loop", daemon=True)
    loop.start()
    yield server, endpoint
    running = False
    server.wake()
    loop.join(5)
    for _ in workers:
        jobs.put(None)
    for worker in workers:
        worker.join(5)
    server.close()


def test_replies_sent_by_other_threads_never_leave_a_request_waiting_for_the_tick(
    echo: tuple[Server, str], context: zmq.Context
) -> None:
    """A worker's send can take the edge of ZMQ_FD that a new request raised: the
    worker must then wake the loop, or that request waits for the tick (a minute)."""
    server, endpoint = echo
    failures: list[str] = []

    def client(number: int) -> None:
        sock = bounded(context.socket(zmq.DEALER), REPLY_TIMEOUT_MS)
        sock.linger = 0
        sock.connect(endpoint)
        try:
            for i in range(ROUND_TRIPS):
                sent = [f"{number}".encode(), i.to_bytes(4, "little")]
                sock.send_multipart(sent)
                if not sock.poll(REPLY_TIMEOUT_MS):
                    failures.append(f"client {number}: no reply to request {i}")
                    return
                if sock.recv_multipart() != sent:
                    failures.append(f"client {number}: a wrong reply to request {i}")
                    return
        finally:
            sock.close()

    start = time.monotonic()
    clients = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    assert not failures, failures
    assert time.monotonic() - start < REPLY_TIMEOUT_MS / 1000
    assert server.unroutable == 0


def server_and_client(context: zmq.Context, endpoint: str) -> tuple[Server, zmq.Socket]:
    """A Server on `endpoint` and a DEALER named b"client" connected to it."""
    server = Server((endpoint,), 1 << 20)
    client = bounded(context.socket(zmq.DEALER), REPLY_TIMEOUT_MS)
    client.linger = 0
    client.routing_id = b"client"
    client.connect(endpoint)
    return server, client


def test_a_send_off_the_loop_that_finds_a_request_waiting_wakes_the_loop(short_tmp: Path, context: zmq.Context) -> None:
    """The race above, made certain: a request waits, and a send from another thread
    is the socket's next use (which may take ZMQ_FD's edge): the loop must be woken."""
    server, client = server_and_client(context, f"ipc://{short_tmp}/edge.sock")
    try:
        client.send(b"request")
        time.sleep(0.2)  # it reaches the server's socket
        sender = threading.Thread(target=server.reply, args=((0, [b"client"]), [b"reply"]))
        sender.start()
        sender.join()
        assert client.poll(1000), "the reply was not sent"
        assert select.select([server._wake_fd], [], [], 0)[0], "the loop was not woken for the waiting request"
    finally:
        client.close()
        server.close()


def test_a_worker_that_finds_the_socket_taken_leaves_its_reply_to_the_loop(
    short_tmp: Path, context: zmq.Context
) -> None:
    """A worker never waits for the socket's lock (then for the GIL): the loop sends."""
    server, client = server_and_client(context, f"ipc://{short_tmp}/busy.sock")
    try:
        client.send(b"hello")  # the server learns the peer
        time.sleep(0.2)
        with server._bound[0].lock:  # the loop, reading
            sender = threading.Thread(target=server.reply, args=((0, [b"client"]), [b"reply"]))
            sender.start()
            sender.join(1)
            assert not sender.is_alive(), "the worker waited for the socket"
        assert select.select([server._wake_fd], [], [], 0)[0], "the loop was not told of the reply"
        assert not client.poll(100)
        server.flush()  # what the loop does on waking
        assert client.poll(1000) and client.recv() == b"reply"
    finally:
        client.close()
        server.close()


def test_a_reply_after_close_is_dropped(short_tmp: Path) -> None:
    """A worker the watchdog gave up on may answer after the daemon closed its sockets."""
    server = Server((f"ipc://{short_tmp}/closed.sock",), 1 << 20)
    server.close()
    server.reply((0, [b"peer"]), [b"late"])
    assert server.unroutable == 0


@pytest.mark.parametrize("implementation", [Server, NoSockets], ids=["Server", "the tests' NoSockets"])
def test_the_server_and_the_tests_stand_in_each_give_all_that_transport_asks(implementation: type) -> None:
    """What lanes and dispatch may ask of the sockets is Transport's members: the server
    must have each, with the same parameters, and so must the stand-in the in-process
    lane tests drive lanes with (else those tests would drive lanes differently)."""
    asked = {name for name in vars(Transport) if not name.startswith("_")}
    assert asked == {"reply", "wake", "ask", "run_aside", "unroutable", "ingress", "peer", "local"}
    for name in asked:
        wanted, given = getattr(Transport, name), getattr(implementation, name, None)
        assert given is not None, f"{implementation.__name__} has no {name}"
        if callable(wanted):
            assert inspect.signature(given).parameters.keys() == inspect.signature(wanted).parameters.keys(), name
