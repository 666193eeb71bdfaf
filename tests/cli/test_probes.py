"""`edged health --probe live|started|ready` on real daemons: the exit codes follow the
daemon through loading, serving, a lane whose backend call hung, and a drain."""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq
from support import (
    RunningDaemon,
    connect,
    exchange,
    header,
    random_input,
    receive,
    run_edged,
    short_dir,
    wait_for,
)
from support.models import save_sleeper, sleep_for

from edged.cli.commands import main
from edged.wire.codec import encode_request

StartDaemon = Callable[..., RunningDaemon]

# One class, one worker. Warming the sleeper up on n = 2500 (five timed runs) takes about a second: the
# window in which the daemon is loading, and again while a replacement worker warms up. Nothing
# inline: the sleeper is priced at its warm-up's run, whatever its n, and a loop whose measured
# hand-offs ran long just after start-up ran the hung call itself, which no watchdog answers
# (1 run in 25: OK after seconds, not INTERNAL).
SLOW_WARMUP = """
[server]
model_repository = "{repository}"
models = ["sleeper"]

[classes.standard]
workers = 1
deadline_ms = 60000
stuck_after_ms = 300
inline_max_us = 0
"""


@pytest.fixture
def slow_warmup_repository() -> Iterator[Path]:
    root = short_dir()
    save_sleeper(root)
    manifest_path = root / "sleeper" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["warmup"] = [{"shapes": {}, "data": {"n": 2500}}]
    manifest_path.write_text(json.dumps(manifest))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def probe(capsys: pytest.CaptureFixture[str], kind: str, endpoint: str, timeout_ms: float = 5000) -> tuple[int, str]:
    """The CLI's exit code and its line, run in this process (a child process costs half a second)."""
    capsys.readouterr()
    code = main(["health", "--probe", kind, "--endpoint", endpoint, "--timeout-ms", str(timeout_ms)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_probes_follow_loading_serving_and_a_lane_whose_call_hung(
    capsys: pytest.CaptureFixture[str],
    context: zmq.Context,
    own_daemon: StartDaemon,
    slow_warmup_repository: Path,
) -> None:
    running = own_daemon(SLOW_WARMUP.format(repository=slow_warmup_repository), wait=False)
    # The first answer comes once the socket is bound, about a second before warm-up ends.
    assert probe(capsys, "live", running.ipc, timeout_ms=30_000)[0] == 0
    code, line = probe(capsys, "started", running.ipc)
    assert (code, line.strip()) == (1, "not started: starting")
    code, line = probe(capsys, "ready", running.ipc)
    assert (code, line.strip()) == (1, "not ready: starting")

    wait_for(lambda: probe(capsys, "ready", running.ipc)[0] == 0, 60, "the daemon to become ready")
    assert probe(capsys, "started", running.ipc)[0] == 0
    assert probe(capsys, "live", running.ipc)[0] == 0

    # A call that runs for seconds: the watchdog answers it after 300 ms and replaces the
    # worker, whose warm-up takes about a second. Meanwhile the daemon is live, not ready.
    hung = connect(context, running.ipc)
    hung.send_multipart(encode_request("hung", model="sleeper", klass="standard", inputs=sleep_for(40_000)))
    assert receive(hung, 30_000).status == "INTERNAL"
    code, line = probe(capsys, "ready", running.ipc)
    assert code == 1 and "lane standard recovering" in line, line
    assert probe(capsys, "live", running.ipc)[0] == 0
    wait_for(lambda: probe(capsys, "ready", running.ipc)[0] == 0, 60, "the lane to recover")


def test_a_drain_is_not_ready_at_once_but_still_live(
    capsys: pytest.CaptureFixture[str], context: zmq.Context, own_daemon: StartDaemon
) -> None:
    running = own_daemon("[server]\ndrain_timeout_ms = 120000\n")
    assert probe(capsys, "ready", running.ipc)[0] == 0
    # About a second of compute: the window in which the daemon drains.
    sock = connect(context, running.ipc)
    images = random_input("cnn-heavy", rows=256, seed=1)
    sock.send_multipart(encode_request("long", model="cnn-heavy", klass="standard", deadline_ms=60_000, inputs=images))
    watcher = connect(context, running.ipc)
    admitted = lambda: exchange(watcher, [header(id="s", op="stats")]).header["classes"]["standard"]["admitted"]  # noqa: E731
    wait_for(lambda: admitted() == 1, 10, "the long request was admitted")
    running.process.process.send_signal(signal.SIGTERM)

    # The signal is the steering thread's to act on, the probe the loop's to answer: a
    # probe sent at once may be read first. Within 1 s (20 times what a stop may take to
    # be acted on), and while the long request still runs, the probe says draining.
    def draining() -> bool:
        code, line = probe(capsys, "ready", running.ipc)
        return (code, line.strip()) == (1, "not ready: draining")

    wait_for(draining, 1.0, "the ready probe to say draining")
    assert probe(capsys, "live", running.ipc)[0] == 0
    assert receive(sock, 60_000).status == "OK"
    assert running.process.process.wait(timeout=30) == 0


def test_the_probe_is_an_exit_code_of_the_edged_command(daemon: RunningDaemon, short_tmp: Path) -> None:
    ready = run_edged("health", "--probe", "ready", "--endpoint", daemon.ipc)
    assert (ready.returncode, ready.stdout.strip()) == (0, "ready")
    gone = run_edged("health", "--probe", "live", "--endpoint", f"ipc://{short_tmp}/none.sock", "--timeout-ms", "300")
    assert gone.returncode == 1 and "no reply" in gone.stderr
