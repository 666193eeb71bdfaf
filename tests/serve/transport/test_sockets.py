"""Every op over real sockets, as a client in any language would speak it: raw msgpack
frames on a DEALER and on a REQ socket, over ipc and over tcp."""

from __future__ import annotations

import numpy as np
import pytest
import zmq
from support import (
    MODEL_INPUTS,
    Reference,
    RunningDaemon,
    assert_close,
    connect,
    exchange,
    header,
    nothing_more,
    random_input,
    receive,
)

from edged.wire.codec import encode_request

SOCKETS = {"DEALER": zmq.DEALER, "REQ": zmq.REQ}


@pytest.mark.parametrize("kind", list(SOCKETS))
@pytest.mark.parametrize("model", ["mlp-light", "cnn-heavy"])
def test_infer_reply_has_outputs_and_timing(
    context: zmq.Context, endpoint: str, kind: str, model: str, reference: Reference
) -> None:
    inputs = random_input(model, rows=3, seed=11)
    sock = connect(context, endpoint, SOCKETS[kind])
    reply = exchange(sock, encode_request(7, model=model, inputs=inputs))
    expected = reference.run(model, inputs)
    out_name = {"mlp-light": "scores", "cnn-heavy": "logits"}[model]
    assert reply.header["v"] == 1
    assert reply.header["id"] == 7
    assert reply.status == "OK", reply.header
    assert "error" not in reply.header
    assert reply.header["outputs"] == [{"name": out_name, "dtype": "float32", "shape": [3, 10]}]
    assert len(reply.payloads) == 1 and len(reply.payloads[0]) == 3 * 10 * 4
    assert_close(reply.output(), expected)
    timing = reply.header["timing_us"]
    assert set(timing) == {"queue", "compute", "total"}
    assert all(isinstance(value, int) and value >= 0 for value in timing.values())
    assert timing["compute"] > 0
    # Integer microseconds, each floored: allow a rounding of a few.
    assert timing["total"] + 3 >= timing["queue"] + timing["compute"]
    assert timing["total"] < 10_000_000
    assert not reply.delimiter  # a DEALER's request had no delimiter, so neither has its reply


@pytest.mark.parametrize("kind", list(SOCKETS))
def test_models_lists_every_served_model(context: zmq.Context, endpoint: str, kind: str) -> None:
    reply = exchange(connect(context, endpoint, SOCKETS[kind]), [header(id="m", op="models")])
    assert (reply.header["v"], reply.header["id"], reply.status) == (1, "m", "OK")
    assert reply.payloads == []
    models = {model["name"]: model for model in reply.header["models"]}
    assert set(models) == {"mlp-light", "cnn-heavy"}
    assert models["mlp-light"] == {
        "name": "mlp-light",
        "backend": "onnxruntime",
        "precision": "fp32",
        "inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 64]}],
        "outputs": [{"name": "scores", "dtype": "float32", "shape": [-1, 10]}],
    }
    assert models["cnn-heavy"] == {
        "name": "cnn-heavy",
        "backend": "onnxruntime",
        "precision": "fp32",
        "inputs": [{"name": "image", "dtype": "float32", "shape": [-1, 3, 64, 64]}],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": [-1, 10]}],
    }


@pytest.mark.parametrize("kind", list(SOCKETS))
def test_health_says_serving(context: zmq.Context, endpoint: str, kind: str) -> None:
    reply = exchange(connect(context, endpoint, SOCKETS[kind]), [header(id=b"\x01h", op="health")])
    assert (reply.header["v"], reply.header["id"], reply.status) == (1, b"\x01h", "OK")
    assert reply.header["state"] == "serving"


# The counters docs/protocol.md lists and every version of the daemon reports.
COUNTERS = ("received", "admitted", "expired", "completed", "failed", "queue_depth")


@pytest.mark.parametrize("kind", list(SOCKETS))
def test_stats_has_counters_per_class(context: zmq.Context, endpoint: str, kind: str) -> None:
    reply = exchange(connect(context, endpoint, SOCKETS[kind]), [header(id=-3, op="stats")])
    assert (reply.header["v"], reply.header["id"], reply.status) == (1, -3, "OK")
    classes = reply.header["classes"]
    assert set(classes) == {"realtime", "standard", "bulk"}
    for figures in classes.values():
        for counter in COUNTERS:
            assert isinstance(figures[counter], int) and figures[counter] >= 0, counter
        assert set(figures["shed"]) == {"queue_full", "deadline", "bytes"}
        for stage in ("queue", "compute", "total"):
            assert {"p50", "p99", "max", "count"} <= set(figures["latency_us"][stage])


def test_stats_count_what_a_class_served(context: zmq.Context, daemon: RunningDaemon, reference: Reference) -> None:
    sock = connect(context, daemon.ipc)

    def realtime() -> dict:
        return exchange(sock, [header(id="s", op="stats")]).header["classes"]["realtime"]

    before = realtime()
    for i in range(5):
        inputs = random_input("mlp-light", rows=1, seed=i)
        reply = exchange(sock, encode_request(i, model="mlp-light", klass="realtime", inputs=inputs))
        assert reply.status == "OK"
    after = realtime()
    for counter in ("received", "admitted", "completed"):
        assert after[counter] - before[counter] == 5, counter
    assert after["latency_us"]["total"]["count"] - before["latency_us"]["total"]["count"] == 5
    assert after["latency_us"]["total"]["max"] > 0
    assert after["queue_depth"] == 0
    assert after["failed"] == before["failed"]


@pytest.mark.parametrize(
    "request_id", [0, 2**63 - 1, -(2**63), "", "ünïcode-id", "x" * 64, b"", b"\x00\xff" * 32], ids=repr
)
def test_id_comes_back_unchanged_in_type_and_value(
    context: zmq.Context, daemon: RunningDaemon, request_id: int | str | bytes
) -> None:
    sock = connect(context, daemon.ipc)
    for frames in (
        [header(id=request_id, op="health")],
        encode_request(request_id, model="mlp-light", inputs=random_input("mlp-light", 1, 0)),
        # An error reply echoes it too.
        encode_request(request_id, model="no-such-model", inputs=random_input("mlp-light", 1, 0)),
    ):
        reply = exchange(sock, frames)
        assert reply.header["id"] == request_id
        assert type(reply.header["id"]) is type(request_id)


def test_requested_output_subset(context: zmq.Context, daemon: RunningDaemon, reference: Reference) -> None:
    inputs = random_input("mlp-light", 2, 5)
    reply = exchange(
        connect(context, daemon.ipc), encode_request(1, model="mlp-light", inputs=inputs, outputs=["scores"])
    )
    assert reply.status == "OK"
    assert [spec["name"] for spec in reply.header["outputs"]] == ["scores"]
    assert_close(reply.output(), reference.run("mlp-light", inputs))


def test_dealer_may_use_a_req_style_envelope(context: zmq.Context, daemon: RunningDaemon) -> None:
    """A DEALER that sends the empty delimiter itself (as a REQ would) gets it back, then the reply."""
    sock = connect(context, daemon.ipc)
    reply = exchange(sock, [b"", header(id=4, op="health")])
    assert reply.delimiter
    assert reply.header["state"] == "serving"


def test_each_client_gets_its_own_replies_only(context: zmq.Context, daemon: RunningDaemon) -> None:
    """Two DEALERs with requests interleaved in flight: the ROUTER routes each reply
    back to the socket its request came from, and nowhere else."""
    clients = {name: connect(context, daemon.ipc) for name in ("a", "b")}
    for i in range(50):
        for name, sock in clients.items():
            x = np.full((1, 64), i, dtype=np.float32)
            sock.send_multipart(encode_request(f"{name}{i}", model="mlp-light", inputs={"x": x}))
    for name, sock in clients.items():
        ids = {receive(sock).header["id"] for _ in range(50)}
        assert ids == {f"{name}{i}" for i in range(50)}
        assert nothing_more(sock)


def test_every_model_input_is_served_in_every_batch_size(
    context: zmq.Context, daemon: RunningDaemon, reference: Reference
) -> None:
    sock = connect(context, daemon.ipc)
    for model in MODEL_INPUTS:
        for rows in (1, 2, 7):
            inputs = random_input(model, rows, seed=rows)
            reply = exchange(sock, encode_request(rows, model=model, klass="bulk", inputs=inputs))
            assert reply.status == "OK", reply.header
            assert_close(reply.output(), reference.run(model, inputs))
    # A batch of zero rows is a valid tensor: it gets zero rows back.
    empty = {"x": np.zeros((0, 64), dtype=np.float32)}
    reply = exchange(sock, encode_request("empty", model="mlp-light", inputs=empty))
    assert reply.status == "OK", reply.header
    assert reply.header["outputs"][0]["shape"] == [0, 10]
