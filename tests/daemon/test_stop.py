"""A stop loses nothing (docs/operations.md, "Stopping"): every message that reached a
socket before the daemon closed it gets exactly one reply, through reloads cut short and
behind calls that take long or never return; and the steering thread, which never runs
a call, acts on SIGTERM at once."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from support import ENGINES, RunningDaemon, connect, random_input, receive, short_dir, start_daemon, wait_for
from support.models import save_sleeper, sleep_for
from support.notify import NotifyListener

from edged.client import Client
from edged.wire.codec import encode_request

# What a stop's replies may be: each request's one reply, run or refused as documented.
DOCUMENTED = {"OK", "UNAVAILABLE", "OVERLOADED", "DEADLINE_EXCEEDED"}
# SIGTERM acted on within this long (the target is 50 ms: five times its margin).
ACT_WITHIN_S = 0.25


@pytest.fixture
def repository() -> Iterator[Path]:
    """The sleeper (its call as long as its input says, priced by a short warm-up) beside
    mlp-light and cnn-heavy."""
    root = short_dir()
    save_sleeper(root)
    shutil.copytree(ENGINES / "cnn-heavy", root / "cnn-heavy")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def answers(sock: zmq.Socket, running: RunningDaemon, sent: int) -> Counter[str]:
    """The statuses of the replies to `sent` requests, each id counted: every id once."""
    seen: Counter[object] = Counter()
    statuses: Counter[str] = Counter()
    while sum(seen.values()) < sent:
        reply = receive(sock, 30_000)
        seen[reply.header["id"]] += 1
        statuses[reply.status] += 1
    assert all(count == 1 for count in seen.values()), seen
    assert len(seen) == sent
    assert not sock.poll(300), "a request was answered twice"
    return statuses


def acted_on_sigterm_within(running: RunningDaemon) -> float:
    """Send SIGTERM and return how long the daemon took to log that it drains."""
    sent = time.monotonic()
    os.kill(running.pid, signal.SIGTERM)
    wait_for(lambda: "SIGTERM: draining" in running.log(), 30, "the drain")
    return time.monotonic() - sent


def test_a_stop_after_reloads_answers_every_request_once(context: zmq.Context, repository: Path) -> None:
    """The schedule that lost a reply in about half its runs: bulk requests for a conv
    model, three SIGHUPs between batches of them, then SIGTERM 50 ms after the last."""
    config = f'[server]\nmodel_repository = "{repository}"\ndrain_timeout_ms = 60000\n'
    for _run in range(3):
        running = start_daemon(config)
        try:
            sock = connect(context, running.ipc)
            sent = 0
            for count, pause_s, sig in ((9, 0.20, "HUP"), (5, 0.07, "HUP"), (10, 0.19, "HUP"), (4, 0.05, "TERM")):
                for _ in range(count):
                    sent += 1
                    inputs = random_input("cnn-heavy", 1, sent)
                    sock.send_multipart(encode_request(sent, model="cnn-heavy", klass="bulk", inputs=inputs))
                time.sleep(pause_s)
                os.kill(running.pid, getattr(signal, f"SIG{sig}"))
            statuses = answers(sock, running, sent)
            assert set(statuses) <= DOCUMENTED, statuses
            assert running.process.process.wait(timeout=60) == 0, running.log()[-3000:]
            assert "Traceback" not in running.log()
            sock.close(linger=0)
        finally:
            running.close()


def test_sigterm_behind_a_long_inline_call_is_acted_on_at_once_and_every_request_answered(
    context: zmq.Context, repository: Path
) -> None:
    """A realtime call of about a second runs inline on realtime's loop (the sleeper is
    priced by a short warm-up), three bulk requests wait behind it, then SIGTERM: the
    steering thread drains at once, and each request gets its one reply (before, the
    last of the four was never answered in 4 of 5 runs)."""
    # A drain long enough for all four on a busy box: each is then answered OK.
    config = f'[server]\nmodel_repository = "{repository}"\ndrain_timeout_ms = 60000\n'
    running = start_daemon(config + "[classes.realtime]\nstuck_after_ms = 0\n[classes.standard]\n[classes.bulk]\n")
    try:
        sock = connect(context, running.ipc)
        sock.send_multipart(encode_request(0, model="sleeper", klass="realtime", inputs=sleep_for(12000)))
        for i in range(1, 4):
            # A minute to live: on a busy box the calls ahead take several times longer, and
            # each of these is then run, or refused by the drain, rather than expired.
            request = encode_request(i, model="sleeper", klass="bulk", deadline_ms=60_000, inputs=sleep_for(2000))
            sock.send_multipart(request)
        time.sleep(0.3)
        assert acted_on_sigterm_within(running) < ACT_WITHIN_S
        statuses = answers(sock, running, 4)
        # The realtime call runs to its end. The bulk requests wait to be read while realtime's
        # loop computes (edged.serve.transport.turns): run, or refused by the drain, each once.
        assert statuses["OK"] >= 1 and set(statuses) <= {"OK", "UNAVAILABLE"}, statuses
        assert running.process.process.wait(timeout=60) == 0
        sock.close(linger=0)
    finally:
        running.close()


def test_sigterm_beside_a_hung_call_is_acted_on_at_once_and_the_call_answered_internal(
    context: zmq.Context, repository: Path
) -> None:
    """A bulk call that will not return for minutes: SIGTERM is acted on at once; once
    the drain and the stop's grace run out, its request is answered INTERNAL, and the
    daemon exits 0 without waiting for it."""
    config = (
        f'[server]\nmodel_repository = "{repository}"\ndrain_timeout_ms = 300\nstop_grace_ms = 300\n'
        "[classes.realtime]\n[classes.standard]\n[classes.bulk]\nstuck_after_ms = 0\n"
    )
    running = start_daemon(config)
    try:
        sock = connect(context, running.ipc)
        sock.send_multipart(encode_request("hung", model="sleeper", klass="bulk", inputs=sleep_for(2_000_000)))
        time.sleep(0.3)
        assert acted_on_sigterm_within(running) < ACT_WITHIN_S
        reply = receive(sock, 30_000)
        assert reply.status == "INTERNAL" and "stopped before this backend call returned" in reply.header["error"]
        assert running.process.process.wait(timeout=30) == 0
        sock.close(linger=0)
    finally:
        running.close()


def test_sigterm_just_after_a_burst_of_realtime_requests_answers_each_once(
    context: zmq.Context, repository: Path
) -> None:
    """SIGTERM 20 ms after twelve realtime requests for the conv model, which had left
    all twelve unanswered: each reached the daemon's socket, so each gets its one reply."""
    for _run in range(3):
        running = start_daemon(f'[server]\nmodel_repository = "{repository}"\n')
        try:
            sock = connect(context, running.ipc)
            for i in range(12):
                inputs = random_input("cnn-heavy", 1, i)
                sock.send_multipart(encode_request(i, model="cnn-heavy", klass="realtime", inputs=inputs))
            time.sleep(0.02)
            os.kill(running.pid, signal.SIGTERM)
            statuses = answers(sock, running, 12)
            assert set(statuses) <= DOCUMENTED, statuses
            assert running.process.process.wait(timeout=60) == 0, running.log()[-3000:]
            sock.close(linger=0)
        finally:
            running.close()


def steering_fault_program(trigger: Path, method: str = "edged.daemon.trimmer:Trimmer.check") -> list[str]:
    """`python -m edged` with a bug put on its steering thread by the test: `method` (module:Class.name,
    a step of that thread) raises once `trigger` exists, after doing its work (no real fault of that
    thread is known)."""
    module, qualified = method.split(":")
    owner, name = qualified.split(".")
    code = (
        "import os, runpy\n"
        f"from {module} import {owner}\n"
        f"real = {owner}.{name}\n"
        "def faulty(self, *args):\n"
        "    real(self, *args)\n"
        f"    if os.path.exists({str(trigger)!r}):\n"
        "        raise RuntimeError('a fault the test put on the steering thread')\n"
        f"{owner}.{name} = faulty\n"
        "runpy.run_module('edged', run_name='__main__')\n"
    )
    return [sys.executable, "-c", code]


def test_an_injected_bug_on_the_steering_thread_drains_refusing_new_requests_answering_all(
    context: zmq.Context, repository: Path
) -> None:
    """The steering thread raises while a bulk call runs and another waits: the daemon logs it,
    tells systemd it stops, refuses what arrives from then on (health says draining), drains
    what it admitted, answers every request once, and exits 1 for systemd to restart it
    (before, it went on admitting while it stopped, then refused the queued request)."""
    trigger = repository / "fault"
    config = f'[server]\nmodel_repository = "{repository}"\ndrain_timeout_ms = 60000\nstop_grace_ms = 60000\n'
    listener = NotifyListener(repository / "notify.sock")
    running = start_daemon(config, program=steering_fault_program(trigger), env={"NOTIFY_SOCKET": str(listener.path)})
    try:
        sock = connect(context, running.ipc)
        # A call of about 4 s: the stop waits for it, and the requests below come meanwhile.
        sock.send_multipart(
            encode_request(1, model="sleeper", klass="bulk", deadline_ms=60_000, inputs=sleep_for(40000))
        )
        with Client(running.ipc) as watcher:
            wait_for(lambda: watcher.stats()["classes"]["bulk"]["backend_calls"] >= 1, 30, "the call under way")
            # Queued behind it on bulk's one worker: admitted before the fault, so drained, not refused.
            sock.send_multipart(
                encode_request(7, model="sleeper", klass="bulk", deadline_ms=60_000, inputs=sleep_for(100))
            )
            wait_for(lambda: watcher.stats()["classes"]["bulk"]["admitted"] >= 2, 30, "the second request queued")
            trigger.touch()
            wait_for(lambda: "a fault the test put" in running.log(), 30, "the failure in the log")
            wait_for(lambda: watcher.health()["state"] == "draining", 10, "health saying draining")
        sock.send_multipart(encode_request("health", op="health"))
        for i in range(2, 6):
            sock.send_multipart(encode_request(i, model="mlp-light", inputs=random_input("mlp-light", 1, i)))
        replies = [receive(sock, 30_000) for _ in range(7)]
        by_id = {reply.header["id"]: reply for reply in replies}
        assert len(by_id) == 7 and not sock.poll(300), "a request was answered twice"
        assert by_id["health"].header["state"] == "draining" and by_id["health"].header["ready"] is False
        assert by_id[1].status == "OK"  # the call under way ran to its end
        assert by_id[7].status == "OK", by_id[7].header  # the queued one was drained
        assert {by_id[i].status for i in range(2, 6)} == {"UNAVAILABLE"}
        assert running.process.process.wait(timeout=60) == 1, running.log()[-3000:]
        assert "RuntimeError: a fault the test put on the steering thread" in running.log()
        assert "the steering thread failed: draining" in running.log()
        assert listener.times("STOPPING"), listener.messages
        sock.close(linger=0)
    finally:
        running.close()
        listener.close()


def test_a_steering_thread_failing_mid_reload_stops_once_the_loops_are_past_its_fence(
    context: zmq.Context, repository: Path
) -> None:
    """The steering thread raises just after handing a reload's lanes to the loops, before it
    records the switch: with nothing admitted, it stops at once (before, it waited out the whole
    drain_timeout_ms, 60 s here, for a switch it would never record), answering what comes."""
    trigger = repository / "fault"
    config = f'[server]\nmodel_repository = "{repository}"\ndrain_timeout_ms = 60000\n'
    running = start_daemon(config, program=steering_fault_program(trigger, "edged.daemon.daemon:Daemon._take_loaded"))
    try:
        trigger.touch()
        os.kill(running.pid, signal.SIGHUP)
        wait_for(lambda: "a fault the test put" in running.log(), 30, "the failure in the log")
        sock = connect(context, running.ipc)
        sock.send_multipart(encode_request(1, model="mlp-light", inputs=random_input("mlp-light", 1, 1)))
        # Answered refused or, should the stop already have closed the socket, never read: either is a stop.
        if sock.poll(5_000):
            assert receive(sock, 1_000).status == "UNAVAILABLE"
        # A reload and a stop take a second or two: 12 s is a fifth of the drain timeout.
        assert running.process.process.wait(timeout=12) == 1, running.log()[-3000:]
        assert "the steering thread failed: draining" in running.log()
        sock.close(linger=0)
    finally:
        running.close()


FLOOD = """
import sys, msgpack, zmq
sock = zmq.Context().socket(zmq.DEALER)
sock.linger, sock.rcvhwm = 0, 0
sock.connect(sys.argv[1])
# A legal health request, slow to decode (6,000 keys): two such senders outpace the loop.
frames = [msgpack.packb({"v": 1, "id": 1, "op": "health", **{key: key for key in range(6000)}})]
while True:
    sock.send_multipart(frames)
    while sock.poll(0):
        sock.recv_multipart()
"""


# Probed: sockets still open 0.1 s into the stop, whose loops close after the flooded one's
# last turn (realtime's closes first) or are the flooded loop's own (the shared socket).
@pytest.mark.parametrize(("flooded", "probed"), [("realtime", ["d-bulk.sock", "d.sock"]), ("standard", ["d.sock"])])
def test_a_stop_under_a_flood_that_never_lets_up_closes_and_answers_the_other_clients(
    context: zmq.Context, short_tmp: Path, flooded: str, probed: list[str]
) -> None:
    """A closing loop read each socket until empty, which a flood never is: flooded, the
    realtime loop's last turn never ended and the other loops gave way to it; the standard
    loop never reached its second socket, the shared one. A request sent in the stop had no
    reply, the loops 'did not close', and their sockets were destroyed under them."""
    running = start_daemon("[server]\nstop_grace_ms = 3000\ndrain_timeout_ms = 1000\n")
    script = short_tmp / "flood.py"
    script.write_text(FLOOD)
    target = running.ipc.replace("d.sock", f"d-{flooded}.sock")
    floods = [subprocess.Popen([sys.executable, str(script), target]) for _ in range(2)]
    try:
        time.sleep(1.5)
        os.kill(running.pid, signal.SIGTERM)
        time.sleep(0.1)  # in the stop, a tenth of the flooded loop's last second
        probes = [connect(context, running.ipc.replace("d.sock", name)) for name in probed]
        for sock in probes:
            for index in range(5):
                sock.send_multipart(
                    encode_request(index, model="mlp-light", inputs=random_input("mlp-light", 1, index))
                )
        statuses = Counter(receive(sock, 10_000).status for sock in probes for _ in range(5))
        assert set(statuses) <= {"UNAVAILABLE", "OK"} and sum(statuses.values()) == 5 * len(probes), statuses
        assert running.process.process.wait(timeout=30) == 0
        log = running.log()
        assert "stopped (" in log and "did not close" not in log and "Traceback" not in log, log[-2000:]
    finally:
        for flood in floods:
            flood.kill()
            flood.wait()
        running.close()
