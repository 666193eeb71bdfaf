"""Each socket has one owner (edged.serve.transport.loop): only its loop's thread reads
and writes it; other threads hand replies over, and none waits for the loop's tick; a
class's own socket is read while the shared socket's loop is busy; the other loops give
way to the highest class's, and to no other; a loop that closes answers what reached its
sockets first; a connection that closes is told on its loop alone."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from support import bounded, free_tcp_port

from edged.serve.transport import Route, peer, reply, when_closed
from edged.serve.transport.binding import Bound
from edged.serve.transport.loop import RECEIVE_BURST, Loop
from edged.serve.transport.sockets import Sockets
from edged.serve.transport.turns import Turns
from edged.wire.endpoints import class_endpoint

CLIENTS = 4
ROUND_TRIPS = 300
REPLY_TIMEOUT_MS = 5_000


class Echo:
    """A handler whose replies two worker threads send, as lane workers do."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.read_on: set[int] = set()
        self.workers = [threading.Thread(target=self._work, daemon=True) for _ in range(2)]
        for worker in self.workers:
            worker.start()

    def handle(self, route: Route, frames: list[Any], _received_ns: int, _more: bool) -> None:
        self.read_on.add(threading.get_ident())
        self.jobs.put((route, [bytes(frame) for frame in frames]))

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            reply(*job)

    def stop(self) -> None:
        for _ in self.workers:
            self.jobs.put(None)


@pytest.fixture
def echo(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Loop, Echo, str, list[int]]]:
    # A loop sleeps with no timeout: a request that a missed wake-up left waiting fails the test.
    sent_on: list[int] = []
    original = Bound.send

    def send(self: Bound, envelope: list[Any], frames: list[Any]) -> None:
        sent_on.append(threading.get_ident())
        original(self, envelope, frames)

    monkeypatch.setattr(Bound, "send", send)
    endpoint = f"ipc://{short_tmp}/echo.sock"
    sockets = Sockets((endpoint,), 1 << 20, ("only",), "only", class_sockets=False)
    handler = Echo()
    loop = Loop("only", sockets.by_class["only"], handler.handle)
    loop.start()
    yield loop, handler, endpoint, sent_on
    loop.close()
    assert loop.join(5)
    handler.stop()
    sockets.close()


def test_replies_from_other_threads_are_sent_by_the_loop_and_none_waits_for_the_tick(
    echo: tuple[Loop, Echo, str, list[int]], context: zmq.Context
) -> None:
    loop, handler, endpoint, sent_on = echo
    failures: list[str] = []

    def client(number: int) -> None:
        sock = bounded(context.socket(zmq.DEALER), REPLY_TIMEOUT_MS)
        sock.linger = 0
        sock.connect(endpoint)
        try:
            for i in range(ROUND_TRIPS):
                sent = [f"{number}".encode(), i.to_bytes(4, "little")]
                sock.send_multipart(sent)
                if not sock.poll(REPLY_TIMEOUT_MS) or sock.recv_multipart() != sent:
                    failures.append(f"client {number}: no or a wrong reply to request {i}")
                    return
        finally:
            sock.close()

    clients = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    assert not failures, failures
    # Read and written on the loop's thread alone, though the workers answered.
    assert handler.read_on == {loop._serving.ident}
    assert set(sent_on) == {loop._serving.ident} and len(sent_on) == CLIENTS * ROUND_TRIPS
    assert loop.unroutable == 0


def test_a_class_socket_is_read_while_the_shared_sockets_loop_is_busy(short_tmp: Path, context: zmq.Context) -> None:
    """The default class's loop owns the shared endpoint; held inside a call there, it
    delays nothing of realtime's, which its own loop reads."""
    shared = f"ipc://{short_tmp}/s.sock"
    sockets = Sockets((shared,), 1 << 20, ("realtime", "standard"), "standard")
    assert sockets.ingress == {
        "realtime": [class_endpoint(shared, "realtime")],
        "standard": [class_endpoint(shared, "standard")],
    }
    release, realtime_read = threading.Event(), threading.Event()
    loops = {
        "realtime": Loop("realtime", sockets.by_class["realtime"], lambda *_: realtime_read.set()),
        "standard": Loop("standard", sockets.by_class["standard"], lambda *_: release.wait(10)),
    }
    for loop in loops.values():
        loop.start()
    busy, fast = bounded(context.socket(zmq.DEALER)), bounded(context.socket(zmq.DEALER))
    try:
        busy.connect(shared)
        fast.connect(class_endpoint(shared, "realtime") or "")
        busy.send(b"a call that holds the shared loop")
        time.sleep(0.2)
        fast.send(b"realtime")
        assert realtime_read.wait(5), "realtime's request waited for the shared socket's loop"
        assert not release.is_set()
    finally:
        release.set()
        for loop in loops.values():
            loop.close()
            assert loop.join(5)
        busy.close(linger=0)
        fast.close(linger=0)
        sockets.close()


def test_each_classs_sockets_have_a_zeromq_io_thread_of_their_own(short_tmp: Path) -> None:
    """ZeroMQ's I/O threads move every message between the kernel and a socket. Realtime's
    sockets share one with no other class's, nor with the shared endpoints: where they shared
    bulk's, a burst on bulk's socket kept realtime's messages waiting behind it (docs/benchmarks.md,
    "I/O threads")."""
    shared = (f"ipc://{short_tmp}/io.sock", f"tcp://127.0.0.1:{free_tcp_port()}")
    names = ("realtime", "standard", "bulk")
    sockets = Sockets(shared, 1 << 20, names, "standard", tcp_ports={"realtime": free_tcp_port()})
    try:
        by_thread: dict[int, set[str]] = {}
        for one in (one for bound in sockets.by_class.values() for one in bound):
            # ZMQ_AFFINITY: a bit for each I/O thread that may serve the socket's connections.
            by_thread.setdefault(one.sock.getsockopt(zmq.AFFINITY), set()).add(one.klass or "shared")
        assert sorted(map(sorted, by_thread.values())) == [["bulk"], ["realtime"], ["shared"], ["standard"]]
        assert all(bin(affinity).count("1") == 1 for affinity in by_thread), by_thread
        assert len(sockets.by_class["realtime"]) == 2  # beside the ipc endpoint and on its tcp port
    finally:
        sockets.close()


def test_the_other_loops_give_way_to_the_highest_classs_loop_alone(short_tmp: Path, context: zmq.Context) -> None:
    """While realtime's loop is awake (here, inside a handler), bulk's reads nothing; while
    the standard loop is, bulk reads on: it waits for the highest class only."""
    shared = f"ipc://{short_tmp}/t.sock"
    names = ("realtime", "standard", "bulk")
    sockets = Sockets((shared,), 1 << 20, names, "standard")
    turns = Turns()
    held = {name: threading.Event() for name in names}  # a handler of that class is inside
    release = {name: threading.Event() for name in names}
    bulk_reads: queue.SimpleQueue[bytes] = queue.SimpleQueue()

    def read_bulk(_route: Route, frames: list[Any], _received_ns: int, _more: bool) -> None:
        bulk_reads.put(bytes(frames[0]))

    def holder(name: str) -> Any:
        def handle(_route: Route, frames: list[Any], _received_ns: int, _more: bool) -> None:
            held[name].set()
            release[name].wait(10)

        return handle

    loops = [
        Loop("realtime", sockets.by_class["realtime"], holder("realtime"), turns, top=True),
        Loop("standard", sockets.by_class["standard"], holder("standard"), turns, top=False),
        Loop("bulk", sockets.by_class["bulk"], read_bulk, turns, top=False),
    ]
    for loop in loops:
        loop.start()
    peers = {name: bounded(context.socket(zmq.DEALER)) for name in names}
    try:
        for name, peer in peers.items():
            peer.connect(class_endpoint(shared, name) or "")
        peers["realtime"].send(b"holds realtime's loop awake")
        assert held["realtime"].wait(5)
        peers["bulk"].send(b"first")
        with pytest.raises(queue.Empty):
            bulk_reads.get(timeout=0.5)  # bulk gives way to realtime
        release["realtime"].set()
        assert bulk_reads.get(timeout=5) == b"first"
        peers["standard"].send(b"holds the standard loop awake")
        assert held["standard"].wait(5)
        peers["bulk"].send(b"second")
        assert bulk_reads.get(timeout=5) == b"second", "bulk waited for the standard loop"
    finally:
        for event in release.values():
            event.set()
        for loop in loops:
            loop.close()
            assert loop.join(5)
        for peer in peers.values():
            peer.close(linger=0)
        sockets.close()


def test_a_closing_loop_answers_what_reached_its_sockets_and_sends_what_was_handed_over(
    short_tmp: Path, context: zmq.Context
) -> None:
    """Messages queued in the socket while the loop was busy are each read before it
    closes; replies handed over before `close` go out; work handed over after is counted lost."""
    endpoint = f"ipc://{short_tmp}/c.sock"
    sockets = Sockets((endpoint,), 1 << 20, ("only",), "only", class_sockets=False)
    hold, read = threading.Event(), []

    def handle(route: Route, frames: list[Any], _received_ns: int, _more: bool) -> None:
        read.append(bytes(frames[0]))
        if len(read) == 1:
            hold.wait(10)
        reply(route, [b"answer " + bytes(frames[0])])

    loop = Loop("only", sockets.by_class["only"], handle)
    loop.start()
    client = bounded(context.socket(zmq.DEALER))
    client.connect(endpoint)
    try:
        # More than a loop reads in two turns (RECEIVE_BURST each): the last are read only
        # by the closing loop's last turn.
        sent = 3 * RECEIVE_BURST + 8
        for i in range(sent):
            client.send(f"{i}".encode())
        time.sleep(0.3)  # all of them in the daemon's socket, the loop held on the first
        loop.close()
        hold.set()
        assert loop.join(5)
        answered = sorted(client.recv() for _ in range(sent))
        assert answered == sorted(f"answer {i}".encode() for i in range(sent))
        loop.call_soon(print, "never run")
        assert loop.lost == 1
    finally:
        client.close(linger=0)
        sockets.close()


def test_a_closing_loop_reads_its_other_socket_while_one_is_flooded(short_tmp: Path, context: zmq.Context) -> None:
    """Its last turn read each socket until empty, or its second ran out: a class socket fed
    faster than the loop reads kept the shared socket beside it unread, and a request that
    reached it in the stop had no reply. Now the sockets are read in turns."""
    endpoint = f"ipc://{short_tmp}/d.sock"
    sockets = Sockets((endpoint,), 1 << 20, ("only",), "only", class_sockets=True)
    own, shared = sockets.by_class["only"]  # its own socket first, read first
    probe = bounded(context.socket(zmq.DEALER))
    probe.connect(shared.endpoint)
    read: list[bytes] = []
    loop: Loop

    def handle(_route: Route, frames: list[Any], _received_ns: int, _more: bool) -> None:
        read.append(bytes(frames[0]))
        if loop._closing and b"sent" not in read:
            probe.send(b"probe")  # a client sends to the shared socket as the loop closes
            read.append(b"sent")
            time.sleep(0.02)  # there by now
        time.sleep(0.0001)  # slower than the flood comes

    loop = Loop("only", [own, shared], handle)
    loop.start()
    flooding = threading.Event()
    flooding.set()

    def flood() -> None:
        sock = context.socket(zmq.DEALER)
        sock.linger, sock.sndhwm = 0, 0
        sock.connect(own.endpoint)
        while flooding.is_set():
            try:
                sock.send(b"flood", zmq.NOBLOCK)
            except zmq.Again:
                time.sleep(0.0001)
        sock.close()

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        time.sleep(0.5)
        loop.close()
        assert loop.join(10)
    finally:
        flooding.clear()
        flooder.join()
        probe.close(linger=0)
        sockets.close()
    assert b"sent" in read and b"probe" in read, "the probe reached the shared socket and was never read"


def test_work_handed_over_as_the_loop_closes_is_counted_and_never_written_to_a_reused_descriptor() -> None:
    """A thread that found the loop open, then was paused before its wake-up, while the loop
    closed and was joined: its write went to whatever file reused the eventfd's number (or
    raised EBADF), and its work was neither run nor counted lost."""
    loop = Loop("only", [], lambda *_: None)
    checked, resume, failures = threading.Event(), threading.Event(), []
    real = loop.closed

    class PausedAfterTheCheck:
        """The loop's `closed`, pausing the handing thread just after it looked."""

        def is_set(self) -> bool:
            found = real.is_set()
            if threading.current_thread().name == "hander":
                checked.set()
                resume.wait(5)
            return found

        def set(self) -> None:
            real.set()

        def wait(self, timeout: float | None = None) -> bool:
            return real.wait(timeout)

    loop.closed = PausedAfterTheCheck()  # type: ignore[assignment]
    loop.start()

    def hand_over() -> None:
        try:
            loop.call_soon(print, "never run")
        except Exception as exc:
            failures.append(repr(exc))

    hander = threading.Thread(target=hand_over, name="hander")
    hander.start()
    assert checked.wait(5)
    loop._closing = True  # closed as `close` would, without handing the loop work
    os.eventfd_write(loop._wake, 1)
    joined: list[bool] = []
    joiner = threading.Thread(target=lambda: joined.append(loop.join(5)))
    joiner.start()
    time.sleep(0.2)  # long enough for the loop to close, and `join` to close the eventfd, if they may
    stranger = os.eventfd(0, os.EFD_NONBLOCK)  # takes the number a closed eventfd left free
    try:
        resume.set()
        hander.join(5)
        joiner.join(5)
        assert not failures and joined == [True] and real.is_set()
        with pytest.raises(BlockingIOError):
            os.eventfd_read(stranger)
        assert loop.lost == 1
    finally:
        os.close(stranger)


def test_a_closed_connection_is_told_on_its_loop_alone(short_tmp: Path, context: zmq.Context) -> None:
    """`when_closed`: the callback runs on the loop's thread once that client's connection
    closes, for it alone, with the connection (its peer, then its descriptor); asked from
    another thread, the loop refuses."""
    endpoint = f"ipc://{short_tmp}/w.sock"
    sockets = Sockets((endpoint,), 1 << 20, ("only",), "only", class_sockets=False)
    told: queue.SimpleQueue[tuple[bytes, bytes, int]] = queue.SimpleQueue()
    routes: dict[bytes, Route] = {}
    connections: dict[bytes, bytes] = {}
    read_on: list[int] = []

    def handle(route: Route, frames: list[Any], _received_ns: int, _more: bool) -> None:
        name = bytes(frames[0])
        routes[name], read_on[:] = route, [threading.get_ident()]
        connections[name] = when_closed(route, lambda connection: told.put((name, connection, threading.get_ident())))
        reply(route, [b"ok"])

    loop = Loop("only", sockets.by_class["only"], handle)
    loop.start()
    first, second = (bounded(context.socket(zmq.DEALER)) for _ in range(2))
    try:
        for client, name in ((first, b"first"), (second, b"second")):
            client.connect(endpoint)
            client.send(name)
            assert client.recv() == b"ok"
        assert connections[b"first"].startswith(peer(routes[b"first"]) + b"\0")
        assert connections[b"first"] != connections[b"second"]
        first.close(linger=0)
        assert told.get(timeout=5) == (b"first", connections[b"first"], read_on[0])
        with pytest.raises(RuntimeError, match="on its own thread"):
            when_closed(routes[b"second"], print)
        time.sleep(0.2)
        assert told.empty()  # the second client is still connected
        second.close(linger=0)
        assert told.get(timeout=5)[:2] == (b"second", connections[b"second"])
    finally:
        loop.close()
        assert loop.join(5)
        sockets.close()
