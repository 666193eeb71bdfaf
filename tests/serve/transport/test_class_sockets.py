"""A socket per class beside each ipc endpoint (docs/protocol.md, "A socket per class"):
the loop reads a higher class's socket first, even in the middle of a burst on a lower
one; a request there is of that class; health lists them; and clients that know
nothing of them, or daemons that have none, work as before."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from support import RunningDaemon, bounded, exchange

from edged.client import Client
from edged.serve.transport.server import PRIORITY_EVERY, Server
from edged.wire.codec import encode_request
from edged.wire.endpoints import class_endpoint

PEERS, EACH = 25, 4  # a burst of 100 messages on the shared socket, from peers the ROUTER queues fairly
X = np.zeros((1, 64), np.float32)


class Recorder:
    """A Steering that notes the socket of each message, holding the loop on the first
    one until `release` is set, so that everything sent meanwhile is queued at once."""

    def __init__(self) -> None:
        self.order: list[str | None] = []
        self.release = threading.Event()
        self.stop = False

    def handle(self, route: Any, frames: list[Any], received_ns: int, ingress: str | None) -> None:
        self.order.append(ingress)
        if len(self.order) == 1:
            self.release.wait(10)

    def keep_running(self) -> bool:
        return not self.stop

    def tick(self) -> None:
        """Nothing to steer."""

    def serve_tick(self) -> None:
        """Nothing to serve beyond the messages."""

    def spin_deadline_ns(self) -> int:
        return 0


@pytest.fixture
def recording(short_tmp: Path) -> Iterator[tuple[Server, Recorder, str]]:
    shared = f"ipc://{short_tmp}/s.sock"
    server = Server((shared,), 1 << 20, classes=("realtime", "bulk"))
    recorder = Recorder()
    loop = threading.Thread(target=server.run, args=(recorder, 50))
    loop.start()
    yield server, recorder, shared
    recorder.release.set()
    recorder.stop = True
    server.wake()
    loop.join(10)
    server.close()


def test_a_realtime_message_is_read_within_a_few_of_a_burst_queued_on_the_shared_socket(
    recording: tuple[Server, Recorder, str], context: zmq.Context
) -> None:
    server, recorder, shared = recording
    assert server.ingress == {
        "realtime": [class_endpoint(shared, "realtime")],
        "bulk": [class_endpoint(shared, "bulk")],
    }
    peers = [bounded(context.socket(zmq.DEALER)) for _ in range(PEERS)]
    for peer in peers:
        peer.connect(shared)
    realtime = bounded(context.socket(zmq.DEALER))
    realtime.connect(class_endpoint(shared, "realtime") or "")
    time.sleep(0.3)
    peers[0].send(b"first")  # the loop holds on this one while the rest queue
    deadline = time.monotonic() + 10
    while not recorder.order and time.monotonic() < deadline:
        time.sleep(0.01)
    for _ in range(EACH):
        for peer in peers:
            peer.send(b"bulk")
    realtime.send(b"realtime")
    time.sleep(0.5)  # everything in the daemon's pipes before the loop goes on
    recorder.release.set()
    while len(recorder.order) < 2 + PEERS * EACH and time.monotonic() < deadline:
        time.sleep(0.01)
    at = recorder.order.index("realtime")
    # Read at the first look between two of the burst's messages, not behind one from each peer.
    assert at <= 1 + PRIORITY_EVERY, (at, recorder.order[:12])
    for sock in (*peers, realtime):
        sock.close(linger=0)


def test_a_request_on_a_class_socket_is_of_that_class_and_health_lists_the_sockets(
    daemon: RunningDaemon, context: zmq.Context
) -> None:
    own = class_endpoint(daemon.ipc, "realtime")
    assert own is not None
    with Client(daemon.ipc) as client:
        assert client.health()["ingress"]["realtime"] == [own]
        before = client.stats()["classes"]["realtime"]["received"]
    sock = bounded(context.socket(zmq.DEALER))
    sock.connect(own)
    try:
        reply = exchange(sock, encode_request(1, model="mlp-light", inputs={"x": X}))
        assert reply.header["status"] == "OK"
        refused = exchange(sock, encode_request(2, model="mlp-light", klass="bulk", inputs={"x": X}))
        assert refused.header["status"] == "INVALID_ARGUMENT"
        assert "takes class 'realtime' alone" in refused.header["error"]
        assert exchange(sock, [msgpack.packb({"v": 1, "id": 3, "op": "health"})]).header["status"] == "OK"
    finally:
        sock.close(linger=0)
    with Client(daemon.ipc) as client:
        assert client.stats()["classes"]["realtime"]["received"] == before + 1


def test_the_client_falls_back_to_the_shared_socket_where_a_class_has_none(
    own_daemon: Callable[..., RunningDaemon],
) -> None:
    """With class sockets off, no realtime socket exists: the client, which tries the
    class's socket first, sends its realtime requests to the shared one, and they are
    served."""
    plain = own_daemon("[server]\nclass_sockets = false\n")
    with Client(plain.ipc) as client:
        assert client.health()["ingress"] == {}
        for _ in range(3):
            assert client.infer("mlp-light", {"x": X}, klass="realtime")["scores"].shape == (1, 10)
    assert not Path(str(class_endpoint(plain.ipc, "realtime"))[len("ipc://") :]).exists()
