"""A socket per class beside each ipc endpoint (docs/protocol.md, "A socket per class"),
each read by its class's own loop (tests/serve/transport/test_loops.py): a request there
is of that class; health lists them; and clients that know nothing of them, or daemons
that have none, work as before."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgpack
import numpy as np
import zmq
from support import RunningDaemon, bounded, exchange

from edged.client import Client
from edged.wire.codec import encode_request
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
