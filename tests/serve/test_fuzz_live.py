"""A few seconds of tests/stress/fuzz_daemon.py against a daemon of its own: random
frames, bent headers, random payload lengths, truncated and oversized messages. Every
message with a readable envelope gets exactly one reply, the daemon serves on, and its
memory stays flat. `python tests/stress/fuzz_daemon.py --seconds 600` is the long run."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from stress import fuzz_daemon
from support import Reference, RunningDaemon, assert_close

from edged.client import Client


def test_fuzzed_daemon_answers_every_message_once_and_serves_on(
    own_daemon: Callable[..., RunningDaemon], reference: Reference
) -> None:
    running = own_daemon(fuzz_daemon.OWN_CONFIG)
    report = fuzz_daemon.fuzz(
        running.ipc, running.pid, 4.0, seed=1, frame_limit=fuzz_daemon.OWN_FRAME_LIMIT, warmup_s=1.5
    )
    assert running.alive(), running.log()[-2000:]
    # Enough of each kind that a short run still means something.
    assert report.sent >= 500 and min(report.kinds.values()) >= 20, report
    assert report.oversized_sent >= 1
    assert report.problems(rss_bound_mib=32.0) == [], report
    assert report.replies == report.sent
    x = np.random.default_rng(3).standard_normal((3, 64), dtype=np.float32)
    with Client(running.ipc, timeout_ms=10_000) as client:
        assert_close(client.infer("mlp-light", {"x": x})["scores"], reference.run("mlp-light", {"x": x}))
