"""Running as a service: systemd's notify protocol on a real datagram socket, the
watchdog driven by the serving loop, reload on SIGHUP under traffic, and the unit
files as systemd itself reads them."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support import ENGINES, REPO_ROOT, short_dir, wait_for
from support.notify import NotifyListener

from edged.client import Client, EdgedError
from edged.loadgen.launch import DaemonProcess

WATCHDOG_USEC = 500_000
PING_EVERY_S = WATCHDOG_USEC / 2 / 1e6  # the daemon pings at half the timeout, as sd_watchdog_enabled(3) advises


BLOCKING_CONFIG = """
[server]
default_class = "realtime"

[classes.realtime]
order = 0
deadline_ms = 60000
inline_max_us = 30000000
stuck_after_ms = 600000
"""


def wait_ready(daemon: DaemonProcess, listener: NotifyListener) -> None:
    end = time.monotonic() + 60
    while not listener.times("READY"):
        if time.monotonic() > end or daemon.process.poll() is not None:
            log = Path(daemon.log_path).read_text() if daemon.log_path else ""
            pytest.fail(f"no READY=1 within 60 s; messages {listener.messages}; daemon log:\n{log}")
        time.sleep(0.02)


@pytest.fixture
def notified() -> Iterator[tuple[DaemonProcess, NotifyListener, str]]:
    folder = short_dir()
    listener = NotifyListener(folder / "notify.sock")
    config = folder / "edged.toml"
    # A realtime lane that runs anything inline: one big request blocks the serving loop on purpose.
    config.write_text(BLOCKING_CONFIG)
    endpoint = f"ipc://{folder}/d.sock"
    env = {"NOTIFY_SOCKET": str(listener.path), "WATCHDOG_USEC": str(WATCHDOG_USEC)}
    daemon = DaemonProcess([endpoint], config=config, log_path=folder / "daemon.log", env=env)
    try:
        yield daemon, listener, endpoint
    finally:
        daemon.stop()
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_ready_comes_once_the_models_answer_then_watchdog_then_stopping(notified):
    daemon, listener, endpoint = notified
    wait_ready(daemon, listener)
    # At READY, inference must already work: systemd starts dependants on it.
    with Client(endpoint, timeout_ms=5000) as client:
        scores = client.infer("mlp-light", {"x": np.zeros((1, 64), np.float32)})["scores"]
    assert scores.shape == (1, 10)
    ready_at = listener.times("READY")[0]
    time.sleep(2.0)
    pings = [t for t in listener.times("WATCHDOG") if t > ready_at]
    # About 8 pings in 2 s. Five or more keep the average gap under the timeout, with
    # room for a busy box delaying one; a daemon paced at the timeout itself sends 4.
    assert len(pings) >= 5, listener.messages
    assert np.diff(pings).min() > PING_EVERY_S / 5, np.diff(pings)  # paced, not spammed
    assert any("STATUS" in fields for _, fields in listener.messages)
    assert daemon.stop() == 0
    stopping = listener.times("STOPPING")
    assert stopping and stopping[0] > ready_at


def test_a_blocked_serving_loop_stops_the_watchdog_pings(notified):
    daemon, listener, endpoint = notified
    wait_ready(daemon, listener)
    image = np.zeros((1024, 3, 64, 64), np.float32)
    with Client(endpoint, timeout_ms=60_000) as client:
        reply = client.infer_reply("cnn-heavy", {"image": image}, klass="realtime")
        finished = time.monotonic()
    compute_s = reply.header["timing_us"]["compute"] / 1e6
    assert compute_s > 4 * PING_EVERY_S, "the blocking request was too quick to show anything"
    # The request ran on the serving loop, and its reply went out as soon as it ended:
    # no ping may fall inside the run (less a ping interval's slack at each end).
    blocked = (finished - compute_s + PING_EVERY_S, finished - PING_EVERY_S)
    during = [t for t in listener.times("WATCHDOG") if blocked[0] < t < blocked[1]]
    assert during == [], f"pings while the loop was blocked for {compute_s:.2f} s: {during}"
    wait_for(lambda: any(t > finished for t in listener.times("WATCHDOG")), 5, "pings to resume")


def stream_requests(endpoint: str, stop: threading.Event, outcomes: list[str], outputs: list[np.ndarray]) -> None:
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
    with Client(endpoint, timeout_ms=10_000) as client:
        while not stop.is_set():
            try:
                outputs.append(client.infer("mlp-light", {"x": x}, klass="standard")["scores"])
                outcomes.append("OK")
            except EdgedError as exc:
                outcomes.append(f"{type(exc).__name__}: {exc.message}")


def test_sighup_swaps_in_a_changed_model_without_failing_a_request():
    folder = short_dir()
    repository = folder / "engines"
    shutil.copytree(ENGINES, repository)
    config = folder / "edged.toml"
    config.write_text(f'[server]\nmodel_repository = "{repository}"\n')
    endpoint = f"ipc://{folder}/d.sock"
    stop, outcomes, outputs = threading.Event(), [], []
    with DaemonProcess([endpoint], config=config, log_path=folder / "daemon.log") as daemon:
        daemon.wait_serving()
        streamer = threading.Thread(target=stream_requests, args=(endpoint, stop, outcomes, outputs))
        streamer.start()
        try:
            wait_for(lambda: len(outcomes) > 50, 30, "a steady stream")
            # A new mlp-light: same signature, other weights.
            script = REPO_ROOT / "build_scripts" / "make_demo_models.py"
            subprocess.run(
                [sys.executable, str(script), "--out", str(repository), "--model", "mlp-light", "--seed", "7"],
                check=True,
                capture_output=True,
            )
            old = outputs[-1]
            daemon.process.send_signal(signal.SIGHUP)
            wait_for(lambda: "reloaded" in (folder / "daemon.log").read_text(), 60, "the reload")
            count = len(outputs)
            wait_for(lambda: len(outputs) > count + 50, 30, "requests after the reload")
            # A bad config is refused and the running one keeps serving.
            config.write_text("[server]\nnot_a_key = 1\n")
            daemon.process.send_signal(signal.SIGHUP)
            wait_for(lambda: "reload refused" in (folder / "daemon.log").read_text(), 30, "the refusal")
            count = len(outputs)
            wait_for(lambda: len(outputs) > count + 50, 30, "requests after the refusal")
        finally:
            stop.set()
            streamer.join()
        assert daemon.stop() == 0
    failures = [o for o in outcomes if o != "OK"]
    assert failures == [], failures[:5]
    assert not np.allclose(outputs[-1], old), "the changed model was not swapped in"
    log = (folder / "daemon.log").read_text()
    assert "not_a_key" in log
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("unit", ["edged.service", "edged@.service"])
def test_unit_files_pass_systemd_analyze_verify(unit, tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (.ci/run installs it on Debian)")
    text = (REPO_ROOT / "systemd" / unit).read_text()
    settings = [line for line in text.splitlines() if not line.startswith("#")]
    assert "PrivateDevices=yes" not in settings, "it would hide the GPU's device nodes"
    for needed in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "RuntimeDirectory=", "DeviceAllow=", "User="):
        assert needed in text, needed
    # systemd checks that ExecStart's program exists: point it at this checkout's.
    edged = Path(sys.executable).with_name("edged")
    name = unit.replace("@.", "@0.")
    (tmp_path / name).write_text(text.replace("/opt/edged/venv/bin/edged", str(edged)))
    done = subprocess.run([analyze, "verify", str(tmp_path / name)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "edged" not in done.stderr.lower() or not done.stderr.strip(), done.stderr
