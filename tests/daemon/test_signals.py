"""Signals at the moments that used to break the daemon: while start-up or a reload
warms a dear model. Only the steering thread acts on a signal; each ends in its
documented outcome, with exit 0, and every admitted request answered exactly once."""

from __future__ import annotations

import os
import shutil
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from support import RunningDaemon, connect, receive, start_daemon, wait_for
from support.models import PATIENT_WATCHDOGS, dear_warmup_repository, sleep_for

from edged.wire.codec import encode_request

# The sleeper's n = 3000 takes about 0.25 s here: warming it (five calls a lane) leaves a
# window of seconds for the signal.
WARMUP_N = 3000
CONFIG = '[server]\nmodel_repository = "{repository}"\ndrain_timeout_ms = 120000\n' + PATIENT_WATCHDOGS


@pytest.fixture
def repository() -> Iterator[Path]:
    root = dear_warmup_repository(WARMUP_N)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def no_traceback(running: RunningDaemon) -> None:
    log = running.log()
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]


def test_sigterm_while_start_up_warms_exits_zero(repository: Path) -> None:
    running = start_daemon(CONFIG.format(repository=repository), wait=False)
    try:
        wait_for(lambda: "listening on" in running.log() or not running.alive(), 120, "the signal handlers")
        os.kill(running.pid, signal.SIGTERM)
        assert running.process.process.wait(timeout=60) == 0, running.log()[-3000:]
        no_traceback(running)
    finally:
        running.close()


def test_sighup_then_sigterm_while_the_reload_warms_answers_every_admitted_request(
    context: zmq.Context, repository: Path
) -> None:
    """What `systemctl reload` then `systemctl stop` do: the queued bulk work is answered,
    each request once, and the daemon exits 0."""
    running = start_daemon(CONFIG.format(repository=repository))
    try:
        sock = connect(context, running.ipc)
        sent = 30
        for i in range(sent):
            request = encode_request(i, model="sleeper", klass="bulk", deadline_ms=120_000, inputs=sleep_for(500))
            sock.send_multipart(request)
        os.kill(running.pid, signal.SIGHUP)
        wait_for(lambda: "reload loaded" in running.log() or not running.alive(), 120, "the reload's warm-up")
        os.kill(running.pid, signal.SIGTERM)
        answers: Counter[int] = Counter()
        statuses: Counter[str] = Counter()
        for _ in range(sent):
            reply = receive(sock, 60_000)
            answers[reply.header["id"]] += 1
            statuses[reply.status] += 1
        assert set(answers) == set(range(sent)) and set(answers.values()) == {1}
        # Admission may shed some at arrival where a busy box priced the sleeper dear at its
        # warm-up; what it admitted is answered OK, none expires, nothing is lost.
        assert statuses["OK"] and set(statuses) <= {"OK", "OVERLOADED"}, statuses
        assert running.process.process.wait(timeout=60) == 0, running.log()[-3000:]
        no_traceback(running)
        assert "reloaded: now serving" in running.log()
    finally:
        running.close()
