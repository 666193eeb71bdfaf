"""The bytes of admitted requests, per client and in all (edged.serve.pending): a request
past either budget is shed OVERLOADED before it is admitted, the bytes come back when
it is answered, and a client over its budget harms no other."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import zmq
from support import RunningDaemon, bounded, exchange, header, receive

from edged.serve.admission import Backlog
from edged.serve.pending import PendingBytes
from edged.wire.codec import Limits, encode_request

IMAGE = np.zeros((1, 3, 64, 64), np.float32)  # 48 KiB
SENT = 20
# Room for three images per client, and for five in all.
CONFIG = f"""
[limits]
max_pending_bytes_per_peer = {3 * IMAGE.nbytes}
max_pending_bytes = {5 * IMAGE.nbytes}
"""


def test_each_budget_refuses_what_would_pass_it_and_answers_give_the_bytes_back() -> None:
    pending = PendingBytes(Limits(max_pending_bytes=300, max_pending_bytes_per_peer=200))
    backlog = Backlog()
    assert pending.take(b"a", 150, backlog) is None
    refused = pending.take(b"a", 100, backlog)
    assert refused is not None and refused.reason == "bytes" and "max_pending_bytes_per_peer = 200" in refused.message
    assert pending.take(b"b", 150, backlog) is None
    refused = pending.take(b"c", 50, backlog)
    assert refused is not None and "limits.max_pending_bytes = 300" in refused.message
    pending.give_back(b"a", 150)
    assert pending.total == 150
    assert pending.take(b"c", 50, backlog) is None and pending.take(b"a", 100, backlog) is None


def test_a_client_past_its_budget_is_shed_and_the_others_are_served(
    own_daemon: Callable[..., RunningDaemon], context: zmq.Context
) -> None:
    """One client pipelines twenty heavy bulk requests: three fit its budget (more, as
    answers give bytes back), the rest are shed for their bytes; meanwhile another
    client's request is served. Once they are answered, the same client fits three again."""
    running = own_daemon(CONFIG)
    greedy = bounded(context.socket(zmq.DEALER))
    greedy.connect(running.ipc)
    other = bounded(context.socket(zmq.DEALER))
    other.connect(running.ipc)
    try:
        for i in range(SENT):
            greedy.send_multipart(encode_request(i, model="cnn-heavy", klass="bulk", inputs={"image": IMAGE}))
        request = encode_request("o", model="cnn-heavy", klass="bulk", inputs={"image": IMAGE})
        assert exchange(other, request).status == "OK"
        replies = [receive(greedy) for _ in range(SENT)]
        statuses = sorted(r.header["status"] for r in replies)
        assert statuses.count("OK") >= 3 and "OVERLOADED" in statuses, statuses
        shed = [r for r in replies if r.header["status"] == "OVERLOADED"]
        assert all("max_pending_bytes" in r.header["error"] for r in shed), shed[0].header
        stats = exchange(other, [header(id="s", op="stats")]).header["classes"]["bulk"]
        assert stats["shed"]["bytes"] == len(shed)
        for i in range(3):
            greedy.send_multipart(encode_request(i, model="cnn-heavy", klass="bulk", inputs={"image": IMAGE}))
        assert [receive(greedy).status for _ in range(3)] == ["OK"] * 3
    finally:
        greedy.close(linger=0)
        other.close(linger=0)


def test_a_request_holding_no_bytes_leaves_no_entry_behind() -> None:
    """Inputs in shared memory or 0 rows hold 0 bytes: taken and given back, nothing stays
    per peer (an entry of 0 was kept for every such peer before)."""
    pending = PendingBytes(Limits())
    for peer in range(1000):
        assert pending.take(str(peer).encode(), 0, Backlog()) is None
        pending.give_back(str(peer).encode(), 0)
    assert pending.total == 0 and pending.peers == 0
