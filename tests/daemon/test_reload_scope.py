"""A reload applies what new lanes can carry (models, each class's settings); what the daemon
applies only at start (its sockets, loops, limits, logging) is refused with the keys named, and
the running configuration serves on. Before: dropping a class ended the daemon (exit 1), and an
added class, a new default class or new limits were logged as reloaded and never applied."""

from __future__ import annotations

import os
import shutil
import signal

import numpy as np
import pytest
from support import short_dir, start_daemon, wait_for
from support.notify import NotifyListener

from edged.client import Client

CLASSES = "[classes.realtime]\n[classes.standard]\n[classes.bulk]\n"

CHANGES = {
    "a class dropped": ("[classes.realtime]\n[classes.standard]\n", "the classes (their names and order)"),
    "a class added": (CLASSES + "[classes.extra]\norder = 3\n", "the classes (their names and order)"),
    "the default class": ('[server]\ndefault_class = "realtime"\n' + CLASSES, "server.default_class"),
    "a limit": ("[limits]\nmax_header_bytes = 300\n" + CLASSES, "[limits]"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_reload_changing_what_only_a_start_applies_is_refused_naming_it(change: str) -> None:
    text, key = CHANGES[change]
    running = start_daemon(CLASSES)
    try:
        (running.folder / "edged.toml").write_text(text)
        running.process.process.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload refused" in running.log(), 30, "the refusal")
        refusal = next(line for line in running.log().splitlines() if "reload refused" in line)
        assert key in refusal and "changed: applied only at start, so restart the daemon" in refusal, refusal
        x = np.ones((1, 64), np.float32)
        with Client(running.ipc) as client:
            for klass in ("realtime", "standard", "bulk"):
                assert client.infer("mlp-light", {"x": x}, klass=klass)["scores"].shape == (1, 10)
            assert set(client.health()["lanes"]) == {"realtime", "standard", "bulk"}
        assert running.stop() == 0
    finally:
        running.close()


def test_a_reload_changing_a_class_setting_is_applied() -> None:
    running = start_daemon(CLASSES)
    try:
        changed = CLASSES.replace("[classes.standard]\n", "[classes.standard]\ninline_max_us = 123\n")
        (running.folder / "edged.toml").write_text(changed)
        running.process.process.send_signal(signal.SIGHUP)
        wait_for(lambda: "reloaded: now serving" in running.log(), 30, "the reload")
        with Client(running.ipc) as client:
            assert client.stats()["classes"]["standard"]["inline_max_us"] == 123
        assert running.stop() == 0
    finally:
        running.close()


def test_a_reload_that_fails_during_a_drain_tells_systemd_nothing_more() -> None:
    """SIGTERM while a reload loads, then the reload fails: the daemon sent READY=1 after
    STOPPING=1, telling systemd a stopping service was ready again, and logged that it was
    "still serving". The reload's configuration is read from a pipe, held until the drain began."""
    folder = short_dir()
    listener = NotifyListener(folder / "notify.sock")
    running = start_daemon(CLASSES, env={"NOTIFY_SOCKET": str(listener.path)})
    try:
        wait_for(lambda: listener.times("READY"), 30, "READY=1")
        config = running.folder / "edged.toml"
        config.unlink()
        os.mkfifo(config)
        running.process.process.send_signal(signal.SIGHUP)
        wait_for(lambda: "SIGHUP: re-reading" in running.log(), 30, "the reload to begin")
        running.process.process.send_signal(signal.SIGTERM)
        wait_for(lambda: listener.times("STOPPING"), 30, "STOPPING=1")
        with open(config, "w") as pipe:  # opened once the loader reads: the reload goes on, and fails
            pipe.write("not toml [")
        assert running.process.process.wait(30) == 0
        stopping = listener.times("STOPPING")[0]
        assert [t for t in listener.times("READY") if t > stopping] == [], listener.messages
        assert "still serving" not in running.log()
        assert "the reload failed while the daemon stopped" in running.log()
    finally:
        running.close()
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)
