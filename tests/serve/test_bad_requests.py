"""Whatever a client sends, it gets exactly one reply saying what to fix, and the
daemon goes on serving: every case here is raw frames on a real DEALER socket."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from onnx import TensorProto, helper
from support import (
    Reference,
    RunningDaemon,
    assert_close,
    connect,
    exchange,
    header,
    nothing_more,
    random_input,
    receive,
    receive_or_death,
    short_dir,
    start_daemon,
    wait_for,
)
from support.models import save_model

from edged.loadgen.launch import resident_kib
from edged.wire.codec import encode_request

X_SPEC = {"name": "x", "dtype": "float32", "shape": [1, 64]}
X_BYTES = np.zeros((1, 64), dtype=np.float32).tobytes()


def infer(request_id: Any = 1, inputs: list[dict] | None = None, **fields: Any) -> bytes:
    return header(
        id=request_id, op="infer", model=fields.pop("model", "mlp-light"), inputs=inputs or [X_SPEC], **fields
    )


# name: (frames, status, key phrase of the error, id the reply must carry)
BAD: dict[str, tuple[list[bytes], str, str, Any]] = {
    "not msgpack": ([b"\xc1\xc1\xc1"], "INVALID_ARGUMENT", "not valid msgpack", None),
    "msgpack but not a map": ([msgpack.packb([1, "id", 2])], "INVALID_ARGUMENT", "must be a msgpack map", None),
    "no id": ([msgpack.packb({"v": 1, "op": "health"})], "INVALID_ARGUMENT", "no 'id'", None),
    "id of the wrong type": (
        [msgpack.packb({"v": 1, "id": 1.5, "op": "health"})],
        "INVALID_ARGUMENT",
        "'id' must be",
        None,
    ),
    "id over 64 bytes": ([header(id="i" * 65, op="health")], "INVALID_ARGUMENT", "64", None),
    "bin id over 64 bytes": ([header(id=b"i" * 65, op="health")], "INVALID_ARGUMENT", "64", None),
    "wrong version": ([msgpack.packb({"v": 2, "id": "v2", "op": "health"})], "INVALID_ARGUMENT", "version", "v2"),
    "unknown op": ([header(id=3, op="shutdown")], "NOT_FOUND", "unknown op", 3),
    "control op with a payload": ([header(id=3, op="health"), b"x"], "INVALID_ARGUMENT", "no payload", 3),
    "unknown model": ([infer(4, model="resnet-1000"), X_BYTES], "NOT_FOUND", "unknown model", 4),
    "no model": ([header(id=4, op="infer", inputs=[X_SPEC]), X_BYTES], "INVALID_ARGUMENT", "'model'", 4),
    "unknown class": ([infer(5, **{"class": "vip"}), X_BYTES], "NOT_FOUND", "unknown class", 5),
    "empty class": ([infer(5, **{"class": ""}), X_BYTES], "NOT_FOUND", "unknown class ''", 5),
    "class not a string": ([infer(5, **{"class": 7}), X_BYTES], "INVALID_ARGUMENT", "'class'", 5),
    "no inputs": ([header(id=6, model="mlp-light")], "INVALID_ARGUMENT", "'inputs'", 6),
    "unknown dtype": ([infer(6, [{**X_SPEC, "dtype": "float33"}]), X_BYTES], "INVALID_ARGUMENT", "unknown dtype", 6),
    "a dtype the wire lacks": (
        [infer(6, [{**X_SPEC, "dtype": "float64"}]), X_BYTES * 2],
        "INVALID_ARGUMENT",
        "unknown dtype",
        6,
    ),
    "dtype not the model's": (
        [infer(7, [{**X_SPEC, "dtype": "float16"}]), X_BYTES[:128]],
        "INVALID_ARGUMENT",
        "must be float32",
        7,
    ),
    "byte count short": ([infer(8), X_BYTES[:-1]], "INVALID_ARGUMENT", "255 bytes", 8),
    "byte count long": ([infer(8), X_BYTES + b"\0"], "INVALID_ARGUMENT", "257 bytes", 8),
    "wrong rank": ([infer(9, [{**X_SPEC, "shape": [64]}]), X_BYTES], "INVALID_ARGUMENT", "the model takes [-1, 64]", 9),
    "wrong fixed dimension": (
        [infer(9, [{**X_SPEC, "shape": [2, 32]}]), X_BYTES],
        "INVALID_ARGUMENT",
        "the model takes [-1, 64]",
        9,
    ),
    "negative dimension": ([infer(9, [{**X_SPEC, "shape": [-1, 64]}]), X_BYTES], "INVALID_ARGUMENT", "non-negative", 9),
    "missing payload frame": ([infer(10)], "INVALID_ARGUMENT", "0 payload frames", 10),
    "extra payload frame": ([infer(10), X_BYTES, X_BYTES], "INVALID_ARGUMENT", "2 payload frames", 10),
    "negative deadline": ([infer(11, deadline_ms=-5), X_BYTES], "INVALID_ARGUMENT", "deadline_ms", 11),
    "zero deadline": ([infer(11, deadline_ms=0), X_BYTES], "INVALID_ARGUMENT", "deadline_ms", 11),
    "deadline not a number": ([infer(11, deadline_ms="soon"), X_BYTES], "INVALID_ARGUMENT", "deadline_ms", 11),
    "absurd shape, tiny payload": (
        [infer(12, [{**X_SPEC, "shape": [2**40, 2**40]}]), X_BYTES[:4]],
        "INVALID_ARGUMENT",
        "over the limit",
        12,
    ),
    "missing input name": ([infer(13, [{**X_SPEC, "name": "y"}]), X_BYTES], "INVALID_ARGUMENT", "missing ['x']", 13),
    "unknown input name": (
        [infer(13, [X_SPEC, {**X_SPEC, "name": "z"}]), X_BYTES, X_BYTES],
        "INVALID_ARGUMENT",
        "unknown ['z']",
        13,
    ),
    "input given twice": ([infer(13, [X_SPEC, X_SPEC]), X_BYTES, X_BYTES], "INVALID_ARGUMENT", "twice", 13),
    "unknown output name": ([infer(14, outputs=["logits"]), X_BYTES], "INVALID_ARGUMENT", "no outputs ['logits']", 14),
    # Identity only: a DEALER's one empty frame is taken as a REQ delimiter with nothing after it.
    "empty message body": ([b""], "INVALID_ARGUMENT", "empty message", None),
    "empty header frame": ([b"", b""], "INVALID_ARGUMENT", "not valid msgpack", None),
    "header over the size limit": (
        [msgpack.packb({"v": 1, "id": 15, "pad": "x" * 70_000})],
        "INVALID_ARGUMENT",
        "over the limit",
        15,  # not read, but for its id near the start
    ),
    "header over the size limit, its id far in": (
        [msgpack.packb({"pad": "x" * 70_000, "v": 1, "id": 15})],
        "INVALID_ARGUMENT",
        "over the limit",
        None,
    ),
    "header not utf-8": ([b"\x82\xa1v\x01\xa2id\xa2\xff\xfe"], "INVALID_ARGUMENT", "not valid msgpack", None),
}


def check_still_serving(sock: zmq.Socket, reference: Reference) -> None:
    """The next reply on this socket is a good request's, with the right numbers."""
    x = np.random.default_rng(7).standard_normal((1, 64), dtype=np.float32)
    sock.send_multipart(encode_request("after", model="mlp-light", inputs={"x": x}))
    reply = receive(sock)
    assert reply.header["id"] == "after", f"an extra reply came first: {reply.header}"
    assert reply.status == "OK", reply.header
    assert_close(reply.output(), reference.run("mlp-light", {"x": x}))
    assert nothing_more(sock, 50), "a reply came beyond one per request"


@pytest.mark.parametrize("case", list(BAD))
def test_bad_request_gets_one_useful_reply_and_the_daemon_serves_on(
    context: zmq.Context, daemon: RunningDaemon, reference: Reference, case: str
) -> None:
    frames, status, phrase, request_id = BAD[case]
    sock = connect(context, daemon.ipc)
    reply = exchange(sock, frames)
    assert reply.header["v"] == 1
    assert reply.status == status, reply.header
    assert phrase in reply.header["error"], reply.header["error"]
    assert reply.header["id"] == request_id
    assert reply.payloads == []
    assert "outputs" not in reply.header
    # The contract gives every reply to an infer request timing_us: a refusal's computed nothing.
    timing = reply.header["timing_us"]
    assert (timing["queue"], timing["compute"]) == (0, 0) and 0 <= timing["total"] < 1_000_000, timing
    check_still_serving(sock, reference)


def test_absurd_shapes_allocate_nothing(context: zmq.Context, daemon: RunningDaemon) -> None:
    """A shape that claims terabytes, or one that claims exactly the element limit
    (64 MiB of float32), over a 4-byte payload, must be refused before any allocation."""
    sock = connect(context, daemon.ipc)
    exchange(sock, [header(id=0, op="health")])  # settle anything the connection itself costs
    before = resident_kib(daemon.pid)
    for i, shape in enumerate([[2**40, 2**40], [4096, 4096], [1, 2**24], [2**62]] * 25):
        reply = exchange(sock, [infer(i, [{**X_SPEC, "shape": shape}]), X_BYTES[:4]])
        assert reply.status == "INVALID_ARGUMENT", reply.header
    grown_mib = (resident_kib(daemon.pid) - before) / 1024
    assert grown_mib < 32, f"the daemon grew by {grown_mib:.0f} MiB answering 100 tiny requests"


def test_many_bad_requests_in_flight_each_get_their_own_reply(context: zmq.Context, daemon: RunningDaemon) -> None:
    sock = connect(context, daemon.ipc)
    cases = [(frames, status) for frames, status, _, request_id in BAD.values() if request_id is not None]
    sent = {}
    for n, (frames, status) in enumerate(cases * 10):
        request_id = f"bad-{n}"
        head = msgpack.unpackb(frames[0])
        head["id"] = request_id
        sock.send_multipart([msgpack.packb(head), *frames[1:]])
        sent[request_id] = status
    got = {}
    for _ in sent:
        reply = receive(sock)
        assert reply.header["id"] not in got, "two replies to one request"
        got[reply.header["id"]] = reply.status
    assert got == sent
    assert nothing_more(sock, 100)


HOSTILE: dict[str, Callable[[], list[bytes]]] = {
    # dtype is looked up in a table: a value that cannot be hashed must still be a plain refusal.
    "dtype a list": lambda: [infer(20, [{**X_SPEC, "dtype": ["float32"]}]), X_BYTES],
    "dtype a map": lambda: [infer(21, [{**X_SPEC, "dtype": {"float32": 1}}]), X_BYTES],
    # Finite and > 0, so valid per protocol; in nanoseconds it is past any float.
    "deadline 1e308 ms": lambda: [infer(22, deadline_ms=1e308), X_BYTES],
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_header_values_get_one_reply_and_the_daemon_survives(
    context: zmq.Context, own_daemon: Callable[..., RunningDaemon], reference: Reference, case: str
) -> None:
    """Each on a daemon of its own, so that one that dies here does not take the rest of the suite with it."""
    running = own_daemon()
    sock = connect(context, running.ipc)
    sock.send_multipart(HOSTILE[case]())
    reply = receive_or_death(sock, running)
    assert reply.status in ("OK", "INVALID_ARGUMENT"), reply.header
    assert reply.header["id"] == msgpack.unpackb(HOSTILE[case]()[0])["id"]
    assert running.alive(), running.log()[-2000:]
    check_still_serving(sock, reference)


def test_a_request_of_zero_rows_for_a_size_priced_model_on_bulk_is_answered_and_bulk_serves_on(
    context: zmq.Context,
) -> None:
    """0 rows is a valid shape. On bulk, which batches by rows under a call's time cap, a model
    priced by size divided its price by the rows: the worker died, and nothing on bulk was
    answered again."""
    root = short_dir()
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1)],
        "summer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "L"])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, ["N", 1])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [1])],
    )
    spec = {"dtype": "float32"}
    save_model(root, graph, [{"name": "x", "shape": [-1, -1], **spec}], [{"name": "s", "shape": [-1, 1], **spec}])
    running = start_daemon(f'[server]\nmodel_repository = "{root}"\n')
    sock = connect(context, running.ipc)
    try:
        empty = exchange(
            sock, encode_request(1, model="summer", klass="bulk", inputs={"x": np.zeros((0, 4), np.float32)})
        )
        assert empty.status == "OK" and empty.output().shape == (0, 1), empty.header
        one = exchange(sock, encode_request(2, model="summer", klass="bulk", inputs={"x": np.ones((1, 4), np.float32)}))
        assert one.status == "OK" and one.output().tolist() == [[4.0]], one.header
    finally:
        sock.close(linger=0)
        running.close()
        shutil.rmtree(root, ignore_errors=True)


def test_a_hopeless_deadline_leaves_the_models_price_where_it_was(daemon: RunningDaemon, context: zmq.Context) -> None:
    """A shed beyond the model's own run has the lane re-time the model on its worker. One
    timed call there, cold, priced mlp-light at 7x its warm price; the median of several
    stays near it (within 4x here, where the one call was 7x)."""
    sock = connect(context, daemon.ipc)
    try:

        def standard() -> dict:
            return exchange(sock, [header(id="s", op="stats")]).header["classes"]["standard"]

        def price_ms() -> float:
            return standard()["prices"]["mlp-light"]["first_row_ms"]

        before = price_ms()
        x = random_input("mlp-light", 1, 0)
        for attempt in range(2):
            shed = exchange(sock, encode_request(attempt, model="mlp-light", inputs=x, deadline_ms=0.001))
            assert shed.status == "OVERLOADED", shed.header
            wait_for(lambda: standard()["queue_depth"] == 0, 5, "the re-timing")
            time.sleep(1.1)  # a re-timing at most once a second
        assert price_ms() <= 4 * before, (before, price_ms())
    finally:
        sock.close(linger=0)
