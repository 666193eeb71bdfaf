"""The spin (edged.serve.transport.spin): a loop polls after its turn only where its requests
have lately come back that fast, and never while another part of the daemon has work."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import zmq
from support import connect, exchange, header, random_input, receive, short_dir, wait_for
from support.models import dear_warmup_repository, save_sleeper, sleep_for

from edged.config.file import parse_config
from edged.daemon.lifecycle import Lifecycle
from edged.daemon.loops import Loops
from edged.protocol import encode_request
from edged.serve.transport.loop import Loop
from edged.serve.transport.sockets import Sockets
from edged.serve.transport.spin import GAP_COUNTED, Spin

# A spin of up to 10 ms, the most the key takes: a client that sends each request as the last answer
# comes back is within it even on a busy box (at 5 ms, one beside a chaos run was not), and one that
# waits 50 ms between them is past the 40 ms a gap counts at most.
CONFIG = """
[server]
spin_max_us = 10000
{repository}
[classes.realtime]
[classes.standard]
[classes.bulk]
"""


def light(request_id: object) -> list:
    return encode_request(request_id, model="mlp-light", inputs=random_input("mlp-light", 1, 0))


def standard_stats(sock: zmq.Socket) -> dict:
    return exchange(sock, [header(id="s", op="stats")]).header["classes"]["standard"]


def closed_loop(sock: zmq.Socket) -> dict:
    """50 light requests, each sent as the last answer came back (armed by them, a loop
    spins); then the standard class's stats."""
    for i in range(50):
        assert exchange(sock, light(i)).status == "OK"
    return standard_stats(sock)


def test_a_loop_spins_where_requests_come_back_at_once_and_stops_once_they_come_seldom(
    own_daemon, context: zmq.Context
) -> None:
    running = own_daemon(CONFIG.format(repository=""))
    sock = connect(context, running.ipc)
    try:
        before = standard_stats(sock)
        close = closed_loop(sock)
        time.sleep(2.5)  # idle: the daemon's fences wake the loop each second
        idle = standard_stats(sock)
        for i in range(10):
            time.sleep(0.05)  # a client that waits between requests
            assert exchange(sock, light(i)).status == "OK"
        seldom = standard_stats(sock)
        after = standard_stats(sock)
    finally:
        sock.close(linger=0)
    # Disarmed at start: nothing measured yet.
    assert before["spin_us"] == 0 and before["spins"] == 0, before
    assert 0 < close["spin_us"] <= 10000 and close["spins"] >= 25, close
    # Once, after the stats request's own turn; never after a fence's.
    assert close["spins"] <= idle["spins"] <= close["spins"] + 1, (close, idle)
    assert seldom["spin_us"] == 0 and seldom["arrival_gap_us"] > 10000, seldom
    # The stats request right after the last one came at once, yet the average stays past it.
    assert after["spins"] == seldom["spins"], (seldom, after)


def test_a_loop_never_spins_while_a_lane_has_work(own_daemon, context: zmq.Context) -> None:
    """A bulk call runs on a worker for about a second: standard's loop, armed by requests that
    come back at once, sleeps in its poll after each of them rather than take the interpreter
    lock from that worker; once the call is answered, it spins again."""
    repository = short_dir()
    save_sleeper(repository)
    running = own_daemon(CONFIG.format(repository=f'model_repository = "{repository}"'))
    sock, bulk = connect(context, running.ipc), connect(context, running.ipc)
    try:
        closed_loop(sock)
        long_call = encode_request("long", model="sleeper", klass="bulk", deadline_ms=60_000, inputs=sleep_for(8000))
        bulk.send_multipart(long_call)
        time.sleep(0.05)  # the bulk request admitted, its call begun
        armed = standard_stats(sock)
        beside = closed_loop(sock)
        # Else the call ended within the 50 requests, and the test says nothing.
        assert not bulk.poll(0), "the bulk call ended before the light requests did: make it longer"
        assert receive(bulk, 60_000).status == "OK"
        after = closed_loop(sock)
    finally:
        sock.close(linger=0)
        bulk.close(linger=0)
        shutil.rmtree(repository, ignore_errors=True)
    assert armed["spin_us"] > 0 and armed["spins"] > 0, armed
    assert beside["spins"] == armed["spins"] and beside["spin_us"] > 0, (armed, beside)
    assert after["spins"] >= beside["spins"] + 30, (beside, after)


def test_a_loop_never_spins_while_a_reload_warms_new_lanes(own_daemon, context: zmq.Context) -> None:
    """A reload warms the sleeper at a dear n on each new lane, a second or more in all: standard's
    loop, armed, sleeps after each request meanwhile (the warm-up times the new lanes' prices), and
    spins again once the new lanes serve and the old ones are gone."""
    repository = dear_warmup_repository(1500)  # about 0.12 s a call, five calls a lane
    running = own_daemon(CONFIG.format(repository=f'model_repository = "{repository}"'))
    sock = connect(context, running.ipc)
    try:
        armed = closed_loop(sock)
        os.kill(running.pid, signal.SIGHUP)
        wait_for(lambda: "SIGHUP: re-reading" in running.log(), 10, "the reload to begin")
        time.sleep(0.1)  # the steering thread's turn that logged it ends
        during = closed_loop(sock)
        # Else the reload ended within the 50 requests, and the test says nothing.
        assert "reloaded: now serving" not in running.log(), "the reload ended too soon: warm up at a dearer n"
        wait_for(lambda: "reloaded: now serving" in running.log(), 60, "the reload to end")
        time.sleep(0.5)  # the old lanes, idle, end within the steering thread's next turns
        after = closed_loop(sock)
    finally:
        sock.close(linger=0)
        shutil.rmtree(repository, ignore_errors=True)
    assert armed["spin_us"] > 0 and armed["spins"] > 0, armed
    # At most once, after the stats request's own turn, before the SIGHUP.
    assert during["spins"] <= armed["spins"] + 1, (armed, during)
    assert after["spins"] >= during["spins"] + 30, (during, after)


def test_a_loop_never_spins_while_a_replacement_worker_warms(own_daemon, context: zmq.Context) -> None:
    """A bulk call past stuck_after_ms has its worker replaced, and the new one warms the sleeper
    at a dear n (its prices are timed): standard's loop, armed, sleeps after each request
    meanwhile, and spins again once the new worker serves."""
    # About 0.24 s a call, five calls: the new worker warmed for 1.26 s, 10 times the 0.12 s from the
    # INTERNAL reply to the light requests' last stats, on the AVX-512 box. Two classes alone: start-up warms two lanes.
    repository = dear_warmup_repository(3000)
    classes = "[classes.standard]\n[classes.bulk]\nstuck_after_ms = 300\n"
    config = f'[server]\nspin_max_us = 10000\nmodel_repository = "{repository}"\n{classes}'
    running = own_daemon(config)
    sock, bulk = connect(context, running.ipc), connect(context, running.ipc)
    try:
        closed_loop(sock)
        bulk.send_multipart(encode_request("hung", model="sleeper", klass="bulk", inputs=sleep_for(8000)))
        assert receive(bulk, 10_000).status == "INTERNAL"  # answered by the watchdog, its worker replaced
        time.sleep(0.1)  # the steering thread's turn that started the new worker ends
        armed = standard_stats(sock)
        during = closed_loop(sock)
        # Else the new worker was warm within the 50 requests, and the test says nothing.
        assert "a new worker serves" not in running.log(), "the new worker warmed too soon: warm up at a dearer n"
        wait_for(lambda: "a new worker serves" in running.log(), 30, "the new worker to serve")
        time.sleep(0.2)  # the steering thread looks every 50 ms while a worker warms
        after = closed_loop(sock)
    finally:
        sock.close(linger=0)
        bulk.close(linger=0)
        shutil.rmtree(repository, ignore_errors=True)
    assert armed["spin_us"] > 0, armed
    assert during["spins"] <= armed["spins"] + 1, (armed, during)
    assert after["spins"] >= during["spins"] + 30, (during, after)


def test_the_daemon_is_quiet_for_a_loop_only_while_every_other_loop_sleeps(short_tmp: Path) -> None:
    """The loops of a daemon with no steering thread and no lanes: realtime's, held inside a
    callable, is awake."""
    config = parse_config({"server": {"endpoints": [f"ipc://{short_tmp}/edged.sock"]}}, short_tmp)
    loops = Loops(config, Lifecycle(), lambda: None)
    serving, held = loops.serving, threading.Event()
    loops.start()
    try:
        time.sleep(0.2)
        assert not serving.quiet("standard"), "quiet while lanes are being built"
        serving.settling = False  # what the steering thread says once they serve
        wait_for(lambda: serving.quiet("standard") and serving.quiet("realtime"), 5, "every loop asleep")
        loops.serving.dispatchers["realtime"].loop.call_soon(held.wait, 5)  # type: ignore[union-attr]
        wait_for(lambda: not serving.quiet("standard"), 5, "realtime's loop awake")
        assert not serving.quiet("bulk") and serving.quiet("realtime")
        held.set()
        wait_for(lambda: serving.quiet("standard"), 5, "realtime's loop asleep again")
    finally:
        held.set()
        loops.close(config.default_class, time.monotonic() + 1)


def test_work_handed_over_while_a_loop_spins_does_not_count_as_a_wake_up(short_tmp: Path) -> None:
    """handoff_ns, which bounds the inline cap, is what waking a sleeping loop costs: a spin
    that catches the work woke nothing."""
    sockets = Sockets((f"ipc://{short_tmp}/spin.sock",), 1 << 20, ("only",), "only", class_sockets=False)
    spin = armed(400_000_000)  # each spin polls for 800 ms
    loop = Loop("only", sockets.by_class["only"], lambda *_: None, spin=spin)
    ran = threading.Event()
    loop.start()
    try:
        wait_for(lambda: spin.spins == 1 and not loop.blocked, 5, "the loop to spin")
        loop.call_soon(ran.set)
        assert ran.wait(5) and loop.handoff_ns == 0  # caught by the spin
        ran.clear()
        wait_for(lambda: loop.blocked, 5, "the spin to end")
        loop.call_soon(ran.set)
        assert ran.wait(5)
        wait_for(lambda: loop.handoff_ns > 0, 5, "a wake-up measured")
    finally:
        loop.close()
        assert loop.join(5)
        sockets.close()


def test_a_spin_ends_as_soon_as_the_daemon_is_no_longer_quiet(short_tmp: Path) -> None:
    sockets = Sockets((f"ipc://{short_tmp}/spin.sock",), 1 << 20, ("only",), "only", class_sockets=False)
    spin, quiet = armed(5_000_000_000), [True]  # each spin polls for 10 s
    loop = Loop("only", sockets.by_class["only"], lambda *_: None, spin=spin, quiet=lambda: quiet[0])
    loop.start()
    try:
        wait_for(lambda: spin.spins == 1 and not loop.blocked, 5, "the loop to spin")
        quiet[0] = False  # another loop woke, or a lane took work
        wait_for(lambda: loop.blocked, 2, "the spin to end")
    finally:
        loop.close()
        assert loop.join(5)
        sockets.close()


def armed(gap_ns: int) -> Spin:
    """A spin armed as if requests had just come every `gap_ns`: it polls for twice that."""
    spin = Spin(10 * gap_ns)
    spin.gap_ns, spin.last_ns = gap_ns, time.monotonic_ns()
    return spin


def test_a_spin_of_zero_never_arms() -> None:
    spin = Spin(0)
    for _ in range(100):
        spin.arrived(1, 0)
    assert spin.length_ns(0) == 0


def test_long_pauses_disarm_the_spin_and_a_few_close_requests_arm_it_again() -> None:
    spin = Spin(250_000)
    for _ in range(100):
        spin.arrived(100_000, 0)
    assert abs(spin.length_ns(0) - 200_000) < 100  # twice the gap
    assert spin.length_ns(GAP_COUNTED * 250_000 + 1) == 0  # no request for that long: an idle loop
    spin.arrived(10**9, 0)  # an idle second counts as GAP_COUNTED spins' length
    assert spin.length_ns(0) > 0
    spin.arrived(10**9, 0)
    assert spin.length_ns(0) == 0
    for _ in range(GAP_COUNTED):
        spin.arrived(100_000, 0)
    assert spin.length_ns(0) > 0


def test_a_turn_longer_than_the_idle_horizon_still_spins_after_it() -> None:
    """A heavy model's 2 ms inline call outlasts GAP_COUNTED spins of 250 us: its loop, served
    requests that come back at once, spins once the call's turn ends (counted from its end)."""
    spin = Spin(250_000)
    turn_ns = 2_200_000  # 100 us from the last turn's end to the next request, then a 2.1 ms turn
    for turn in range(100):
        spin.arrived(100_000, turn * turn_ns + 100_000)
        spin.served((turn + 1) * turn_ns)
    assert abs(spin.length_ns(100 * turn_ns) - 200_000) < 100
