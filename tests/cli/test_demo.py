"""`edged demo`, the README's first command: it serves the demo models, shows each
answering, and stops cleanly."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def test_the_demo_serves_each_demo_model_and_stops_cleanly() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "edged", "demo", "--requests", "20"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "'state': 'serving'" in out
    for model in ("cnn-heavy", "mlp-light"):
        assert f"model {model} (onnxruntime" in out
    assert out.count("20 realtime requests, one at a time: round trip p50") == 2
    assert "daemon stopped with exit code 0" in out
    assert "Traceback" not in done.stderr


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.update(int(child) for child in (task / "children").read_text().split())
    return found


def stuck(pid: int, daemons: set[int], output: str | bytes | None) -> str:
    """What a demo that does not end shows: its output so far, where each of its threads and
    its daemon's waits in the kernel, and its daemon's log."""
    text = output.decode(errors="replace") if isinstance(output, bytes) else output or ""
    lines = [text]
    for process in (pid, *daemons):
        for task in Path(f"/proc/{process}/task").glob("*"):
            with contextlib.suppress(OSError):
                name, wchan = (task / "comm").read_text().strip(), (task / "wchan").read_text()
                lines.append(f"pid {process} thread {task.name} {name}: waits in {wchan or 'nothing (running)'}")
    if (folder := re.search(r"ipc://(\S+)/edged\.sock", text)) is not None:
        with contextlib.suppress(OSError):
            lines.append((Path(folder.group(1)) / "daemon.log").read_text())
    return "\n".join(lines)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, 130)])
def test_a_demo_ended_by_a_signal_stops_its_daemon_and_leaves_nothing(signum: int, code: int) -> None:
    """SIGTERM (a terminal closed, a job manager) ended the demo and left its daemon serving
    for good, beside its folder; Ctrl-C printed a traceback."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "edged", "demo", "--requests", "10000000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        end = time.monotonic() + 60
        while not children(demo.pid) and time.monotonic() < end:
            time.sleep(0.1)
        daemons = children(demo.pid)
        assert daemons, "the demo started no daemon"
        time.sleep(2.0)  # serving, its requests under way
        demo.send_signal(signum)
        try:
            out, err = demo.communicate(timeout=60)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"the demo ran on 60 s after the signal:\n{stuck(demo.pid, daemons, exc.output)}")
    finally:
        demo.kill()
    assert demo.returncode == code and "Traceback" not in err, err
    assert all(not Path(f"/proc/{pid}").exists() for pid in daemons), "the demo's daemon still runs"
    # Its own folder, from its first line: another demo on the box (a second run of the suite) has its own.
    folder = re.search(r"ipc://(\S+)/edged\.sock", out)
    assert folder is not None, out
    assert not Path(folder.group(1)).exists(), "the demo's folder is left"
