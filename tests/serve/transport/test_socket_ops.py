"""Every op the daemon knows is answered on every kind of ZeroMQ socket, as
docs/protocol.md's table "Which socket answers which op" lists: the shared ipc and tcp
endpoints and a class's own sockets beside them (ipc, and tcp on the class's tcp_port).
Raw frames on real DEALER sockets, one daemon."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from multiprocessing import shared_memory

import numpy as np
import pytest
import zmq
from support import REPO_ROOT, RawReply, RunningDaemon, connect, exchange, free_tcp_port, header, start_daemon

from edged.client import Client
from edged.wire.codec import encode_request
from edged.wire.messages import OPS, ShmRef

X = np.random.default_rng(2).standard_normal((1, 64)).astype(np.float32)
X_SPEC = {"name": "x", "dtype": "float32", "shape": [1, 64]}


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    """Every kind of socket: shared ipc and tcp, and realtime's beside each (its tcp_port)."""
    config = "[shm]\nenabled = true\ntrust_posix_names = true\n"
    config += f"[classes.realtime]\ntcp_port = {free_tcp_port()}\n[classes.standard]\n[classes.bulk]\n"
    running = start_daemon(config, tcp=True)
    yield running
    running.close()


@pytest.fixture
def region() -> Iterator[shared_memory.SharedMemory]:
    made = shared_memory.SharedMemory(name=f"edged-ops-{os.getpid()}-{time.monotonic_ns()}", create=True, size=4096)
    yield made
    made.unlink()
    made.close()


def endpoint(daemon: RunningDaemon, kind: str) -> str:
    if kind == "shared tcp":
        assert daemon.tcp is not None
        return daemon.tcp
    if kind == "shared ipc":
        return daemon.ipc
    if kind == "realtime tcp socket":
        with Client(daemon.ipc) as client:
            return next(e for e in client.health()["ingress"]["realtime"] if e.startswith("tcp://"))
    return daemon.ipc.replace("d.sock", f"d-{kind.split()[0]}.sock")  # "realtime socket": its class's


def ask(where: str, op: str, obj: shared_memory.SharedMemory) -> RawReply:
    """`op` sent on the socket at `where`; shm_unregister after a shm_register there."""
    with zmq.Context() as context, connect(context, where) as sock:
        if op == "infer":
            return exchange(sock, [header(id=1, model="mlp-light", inputs=[X_SPEC]), X.tobytes()])
        if op in ("models", "health", "stats"):
            return exchange(sock, [header(id=1, op=op)])
        registered = exchange(sock, encode_request(1, "shm_register", region=ShmRef(obj.name, 0, obj.size)))
        if op == "shm_register" or "region" not in registered.header:
            return registered
        return exchange(sock, encode_request(2, "shm_unregister", region=ShmRef(registered.header["region"], 0, 0)))


@pytest.mark.parametrize("kind", ["shared ipc", "shared tcp", "realtime socket", "bulk socket", "realtime tcp socket"])
def test_every_op_is_answered_on_every_kind_of_socket(
    daemon: RunningDaemon, kind: str, region: shared_memory.SharedMemory
) -> None:
    where = endpoint(daemon, kind)
    answers = {op: ask(where, op, region) for op in OPS}
    local = "tcp" not in kind
    for op in ("infer", "models", "health", "stats"):
        assert answers[op].status == "OK", (op, answers[op].header)
    np.testing.assert_allclose(answers["infer"].output(), daemon_free_scores(), rtol=1e-5, atol=1e-6)
    assert {m["name"] for m in answers["models"].header["models"]} >= {"mlp-light", "cnn-heavy"}
    assert answers["health"].header["state"] == "serving"
    assert set(answers["stats"].header["classes"]) == {"realtime", "standard", "bulk"}
    for op in ("shm_register", "shm_unregister"):
        reply = answers[op]
        if local:
            assert reply.status == "OK", (op, reply.header)
        else:
            assert reply.status == "INVALID_ARGUMENT" and "ipc endpoints only" in reply.header["error"], reply.header


def daemon_free_scores() -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(REPO_ROOT / "engines" / "mlp-light" / "model.onnx"))
    return session.run(None, {"x": X})[0]


def test_the_protocol_page_lists_every_op_for_every_socket() -> None:
    page = (REPO_ROOT / "docs" / "protocol.md").read_text()
    table = page.split("### Which socket answers which op", 1)[1].split("\n\n", 2)[1]
    listed = re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.MULTILINE)
    assert listed == list(OPS)
    header_row = table.splitlines()[0]
    for kind in ("shared ipc socket", "shared tcp socket", "a class's socket", "memfd socket"):
        assert kind in header_row
