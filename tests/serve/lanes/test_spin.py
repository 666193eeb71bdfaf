"""The socket loop's spin (classes.NAME.spin_us): once done with a request of a class
that has one, when it came within spin_us of the loop being done with the class's
previous request, the loop polls instead of sleeping for that long, only while every
lane is idle.

What a user checks is what it costs and when: CPU burnt while requests of that class
come close together, and not when they come further apart, nor for other classes, nor
at idle, nor while a lane has work.
"""

from __future__ import annotations

import shutil
import threading
import time

import numpy as np
import zmq
from support import REPO_ROOT, connect, exchange, header, random_input, short_dir
from support.backends import CountingBackend
from support.models import save_sleeper, sleep_for
from support.transport import NoSockets

from edged.backends.shared import MemoryPlan
from edged.config.file import load_config
from edged.daemon.lifecycle import Lifecycle, State
from edged.loadgen.launch import cpu_seconds
from edged.models.repository import discover
from edged.protocol import encode_request
from edged.serve.dispatch import Dispatcher
from edged.serve.lanes.lane import Lane

ROOT = REPO_ROOT
SPIN_MS = 10
CONFIG = f"[classes.realtime]\nspin_us = {SPIN_MS * 1000}\n[classes.standard]\n[classes.bulk]\n"
COUNT = 60
CLOSE_S, APART_S = 0.005, 0.025  # within the 10 ms spin, and past it


def cpu_for(sock: zmq.Socket, pid: int, klass: str, gap_s: float) -> float:
    """The daemon's CPU seconds over COUNT light requests of `klass`, `gap_s` apart."""
    before = cpu_seconds(pid)
    for i in range(COUNT):
        request = encode_request(i, model="mlp-light", klass=klass, inputs=random_input("mlp-light", 1, i))
        assert exchange(sock, request).status == "OK"
        time.sleep(gap_s)
    return cpu_seconds(pid) - before


def test_the_loop_spins_while_its_class_comes_close_together_and_never_else(context: zmq.Context, own_daemon) -> None:
    """60 realtime requests 5 ms apart keep the loop spinning between them: about 0.3 s of
    CPU more than as many standard requests (no spin). As many realtime requests 25 ms
    apart (past the 10 ms spin) cost what the standard ones do; three idle seconds, none."""
    running = own_daemon(CONFIG)
    sock = connect(context, running.ipc)
    pid = running.process.process.pid
    spun = cpu_for(sock, pid, "realtime", CLOSE_S)
    apart = cpu_for(sock, pid, "realtime", APART_S)
    plain = cpu_for(sock, pid, "standard", CLOSE_S)
    before = cpu_seconds(pid)
    time.sleep(3)
    idle = cpu_seconds(pid) - before
    # Against the standard requests' CPU, the same work with no spin: the spin fills each
    # 5 ms gap (0.3 s in all), and a spin after every request would add 60 x 10 ms.
    assert spun - plain >= COUNT * CLOSE_S / 5, (spun, plain)
    assert apart - plain <= COUNT * SPIN_MS / 1000 / 5, (apart, plain)
    assert idle <= 0.1, idle


def test_no_spin_while_a_lane_has_work() -> None:
    """Dispatcher.spin_deadline_ns, with real lanes: after two realtime requests close
    together it gives the spin's end, and 0 while another lane holds a job (a gated
    backend call)."""
    folder = short_dir()
    (folder / "edged.toml").write_text(CONFIG)
    config = load_config(folder / "edged.toml")
    models = [m for m in discover(ROOT / "engines", "onnxruntime") if m.name == "mlp-light"]
    backend = CountingBackend()
    lifecycle = Lifecycle()
    dispatcher = Dispatcher(config, NoSockets(), lifecycle)
    lanes = {c.name: Lane(c, models, backend, NoSockets()) for c in config.classes}
    for lane in lanes.values():
        lane.start()
    try:
        dispatcher.serve(config, models, lanes, {}, MemoryPlan(), False, {})
        lifecycle.move(State.SERVING)
        x = np.zeros((1, 64), np.float32)
        realtime = [bytes(f) for f in encode_request(1, model="mlp-light", klass="realtime", inputs={"x": x})]
        dispatcher.handle(None, realtime, time.monotonic_ns(), None)
        assert dispatcher.spin_deadline_ns() == 0  # a first request: nothing says the next comes soon
        dispatcher.handle(None, realtime, time.monotonic_ns(), None)  # within the spin of the first
        assert dispatcher.spin_deadline_ns() > time.monotonic_ns()
        backend.counting, backend.gate = True, threading.Event()  # the next call holds at its start
        standard = [bytes(f) for f in encode_request(2, model="mlp-light", klass="standard", inputs={"x": x})]
        dispatcher.handle(None, standard, time.monotonic_ns(), None)
        assert backend.entered.wait(10)
        assert dispatcher.spin_deadline_ns() == 0  # the standard lane is busy
        backend.gate.set()
    finally:
        for lane in lanes.values():
            lane.stop(2.0)


def test_the_spin_spans_the_loops_idle_gap_not_the_gap_between_arrivals(context: zmq.Context, own_daemon) -> None:
    """Requests that keep the loop busy 7-10 ms each (a sleeper run inline), the next sent
    5 ms after each answer: 12-15 ms from arrival to arrival, past the 10 ms spin, but
    the loop idles 5 ms between them, within it. The spin must fill those 5 ms gaps
    (0.2 s over 40 requests) against as many standard requests (no spin)."""
    repository = short_dir()
    save_sleeper(repository)
    running = own_daemon(
        f'[server]\nmodel_repository = "{repository}"\n'
        f"[classes.realtime]\nspin_us = {SPIN_MS * 1000}\ninline_max_us = 50000\ndeadline_ms = 60000\n"
        "[classes.standard]\ninline_max_us = 50000\ndeadline_ms = 60000\n[classes.bulk]\n"
    )
    sock = connect(context, running.ipc)
    pid = running.process.process.pid
    count, gap_s = 40, 0.005

    def cpu(klass: str) -> float:
        before = cpu_seconds(pid)
        for i in range(count):
            request = encode_request(i, model="sleeper", klass=klass, inputs=sleep_for(100))
            assert exchange(sock, request).status == "OK"
            time.sleep(gap_s)
        return cpu_seconds(pid) - before

    cpu("realtime")  # warm: the first runs price the sleeper and settle the inline path
    spun, plain = cpu("realtime"), cpu("standard")
    stats = exchange(sock, [header(id="s", op="stats")]).header["classes"]
    assert stats["realtime"]["inline"] >= 2 * count and stats["standard"]["inline"] == count, stats
    assert spun - plain >= count * gap_s / 5, (spun, plain)
    shutil.rmtree(repository, ignore_errors=True)
