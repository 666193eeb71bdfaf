"""`kill -9` mid-load, then a restart on the same ipc endpoint: clients see errors
within their timeouts, never hangs, and the new daemon serves them again within a
stated time, without any client having to reconnect by hand."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from support import wait_for

from edged.client import Client, EdgedError, NoReply
from edged.loadgen.launch import DaemonProcess

# Measured here: about 1 s from the kill to serving (a fresh interpreter, two models
# loaded and warmed) on a quiet box, 5.0 s and once 16.9 s at load 5-6 with builds beside
# it; the bound leaves room for such a box.
RESTART_BOUND_S = 30.0
CLIENT_TIMEOUT_MS = 500


def test_kill_9_mid_load_then_restart_serves_again_and_clients_see_errors_not_hangs(short_tmp: Path) -> None:
    endpoint = f"ipc://{short_tmp}/d.sock"
    daemons = [DaemonProcess([endpoint], log_path=short_tmp / "first.log")]
    outcomes: Counter[str] = Counter()
    slowest_error_s = 0.0
    stop = threading.Event()

    def load() -> None:
        """A client that keeps asking, as an application would, with a timeout on each call."""
        nonlocal slowest_error_s
        x = np.ones((1, 64), dtype=np.float32)
        with Client(endpoint, timeout_ms=CLIENT_TIMEOUT_MS) as client:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    client.infer("mlp-light", {"x": x}, klass="standard")
                    outcomes["ok"] += 1
                except NoReply:
                    outcomes["no reply"] += 1
                    slowest_error_s = max(slowest_error_s, time.monotonic() - started)
                except EdgedError as exc:  # OVERLOADED or UNAVAILABLE are answers too, just not OK
                    outcomes[type(exc).__name__] += 1

    loader = threading.Thread(target=load)
    try:
        daemons[0].wait_serving()
        loader.start()
        wait_for(lambda: outcomes["ok"] >= 50, 10, "the load is being served")
        os.kill(daemons[0].process.pid, signal.SIGKILL)
        daemons[0].process.wait()
        killed_at = time.monotonic()

        # During the outage a call fails after its own timeout: an error, not a hang.
        with Client(endpoint, timeout_ms=300) as client, pytest.raises(NoReply):
            client.health()
        assert time.monotonic() - killed_at < 3
        # The running client's calls time out too. Waited for, not assumed: a restart
        # that binds within one client timeout would otherwise answer the queued call
        # (UNAVAILABLE while it loads) before that call ever timed out.
        wait_for(lambda: outcomes["no reply"] >= 1, 10, "the running client's call timed out in the outage")

        daemons.append(DaemonProcess([endpoint], log_path=short_tmp / "second.log"))
        daemons[1].wait_serving(timeout_s=60)
        restart_s = time.monotonic() - killed_at
        print(f"serving again {restart_s:.2f} s after kill -9")
        assert restart_s < RESTART_BOUND_S, f"serving again only {restart_s:.1f} s after the kill"

        # The same client, never told anything, is served by the new daemon.
        ok_before = outcomes["ok"]
        wait_for(lambda: outcomes["ok"] >= ok_before + 50, 10, "the running client is served again")
    finally:
        stop.set()
        if loader.is_alive():
            loader.join(timeout=10)
        for daemon in daemons:
            daemon.stop()
    assert set(outcomes) <= {"ok", "no reply", "Overloaded", "Unavailable"}, outcomes
    # Each failed call ended at its timeout, give or take scheduling on a busy machine.
    assert slowest_error_s < CLIENT_TIMEOUT_MS / 1000 + 2, slowest_error_s
