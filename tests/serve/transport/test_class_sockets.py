"""A socket per class beside each ipc endpoint, and beside each tcp endpoint for a class
with a tcp_port (docs/protocol.md, "A socket per class"),
each read by its class's own loop (tests/serve/transport/test_loops.py): a request there
is of that class; health lists them; and clients that know nothing of them, or daemons
that have none, work as before."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq
from support import RunningDaemon, bounded, established, exchange, free_tcp_port, run_edged, short_dir, wait_for

from edged.client import AsyncClient, Client
from edged.client.sockets import ASK_AGAIN_S
from edged.wire.codec import Status, decode_request, encode_reply, encode_request
from edged.wire.endpoints import class_endpoint

X = np.zeros((1, 64), np.float32)


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
        empty = exchange(sock, encode_request(4, model="mlp-light", klass="", inputs={"x": X}))
        assert "takes class 'realtime' alone" in empty.header["error"], empty.header  # not read as no class
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


def three_classes(realtime: str) -> str:
    """A config of the three built-in classes, realtime's table given `realtime`'s lines."""
    return f"[classes.realtime]\n{realtime}\n[classes.standard]\n[classes.bulk]\n"


def test_a_tcp_port_gives_a_class_a_socket_beside_each_tcp_endpoint(
    own_daemon: Callable[..., RunningDaemon], context: zmq.Context
) -> None:
    """tcp_port: realtime's own tcp socket, listed in health, taking realtime alone; the
    client given the port connects to it at once and is served there."""
    port = free_tcp_port()
    running = own_daemon(three_classes(f"tcp_port = {port}"), tcp=True)
    assert running.tcp is not None
    own = f"tcp://127.0.0.1:{port}"
    assert class_endpoint(running.tcp, "realtime", port) == own
    with Client(running.tcp) as client:
        assert client.health()["ingress"]["realtime"] == [class_endpoint(running.ipc, "realtime"), own]
        before = client.stats()["classes"]["realtime"]["received"]
    sock = bounded(context.socket(zmq.DEALER))
    sock.connect(own)
    try:
        assert exchange(sock, encode_request(1, model="mlp-light", inputs={"x": X})).header["status"] == "OK"
        refused = exchange(sock, encode_request(2, model="mlp-light", klass="bulk", inputs={"x": X}))
        assert refused.header["status"] == "INVALID_ARGUMENT"
        assert "takes class 'realtime' alone" in refused.header["error"]
    finally:
        sock.close(linger=0)
    # Closing is the ZeroMQ I/O thread's to finish: until then the kernel keeps the connection.
    wait_for(lambda: not established(port), 5.0, "the raw socket's connection to close")
    with Client(running.tcp, class_ports={"realtime": port}) as client:
        # Connected before the first call, so that call finds it ready.
        wait_for(lambda: established(port), 5.0, "the client's connection to realtime's tcp socket")
        assert client.stats()["classes"]["realtime"]["received"] == before + 1
        for _ in range(3):
            assert client.infer("mlp-light", {"x": X}, klass="realtime")["scores"].shape == (1, 10)
        assert client.stats()["classes"]["realtime"]["received"] == before + 4


def test_a_tcp_client_given_no_class_ports_learns_them_from_health_and_connects_to_the_class_socket(
    own_daemon: Callable[..., RunningDaemon],
) -> None:
    """A client that names a class over tcp asks the daemon's health once for its class ports,
    the first call going the shared way meanwhile, then connects to realtime's own port;
    given `class_ports` (even none), it asks nothing and connects only where told."""
    port = free_tcp_port()
    running = own_daemon(three_classes(f"tcp_port = {port}"), tcp=True)
    assert running.tcp is not None
    with Client(running.tcp, class_ports={}) as told:
        for _ in range(3):
            assert told.infer("mlp-light", {"x": X}, klass="realtime")["scores"].shape == (1, 10)
        time.sleep(0.2)
        assert not established(port), "a client given class_ports connected where it was not told"
    with Client(running.tcp) as client:
        assert client.infer("mlp-light", {"x": X})["scores"].shape == (1, 10)  # no class named: nothing asked
        time.sleep(0.2)
        assert not established(port)
        for _ in range(3):
            assert client.infer("mlp-light", {"x": X}, klass="realtime")["scores"].shape == (1, 10)
        wait_for(lambda: established(port), 5.0, "the client's connection to realtime's tcp socket")
        # Its health request is not a call: its reply counts as nothing, late least of all.
        (counters,) = client.counters().values()
        assert counters.sent == 4 and counters.ok == 4 and counters.late == 0, counters


def test_the_async_client_learns_class_ports_from_health_too(own_daemon: Callable[..., RunningDaemon]) -> None:
    port = free_tcp_port()
    running = own_daemon(three_classes(f"tcp_port = {port}"), tcp=True)
    assert running.tcp is not None

    async def calls_then_connected() -> bool:
        async with AsyncClient(running.tcp) as client:
            for _ in range(3):
                assert (await client.infer("mlp-light", {"x": X}, klass="realtime"))["scores"].shape == (1, 10)
            end = time.monotonic() + 5.0
            while not established(port) and time.monotonic() < end:
                await asyncio.sleep(0.02)
            return established(port)

    assert asyncio.run(calls_then_connected()), "the async client never connected to realtime's tcp socket"


def test_a_client_whose_class_port_question_went_unanswered_asks_again(context: zmq.Context) -> None:
    """A daemon that stopped or restarted while answering the client's health request leaves
    it unanswered: the client asks again once ASK_AGAIN_S has passed, and then connects to
    the class's port (before, it went the shared way for good). The daemon here is a bare
    ROUTER speaking the protocol, which holds the first health request on purpose, and
    answers it only after the second: that late reply counts as no call's."""
    shared_port, realtime_port = free_tcp_port(), free_tcp_port()
    shared, own = context.socket(zmq.ROUTER), context.socket(zmq.ROUTER)
    shared.bind(f"tcp://127.0.0.1:{shared_port}")
    own.bind(f"tcp://127.0.0.1:{realtime_port}")
    ingress = {"realtime": [f"tcp://127.0.0.1:{realtime_port}"]}
    healths: list[float] = []
    held: list[list[bytes]] = []
    stop = threading.Event()

    def serve() -> None:
        poller = zmq.Poller()
        poller.register(shared, zmq.POLLIN)
        poller.register(own, zmq.POLLIN)
        while not stop.is_set():
            for sock, _ in poller.poll(50):
                envelope, *frames = sock.recv_multipart()
                request = decode_request(frames)
                if request.op == "health":
                    healths.append(time.monotonic())
                    reply = encode_reply(request.id, Status.OK, state="serving", ingress=ingress)
                    if len(healths) == 1:
                        held.append([envelope, *reply])  # unanswered for now
                        continue
                    sock.send_multipart([envelope, *reply])
                    for late in held:
                        sock.send_multipart(late)
                    held.clear()
                    continue
                reply = encode_reply(request.id, Status.OK, outputs={"scores": np.zeros((1, 10), np.float32)})
                sock.send_multipart([envelope, *reply])

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        with Client(f"tcp://127.0.0.1:{shared_port}") as client:
            end = time.monotonic() + 10 * ASK_AGAIN_S
            while not established(realtime_port) and time.monotonic() < end:
                assert client.infer("mlp-light", {"x": X}, klass="realtime")["scores"].shape == (1, 10)
                time.sleep(0.02)
            assert established(realtime_port), f"never connected to realtime's port; health asked at {healths}"
            # Not asked again at each call (one every 20 ms): about ASK_AGAIN_S apart, as read here,
            # where the first may have come in later than the client sent it.
            assert len(healths) == 2 and healths[1] - healths[0] >= ASK_AGAIN_S / 2, healths
            time.sleep(0.2)  # the held reply, sent after the second, has come in
            (counters,) = client.counters().values()
            assert counters.late == 0 and counters.failed == 0, counters
    finally:
        stop.set()
        server.join()
        shared.close(linger=0)
        own.close(linger=0)


@pytest.mark.parametrize(
    ("realtime", "endpoints", "refusal"),
    [
        ("tcp_port = {port}", "ipc", "classes.realtime.tcp_port = {port} sits beside a tcp endpoint"),
        ("tcp_port = {shared}", "ipc+tcp", "classes.realtime.tcp_port = {shared} is the port of a shared endpoint"),
    ],
    ids=["no tcp endpoint", "the shared endpoint's port"],
)
def test_a_tcp_port_with_nowhere_to_go_stops_start_up_naming_the_key(
    realtime: str, endpoints: str, refusal: str
) -> None:
    port, shared = free_tcp_port(), free_tcp_port()
    folder = short_dir()
    try:
        config = folder / "edged.toml"
        config.write_text(three_classes(realtime.format(port=port, shared=shared)))
        args = ["serve", "--config", str(config), "--endpoint", f"ipc://{folder}/d.sock"]
        if endpoints == "ipc+tcp":
            args += ["--endpoint", f"tcp://127.0.0.1:{shared}"]
        result = run_edged(*args)
        assert result.returncode == 1
        assert refusal.format(port=port, shared=shared) in result.stderr, result.stderr
    finally:
        shutil.rmtree(folder, ignore_errors=True)
