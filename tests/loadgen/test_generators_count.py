"""The load generators count what a skeptical reader checks: a reply sent a second time is
seen (by the burst's, even after every request has had its first), and a request left
unanswered is lost."""

from __future__ import annotations

import threading
import time

import msgpack
import zmq
from support import short_dir

from edged.loadgen.burst import BurstResult, stampede
from edged.loadgen.sweep import Stream, run_load
from edged.wire.codec import Status, encode_reply

REQUESTS = 20  # 4 peers, 5 each
LIGHT = [{"name": "x", "dtype": "float32", "shape": [-1, 64]}]


def serve(endpoint: str, dropped: int, late_copy: bool, stop: threading.Event) -> None:
    """A bare ROUTER that answers each request but the first `dropped`; with `late_copy`, it
    answers the last one again 50 ms after every other reply has gone."""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.linger = 0
    sock.bind(endpoint)
    try:
        last: list[bytes] = []
        for seen in range(1, REQUESTS + 1):
            while not sock.poll(100):
                if stop.is_set():
                    return
            frames = sock.recv_multipart()
            if seen > dropped:
                last = [frames[0], *encode_reply(msgpack.unpackb(frames[1])["id"], Status.OK)]
                sock.send_multipart(last)
        if late_copy:
            time.sleep(0.05)
            sock.send_multipart(last)
        stop.wait(2)
    finally:
        sock.close()


def burst_against(dropped: int = 0, late_copy: bool = False) -> BurstResult:
    endpoint = f"ipc://{short_dir()}/r.sock"
    stop = threading.Event()
    server = threading.Thread(target=serve, args=(endpoint, dropped, late_copy, stop), daemon=True)
    server.start()
    try:
        return stampede(endpoint, peers=4, per_peer=5, model="mlp-light", patience_s=1.0)
    finally:
        stop.set()
        server.join(5)


def test_a_reply_sent_again_after_every_first_reply_is_counted_duplicated() -> None:
    burst = burst_against(late_copy=True)
    assert burst.sent == REQUESTS and burst.lost == 0 and burst.duplicated == 1


def test_a_request_never_answered_is_counted_lost() -> None:
    burst = burst_against(dropped=3)
    assert burst.sent == REQUESTS and burst.lost == 3 and burst.duplicated == 0


def echo_twice(endpoint: str, stop: threading.Event) -> None:
    """A bare ROUTER that answers every request OK, twice."""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.linger = 0
    sock.bind(endpoint)
    try:
        while not stop.is_set():
            if sock.poll(50):
                frames = sock.recv_multipart()
                reply = [frames[0], *encode_reply(msgpack.unpackb(frames[1])["id"], Status.OK)]
                sock.send_multipart(reply)
                sock.send_multipart(reply)
    finally:
        sock.close()


def test_the_steady_load_counts_each_second_reply_as_duplicated() -> None:
    endpoint = f"ipc://{short_dir()}/r.sock"
    stop = threading.Event()
    server = threading.Thread(target=echo_twice, args=(endpoint, stop), daemon=True)
    server.start()
    try:
        (row,) = run_load(endpoint, [Stream("standard", "mlp-light", 100.0)], {"mlp-light": LIGHT}, 0.5)
    finally:
        stop.set()
        server.join(5)
    assert row["sent"] > 0 and row["ok"] == row["sent"] and row["lost"] == 0
    # Each second copy that came while the generator listened: all but at most the last few.
    assert row["sent"] - 3 <= row["duplicated"] <= row["sent"], row
