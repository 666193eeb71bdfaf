"""An oversized message is refused by ZeroMQ itself, before the daemon holds it:
its memory does not grow by the message's size, and everyone else is still served."""

from __future__ import annotations

import numpy as np
import zmq
from support import RunningDaemon, connect, exchange, header, nothing_more, random_input

from edged.loadgen.launch import resident_kib
from edged.wire.codec import encode_request

LIMITED = """
[server]
max_message_bytes = 1048576
"""
OVERSIZED_BYTES = 96 * 1024 * 1024


def test_an_oversized_message_is_refused_without_the_daemon_growing_by_its_size(
    context: zmq.Context, own_daemon
) -> None:
    running: RunningDaemon = own_daemon(LIMITED)
    good = connect(context, running.ipc)
    frames = encode_request(1, model="mlp-light", inputs=random_input("mlp-light", 1, 0))
    assert exchange(good, frames).status == "OK"
    before = resident_kib(running.pid)

    hostile = connect(context, running.ipc)
    hostile.setsockopt(zmq.SNDHWM, 0)
    for _ in range(3):
        hostile.send_multipart(
            [header(v=1, id="big", op="infer", model="mlp-light"), np.zeros(OVERSIZED_BYTES, np.uint8)]
        )
    # ZeroMQ drops the connection of a peer that sends past ZMQ_MAXMSGSIZE: no reply can come.
    assert nothing_more(hostile, wait_ms=1500)

    for i in range(20):
        reply = exchange(good, encode_request(i, model="mlp-light", inputs=random_input("mlp-light", 1, i)))
        assert reply.status == "OK"
    grown_mib = (resident_kib(running.pid) - before) / 1024
    assert grown_mib < 32, f"the daemon grew by {grown_mib:.0f} MiB on {3 * OVERSIZED_BYTES >> 20} MiB refused"
    assert running.alive()


def test_a_message_just_under_the_limit_is_read_and_answered(context: zmq.Context, own_daemon) -> None:
    running: RunningDaemon = own_daemon(LIMITED)
    sock = connect(context, running.ipc)
    # 4,000 rows of mlp-light input: about 1 MB, under the 1 MiB limit. Priced per row, they
    # can exceed the default class's 200 ms on a busy box: the subject here is size, not time.
    rows = random_input("mlp-light", 4000, 0)
    reply = exchange(sock, encode_request(7, model="mlp-light", deadline_ms=60_000, inputs=rows), 60_000)
    assert reply.status == "OK"
    assert reply.header["outputs"][0]["shape"] == [4000, 10]
