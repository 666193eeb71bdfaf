"""A stampede: many peers pipeline bulk requests all at once, while realtime peers
keep their pace beside it (bench/burst.py, and the suite's bounded version).

Each bulk peer is a DEALER socket of its own, as each of many clients would be, and
sends its whole share before any peer reads a reply. The realtime peers run in a
process of their own, each on a socket of its own, one request every `period_ms`,
through the client library, which routes each request by its class.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import zmq

from edged.client import Client, EdgedError
from edged.wire.codec import encode_request

# What one bulk request carries: cnn-heavy's image, 3 x 64 x 64 float32 (48 KiB).
IMAGE = np.random.default_rng(0).standard_normal((1, 3, 64, 64), dtype=np.float32)
LIGHT = np.random.default_rng(1).standard_normal((1, 64), dtype=np.float32)


@dataclass
class BurstResult:
    """What the bulk peers saw: each reply's status, and the round trips by status."""

    sent: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    duplicated: int = 0
    lost: int = 0
    seconds_to_answer_all: float = 0.0
    # The last OVERLOADED reply: how long shedding took, apart from the admitted work's compute.
    seconds_to_answer_shed: float = 0.0
    round_trips_ms: dict[str, list[float]] = field(default_factory=dict)

    @property
    def admitted(self) -> int:
        return self.statuses["OK"] + self.statuses["DEADLINE_EXCEEDED"] + self.statuses["INTERNAL"]

    def summary(self) -> dict[str, Any]:
        overloaded = self.round_trips_ms.get("OVERLOADED", [])
        return {
            "sent": self.sent,
            "statuses": dict(self.statuses),
            "lost": self.lost,
            "duplicated": self.duplicated,
            "admitted": self.admitted,
            "expired_of_admitted": self.statuses["DEADLINE_EXCEEDED"] / self.admitted if self.admitted else 0.0,
            "seconds_to_answer_all": self.seconds_to_answer_all,
            "seconds_to_answer_shed": self.seconds_to_answer_shed,
            "overloaded_round_trip_p50_ms": float(np.percentile(overloaded, 50)) if overloaded else None,
        }


# How long a burst's peers listen past the last reply for a second one.
SECOND_REPLY_WAIT_MS = 300
# The realtime peers' most common refusals kept, with their counts: why, where any was not OK.
REFUSALS_KEPT = 5


def stampede(
    endpoint: str,
    peers: int,
    per_peer: int,
    deadline_ms: float = 3000.0,
    klass: str = "bulk",
    model: str = "cnn-heavy",
    patience_s: float = 60.0,
) -> BurstResult:
    """`peers` sockets each send `per_peer` requests at once; wait for every reply (or
    `patience_s` of silence), and SECOND_REPLY_WAIT_MS past the last. Replies are matched by
    (peer, id): a second one counts as duplicated, none as lost."""
    context = zmq.Context()
    inputs = {"image": IMAGE} if model == "cnn-heavy" else {"x": LIGHT}
    result = BurstResult()
    sockets = []
    try:
        for _ in range(peers):
            sock = context.socket(zmq.DEALER)
            sock.sndhwm = sock.rcvhwm = 0
            sock.linger = 0
            sock.connect(endpoint)
            sockets.append(sock)
        time.sleep(0.5)  # every peer connected before the first request: one stampede, not a trickle
        sent_at: dict[tuple[int, int], int] = {}
        start = time.perf_counter_ns()
        for request in range(per_peer):
            for peer, sock in enumerate(sockets):
                frames = encode_request(request, model=model, klass=klass, deadline_ms=deadline_ms, inputs=inputs)
                sent_at[peer, request] = time.perf_counter_ns()
                sock.send_multipart(frames, copy=False)
        result.sent = len(sent_at)
        answered: set[tuple[int, int]] = set()
        poller = zmq.Poller()
        for sock in sockets:
            poller.register(sock, zmq.POLLIN)
        peer_of = {sock: peer for peer, sock in enumerate(sockets)}
        last_reply = last_shed = start
        while True:
            # Once every request is answered, a moment more: a reply sent twice counts as duplicated.
            ready = poller.poll(patience_s * 1000 if len(answered) < result.sent else SECOND_REPLY_WAIT_MS)
            if not ready:
                break
            now = time.perf_counter_ns()
            for sock, _ in ready:
                peer = peer_of[sock]
                while True:
                    try:
                        header = msgpack.unpackb(sock.recv_multipart(zmq.NOBLOCK)[0])
                    except zmq.Again:
                        break
                    key = (peer, header["id"])
                    if key in answered:
                        result.duplicated += 1
                        continue
                    answered.add(key)
                    last_reply = now
                    if header["status"] == "OVERLOADED":
                        last_shed = now
                    result.statuses[header["status"]] += 1
                    rtt = (now - sent_at[key]) / 1e6
                    result.round_trips_ms.setdefault(header["status"], []).append(rtt)
        result.lost = result.sent - len(answered)
        result.seconds_to_answer_all = (last_reply - start) / 1e9
        result.seconds_to_answer_shed = (last_shed - start) / 1e9
        return result
    finally:
        for sock in sockets:
            sock.close(linger=0)
        context.term()


def realtime_beside(endpoint: str, peers: int, period_ms: float, duration_s: float) -> dict[str, Any]:
    """`peers` realtime clients, each on a thread and a socket of its own, sending
    mlp-light every `period_ms` for `duration_s`: their statuses and round trips, with
    the daemon's own span (`timing_us.total`) beside them, and why any was refused."""
    statuses: Counter[str] = Counter()
    refusals: Counter[str] = Counter()  # "STATUS: message", for what was not OK
    round_trips: list[float] = []
    inside: list[float] = []
    lock = threading.Lock()
    start = time.perf_counter() + 0.5  # every peer connected and warm first

    def peer(offset_s: float) -> None:
        with Client(endpoint, timeout_ms=10_000) as client:
            client.health()
            tick = 0
            while (due := start + offset_s + tick * period_ms / 1000) < start + duration_s:
                tick += 1
                time.sleep(max(due - time.perf_counter(), 0.0))
                sent = time.perf_counter()
                try:
                    reply = client.infer_reply("mlp-light", {"x": LIGHT}, klass="realtime")
                    # The bare floor server's replies carry no timing_us.
                    timing = reply.header.get("timing_us")
                    status, total_ms = "OK", timing["total"] / 1000 if timing else None
                except EdgedError as exc:
                    status, total_ms = (exc.status.value if exc.status else "NO_REPLY"), None
                    with lock:
                        refusals[f"{status}: {exc.message}"] += 1
                with lock:
                    statuses[status] += 1
                    round_trips.append((time.perf_counter() - sent) * 1000)
                    if total_ms is not None:
                        inside.append(total_ms)

    threads = [threading.Thread(target=peer, args=(i * period_ms / 1000 / peers,)) for i in range(peers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "statuses": dict(statuses),
        "refusals": dict(refusals.most_common(REFUSALS_KEPT)),
        "sent": sum(statuses.values()),
        "round_trip_ms": percentiles(round_trips),
        "daemon_total_ms": percentiles(inside),
    }


def percentiles(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of `values` ({} for none)."""
    if not values:
        return {}
    return {name: float(np.percentile(values, q)) for name, q in (("p50", 50), ("p99", 99), ("max", 100))}
