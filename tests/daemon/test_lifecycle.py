"""The daemon's life: start-up, SIGTERM and drain, and `edged serve` refusing to start.
Each test here that needs a daemon starts its own, because it stops it."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zmq
from support import (
    Reference,
    RunningDaemon,
    assert_close,
    connect,
    exchange,
    header,
    random_input,
    receive,
    start_daemon,
    wait_for,
)

from edged.client import Client, Unavailable
from edged.wire.codec import encode_request

StartDaemon = Callable[..., RunningDaemon]


def stats(sock: zmq.Socket, klass: str) -> dict:
    return exchange(sock, [header(id="stats", op="stats")]).header["classes"][klass]


def test_sigterm_on_an_idle_daemon_exits_zero_and_removes_its_socket_files(own_daemon: StartDaemon) -> None:
    running = own_daemon()
    files = sorted(path.name for path in running.folder.glob("d*.sock"))
    assert files == ["d-bulk.sock", "d-realtime.sock", "d-standard.sock", "d.sock"]
    running.process.process.send_signal(signal.SIGTERM)
    assert running.process.process.wait(timeout=30) == 0, running.log()[-2000:]
    assert not list(running.folder.glob("*.sock")), "a socket file is left for clients to find"


def test_sigterm_drains_admitted_work_and_refuses_new_work(
    context: zmq.Context, own_daemon: StartDaemon, reference: Reference
) -> None:
    # A drain time far past the work, so that a slow machine drains it all too.
    running = own_daemon("[server]\ndrain_timeout_ms = 120000\n")
    sock = connect(context, running.ipc)
    # About a second of compute on one standard worker: the window in which the daemon drains.
    images = random_input("cnn-heavy", rows=256, seed=1)
    sock.send_multipart(encode_request("long", model="cnn-heavy", klass="standard", deadline_ms=60_000, inputs=images))
    watcher = connect(context, running.ipc)
    wait_for(lambda: stats(watcher, "standard")["admitted"] == 1, 10, "the long request was admitted")

    running.process.process.send_signal(signal.SIGTERM)
    with Client(running.ipc, timeout_ms=5000) as client:
        wait_for(lambda: client.health()["state"] == "draining", 5, "health says draining")
        with pytest.raises(Unavailable, match="draining"):
            client.infer("mlp-light", random_input("mlp-light", 1, 0))
    reply = receive(sock, 120_000)
    assert (reply.header["id"], reply.status) == ("long", "OK"), reply.header
    assert_close(reply.output(), reference.run("cnn-heavy", images))
    assert running.process.process.wait(timeout=30) == 0, running.log()[-2000:]


def test_work_still_running_when_the_drain_time_runs_out_is_answered(
    context: zmq.Context, own_daemon: StartDaemon
) -> None:
    """The protocol: every request gets exactly one reply, no silent drop. A stop
    cannot wait for ever, but what it cuts short must still be answered, whatever the
    status, before the daemon exits."""
    running = own_daemon("[server]\ndrain_timeout_ms = 200\n")
    sock = connect(context, running.ipc)
    # Several seconds of compute: it cannot finish within the drain time.
    images = {"image": np.zeros((1024, 3, 64, 64), dtype=np.float32)}
    sock.send_multipart(encode_request("long", model="cnn-heavy", klass="standard", deadline_ms=60_000, inputs=images))
    watcher = connect(context, running.ipc)
    wait_for(lambda: stats(watcher, "standard")["admitted"] == 1, 10, "the long request was admitted")
    running.process.process.send_signal(signal.SIGTERM)
    code = running.process.process.wait(timeout=60)
    assert code == 0, running.log()[-2000:]
    assert sock.poll(1000), "the daemon exited without answering the request it was running"
    assert receive(sock, 0).header["id"] == "long"


def test_a_call_still_running_when_the_stop_grace_runs_out_is_answered_internal(
    context: zmq.Context, own_daemon: StartDaemon
) -> None:
    """Past drain_timeout_ms and stop_grace_ms the daemon exits even though a backend
    call has not returned; the request inside it still gets its one reply."""
    running = own_daemon("[server]\ndrain_timeout_ms = 100\nstop_grace_ms = 300\n")
    sock = connect(context, running.ipc)
    images = {"image": np.zeros((1024, 3, 64, 64), dtype=np.float32)}  # seconds of compute
    sock.send_multipart(encode_request("long", model="cnn-heavy", klass="standard", deadline_ms=60_000, inputs=images))
    watcher = connect(context, running.ipc)
    wait_for(lambda: stats(watcher, "standard")["backend_calls"] >= 1, 10, "the long request to start running")
    running.process.process.send_signal(signal.SIGTERM)
    code = running.process.process.wait(timeout=60)
    assert code == 0, running.log()[-2000:]
    reply = receive(sock, 1000)
    assert reply.header["id"] == "long" and reply.status == "INTERNAL", reply.header
    assert "stopped before this backend call returned" in reply.header["error"]
    assert "still inside the backend at exit" in running.log()


def test_while_starting_control_ops_answer_and_infer_is_unavailable(context: zmq.Context) -> None:
    # Warming a batch of 64 of cnn-heavy five times keeps the daemon starting for a second or so.
    config = '[server]\ndefault_class = "only"\n[classes.only]\nmax_batch = 64\n'
    running = start_daemon(config, wait=False)
    try:
        sock = connect(context, running.ipc)
        health = exchange(sock, [header(id=1, op="health")])
        assert health.header["state"] == "starting", "the daemon was already serving: nothing was tested"
        refused = exchange(sock, encode_request(2, model="mlp-light", inputs=random_input("mlp-light", 1, 0)))
        assert refused.status == "UNAVAILABLE" and "starting" in refused.header["error"]
        assert exchange(sock, [header(id=3, op="models")]).header["models"] == []
        running.process.wait_serving(timeout_s=60)
        served = exchange(sock, encode_request(4, model="mlp-light", inputs=random_input("mlp-light", 1, 0)))
        assert served.status == "OK"
    finally:
        running.close()


# --- `edged serve` refusing to start ------------------------------------------------


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    """`edged serve` that is expected to give up at once; hanging counts as a failure."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "edged", "serve", *args], capture_output=True, text=True, timeout=10, check=False
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"edged serve {' '.join(args)} had not exited after {exc.timeout:.0f} s; stderr: {exc.stderr!r}")


def test_serve_with_a_bad_config_exits_2_naming_the_key(short_tmp: Path) -> None:
    config = short_tmp / "edged.toml"
    config.write_text('[server]\nlog_level = "loud"\n')
    result = serve("--config", str(config), "--endpoint", f"ipc://{short_tmp}/d.sock")
    assert result.returncode == 2
    assert "server.log_level" in result.stderr


def test_serve_refuses_an_ipc_socket_another_daemon_serves(daemon: RunningDaemon) -> None:
    result = serve("--endpoint", daemon.ipc)
    assert result.returncode == 1
    assert "in use" in result.stderr
    with Client(daemon.ipc) as client:  # and the daemon that holds it was not disturbed
        assert client.health()["state"] == "serving"


def test_serve_refuses_a_tcp_port_another_daemon_serves(daemon: RunningDaemon) -> None:
    result = serve("--endpoint", daemon.tcp)
    assert result.returncode == 1
    assert "cannot bind" in result.stderr
    with Client(daemon.tcp) as client:
        assert client.health()["state"] == "serving"


def test_serve_with_an_empty_repository_exits_1_saying_why(short_tmp: Path) -> None:
    (short_tmp / "models").mkdir()
    config = short_tmp / "edged.toml"
    config.write_text('[server]\nmodel_repository = "models"\n')
    result = serve("--config", str(config), "--endpoint", f"ipc://{short_tmp}/d.sock")
    assert result.returncode == 1
    assert "no model" in result.stderr


def test_serve_refuses_an_ipc_path_that_is_no_socket_and_leaves_it_alone(short_tmp: Path) -> None:
    """A file there (before: deleted, as a dead daemon's socket is) or a folder (a traceback)."""
    victim = short_tmp / "notes.txt"
    victim.write_text("a user's file")
    folder = short_tmp / "folder.sock"
    folder.mkdir()
    for path in (victim, folder):
        result = serve("--endpoint", f"ipc://{path}")
        assert result.returncode == 1, result.stderr
        assert "is not a socket" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert victim.read_text() == "a user's file" and folder.is_dir()
    # The class sockets bound beside it before the refusal are gone with it.
    assert sorted(path.name for path in short_tmp.iterdir()) == ["folder.sock", "notes.txt"]


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (("--endpoint", "ipc://"), "names no socket file"),
        (("--endpoint", "ipc:///proc/none/d.sock"), "cannot make the folder of ipc socket"),
        (("--config", "CONFIG_DIR"), "is a folder"),
        (("--config", "NOT_UTF8"), "not UTF-8"),
    ],
)
def test_serve_with_an_endpoint_or_config_it_cannot_read_says_why_without_a_traceback(
    short_tmp: Path, args: tuple[str, str], phrase: str
) -> None:
    not_utf8 = short_tmp / "latin.toml"
    not_utf8.write_bytes(b"\xff\xfe[server]\n")
    where = {"CONFIG_DIR": str(short_tmp), "NOT_UTF8": str(not_utf8)}
    args = tuple(where.get(arg, arg) for arg in args)
    endpoint = () if "--endpoint" in args else ("--endpoint", f"ipc://{short_tmp}/d.sock")
    result = serve(*args, *endpoint)
    assert result.returncode in (1, 2), result.stderr
    assert phrase in result.stderr and "Traceback" not in result.stderr, result.stderr
