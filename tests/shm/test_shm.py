"""Tensors in shared memory (edged.shm.registry, edged.client.shm), on a real daemon
over real ipc sockets: inputs read in place and outputs written in place give what
frames give; every bad reference is refused with one clear reply and harms nothing;
a region stays mapped while a request reads it, and is unmapped once forgotten."""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import time
from collections.abc import Iterator
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest
import zmq
from onnx import TensorProto, helper
from support import (
    RunningDaemon,
    connect,
    exchange,
    nothing_more,
    random_input,
    receive,
    short_dir,
    start_daemon,
    wait_for,
)
from support.models import save_model, save_sleeper, sleep_for

from edged.client import AsyncClient, Client, InvalidArgument, api
from edged.wire.codec import encode_request
from edged.wire.endpoints import class_endpoint
from edged.wire.messages import ShmRef
from edged.wire.shm import ShmTensor

X = random_input("mlp-light", 3, seed=5)["x"]


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    # POSIX names trusted: most of these tests register objects by name (test_shm_sealed.py: memfds alone).
    shm = "enabled = true\ntrust_posix_names = true\nidle_s = 2\nmax_region_mb = 4\nmax_regions_per_peer = 3\n"
    running = start_daemon(f"[shm]\n{shm}", tcp=True)
    yield running
    running.close()


@pytest.fixture
def obj() -> Iterator[shared_memory.SharedMemory]:
    """A shared-memory object made by hand, as a client in another language would."""
    made = shared_memory.SharedMemory(name=f"edged-test-{os.getpid()}-{time.monotonic_ns()}", create=True, size=1 << 16)
    yield made
    made.unlink()
    made.close()


@pytest.fixture
def sock(daemon: RunningDaemon) -> Iterator[zmq.Socket]:
    """A raw DEALER on the daemon's shared ipc socket."""
    context = zmq.Context()
    dealer = connect(context, daemon.ipc)
    yield dealer
    dealer.close(linger=0)
    context.term()


def mapped(daemon: RunningDaemon, name: str) -> int:
    """How many of the daemon's mappings are of the shared-memory object `name`."""
    return Path(f"/proc/{daemon.pid}/maps").read_text().count(f"/dev/shm/{name}")


def register(sock: zmq.Socket, name: str, nbytes: int, request_id: int = 1) -> tuple[str, str]:
    reply = exchange(sock, encode_request(request_id, "shm_register", region=ShmRef(name, 0, nbytes)))
    return reply.status, reply.header.get("region") or reply.header.get("error", "")


def assert_serves_from(sock: zmq.Socket, handle: str, request_id: int) -> None:
    """mlp-light answers OK with its input read from the region `handle`."""
    x = ShmTensor(ShmRef(handle, 0, 256), "float32", (1, 64))
    reply = exchange(sock, encode_request(request_id, model="mlp-light", inputs={"x": x}))
    assert reply.status == "OK", reply.header


@pytest.mark.parametrize("named", [False, True], ids=["memfd", "posix-name"])
def test_inputs_and_outputs_in_shared_memory_answer_as_frames_do(daemon: RunningDaemon, named: bool) -> None:
    with Client(daemon.ipc) as client:
        expected = client.infer("mlp-light", {"x": X})["scores"]
        region = client.shared_region(1 << 20, named=named)
        try:
            x, scores = region.array(X.shape), region.array(expected.shape)
            x[:] = X
            # realtime goes to its class's own socket: the handle holds on every connection.
            for klass in ("realtime", "bulk"):
                scores[:] = 0
                got = client.infer("mlp-light", {"x": x}, klass=klass, outputs_into={"scores": scores})["scores"]
                assert np.shares_memory(got, scores)
                np.testing.assert_array_equal(scores, expected)
            assert client.stats()["shm"] == {"regions": 1, "bytes": 1 << 20}
            client.unregister(region)
            assert client.stats()["shm"] == {"regions": 0, "bytes": 0}
            # Unregistered, the same array goes as a frame again.
            np.testing.assert_array_equal(client.infer("mlp-light", {"x": x})["scores"], expected)
        finally:
            del x, scores, got
            region.close()


def test_every_bad_reference_gets_one_clear_refusal_and_harms_nothing(
    daemon: RunningDaemon, sock: zmq.Socket, obj: shared_memory.SharedMemory
) -> None:
    status, handle = register(sock, obj.name, obj.size)
    assert status == "OK", handle

    def infer(request_id: int, ref: ShmRef, shape: tuple[int, ...] = (1, 64), **fields: object) -> str:
        tensor = ShmTensor(ref, "float32", shape)
        frames = encode_request(request_id, model="mlp-light", inputs={"x": tensor}, **fields)
        reply = exchange(sock, frames)
        assert reply.header["id"] == request_id
        return f"{reply.status}: {reply.header.get('error', '')}"

    assert infer(2, ShmRef(handle, 0, 256)).startswith("OK")
    refusals = {
        "past the end": infer(3, ShmRef(handle, obj.size - 100, 256)),
        "unknown handle": infer(4, ShmRef("r" + "0" * 32, 0, 256)),
        "bytes against shape": infer(5, ShmRef(handle, 0, 255)),
        "slot past the end": infer(6, ShmRef(handle, 0, 256), outputs_shm={"scores": ShmRef(handle, obj.size, 40)}),
        "unknown output": infer(7, ShmRef(handle, 0, 256), outputs_shm={"nope": ShmRef(handle, 0, 40)}),
        "slot too small": infer(8, ShmRef(handle, 0, 256), outputs_shm={"scores": ShmRef(handle, 1024, 39)}),
    }
    expected = {
        "past the end": "lie past the end of region",
        "unknown handle": "is registered",
        "bytes against shape": "its region's bytes has 255 bytes, but shape [1, 64] of float32 needs 256",
        "slot past the end": "lie past the end of region",
        "unknown output": "outputs_shm names ['nope']",
        "slot too small": "output 'scores' is 40 bytes, but its slot",
    }
    for case, reply in refusals.items():
        assert reply.startswith("INVALID_ARGUMENT") and expected[case] in reply, (case, reply)
    # None of it harmed the daemon, or this connection's region.
    assert infer(9, ShmRef(handle, 0, 256)).startswith("OK")
    with Client(daemon.ipc) as other:
        assert other.infer("mlp-light", {"x": X})["scores"].shape == (3, 10)
    reply = exchange(sock, encode_request(10, "shm_unregister", region=ShmRef(handle, 0, 0)))
    assert reply.status == "OK"
    reply = exchange(sock, encode_request(11, "shm_unregister", region=ShmRef(handle, 0, 0)))
    assert reply.status == "NOT_FOUND"


def test_registration_is_refused_outside_its_limits_naming_them(
    daemon: RunningDaemon, sock: zmq.Socket, obj: shared_memory.SharedMemory
) -> None:
    assert register(sock, "someone-else", 64) == (
        "INVALID_ARGUMENT",
        "shared-memory object 'someone-else': this daemon maps only names that start with 'edged-'",
    )
    status, error = register(sock, "edged-missing-object", 64)
    assert status == "NOT_FOUND" and "create it (shm_open) first" in error
    status, error = register(sock, obj.name, obj.size + 1)
    assert status == "INVALID_ARGUMENT" and f"fewer than the {obj.size + 1} registered" in error
    status, error = register(sock, obj.name, 5 << 20)
    assert status == "INVALID_ARGUMENT" and "shm.max_region_mb = 4" in error
    handles = [register(sock, obj.name, 1024, i) for i in range(3)]
    assert all(status == "OK" for status, _ in handles)
    status, error = register(sock, obj.name, 1024)
    assert status == "INVALID_ARGUMENT" and "shm.max_regions_per_peer" in error
    for _, handle in handles:
        exchange(sock, encode_request(1, "shm_unregister", region=ShmRef(handle, 0, 0)))
    # On tcp, never: the client may be on another machine.
    tcp = connect(sock.context, daemon.tcp or "")
    status, error = register(tcp, obj.name, 64)
    tcp.close(linger=0)
    assert status == "INVALID_ARGUMENT" and "ipc endpoints only" in error


def test_a_region_stays_mapped_while_a_request_reads_it_and_goes_once_forgotten(
    daemon: RunningDaemon, sock: zmq.Socket, obj: shared_memory.SharedMemory
) -> None:
    name = obj.name.lstrip("/")
    _, handle = register(sock, name, obj.size)
    assert mapped(daemon, name) == 1
    rows = 8  # cnn-heavy, 8 rows: long enough for the unregister to arrive while it runs
    big = shared_memory.SharedMemory(name=name + "-big", create=True, size=rows * 3 * 64 * 64 * 4)
    try:
        _, big_handle = register(sock, big.name, big.size, 2)
        image = ShmTensor(ShmRef(big_handle, 0, big.size), "float32", (rows, 3, 64, 64))
        sock.send_multipart(encode_request(3, model="cnn-heavy", klass="bulk", inputs={"image": image}))
        sock.send_multipart(encode_request(4, "shm_unregister", region=ShmRef(big_handle, 0, 0)))
        replies: dict[int, str] = {}
        while len(replies) < 2:
            reply = receive(sock)
            assert reply.header["id"] not in replies, "a second reply"
            replies[reply.header["id"]] = reply.status
        # The unregister was answered first: it came while the request still read the region.
        assert list(replies.items()) == [(4, "OK"), (3, "OK")]
        assert nothing_more(sock)
        wait_for(lambda: mapped(daemon, big.name) == 0, 5, "the answered request's region to be unmapped")
    finally:
        big.unlink()
        big.close()
    # Unused for shm.idle_s (2 s), a region is forgotten and unmapped.
    wait_for(lambda: mapped(daemon, name) == 0, 10, "the idle region to be unmapped")
    x = ShmTensor(ShmRef(handle, 0, 256), "float32", (1, 64))
    reply = exchange(sock, encode_request(5, model="mlp-light", inputs={"x": x}))
    assert reply.status == "INVALID_ARGUMENT" and "forgotten after shm.idle_s" in reply.header["error"]


def test_shared_memory_is_off_unless_enabled() -> None:
    running = start_daemon()
    before = set(Path("/dev/shm").glob("edged-*"))
    try:
        with Client(running.ipc) as client, pytest.raises(InvalidArgument, match=r"\[shm\] enabled = false"):
            client.shared_region(4096)
        # The region made for the refused registration is gone again.
        assert set(Path("/dev/shm").glob("edged-*")) == before
    finally:
        running.close()


def test_an_output_too_large_for_its_slot_leaves_every_slot_of_the_request_unwritten(
    obj: shared_memory.SharedMemory,
) -> None:
    """A model of two outputs, the second's slot too small: the refusal comes before any
    byte is written, the first output's slot included (docs/protocol.md: nothing is written)."""
    root = short_dir()
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["same"]), helper.make_node("Concat", ["x", "x"], ["twice"], axis=1)],
        "twin",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("same", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("twice", TensorProto.FLOAT, ["N", 8]),
        ],
    )
    spec = {"dtype": "float32"}
    outputs = [{"name": "same", "shape": [-1, 4], **spec}, {"name": "twice", "shape": [-1, 8], **spec}]
    save_model(root, graph, [{"name": "x", "shape": [-1, 4], **spec}], outputs)
    shm = "[shm]\nenabled = true\ntrust_posix_names = true\n"
    running = start_daemon(f'[server]\nmodel_repository = "{root}"\n{shm}')
    context = zmq.Context()
    sock = connect(context, running.ipc)
    try:
        status, handle = register(sock, obj.name, obj.size)
        assert status == "OK", handle
        x = np.arange(4, dtype=np.float32).reshape(1, 4) + 1
        into = {"same": ShmRef(handle, 1024, 16), "twice": ShmRef(handle, 2048, 16)}  # twice needs 32
        reply = exchange(sock, encode_request(2, model="twin", inputs={"x": x}, outputs_shm=into))
        assert reply.status == "INVALID_ARGUMENT" and "output 'twice' is 32 bytes" in reply.header["error"]
        assert not any(obj.buf[1024:1040]) and not any(obj.buf[2048:2064]), "a slot was written"
        into["twice"] = ShmRef(handle, 2048, 32)
        reply = exchange(sock, encode_request(3, model="twin", inputs={"x": x}, outputs_shm=into))
        assert reply.status == "OK", reply.header
        np.testing.assert_array_equal(np.frombuffer(bytes(obj.buf[1024:1040]), np.float32), x[0])
    finally:
        sock.close(linger=0)
        context.term()
        running.close()
        shutil.rmtree(root, ignore_errors=True)


def test_a_big_endian_array_in_a_region_goes_converted_and_is_refused_as_an_output_slot(daemon: RunningDaemon) -> None:
    """The wire is little-endian: a big-endian input lying in a region goes as a frame,
    converted, and gives what the native array gives (before: its bytes went by reference
    unconverted, a wrong answer); a big-endian outputs_into array is refused, naming it."""
    with Client(daemon.ipc) as client:
        expected = client.infer("mlp-light", {"x": X})["scores"]
        region = client.shared_region(1 << 20)
        try:
            x = region.array(X.shape, ">f4")
            x[:] = X
            np.testing.assert_array_equal(client.infer("mlp-light", {"x": x})["scores"], expected)
            scores = region.array(expected.shape, ">f4")
            with pytest.raises(ValueError, match="outputs_into\\['scores'\\] is >f4, big-endian"):
                client.infer("mlp-light", {"x": X}, outputs_into={"scores": scores})
        finally:
            del x, scores
            region.close()


@pytest.mark.parametrize("named", [False, True], ids=["memfd", "posix-name"])
def test_an_async_registration_cancelled_leaves_nothing_registered(own_daemon, named: bool) -> None:
    """An AsyncClient's shared_region cancelled while the daemon registered it (asyncio.wait_for
    timing out, say): the daemon kept the region, counted against the peer's limit, until the
    client closed or shm.idle_s passed. Now the client lets it go once the exchange ends."""
    shm = "enabled = true\ntrust_posix_names = true\nidle_s = 10\nmax_regions_per_peer = 3\n"
    running = own_daemon(f"[shm]\n{shm}")

    async def cancel_then_register() -> None:
        async with AsyncClient(running.ipc) as client:
            for _ in range(4):  # more than the peer may hold
                registering = asyncio.ensure_future(client.shared_region(4096, named=named))
                await asyncio.sleep(0)  # the exchange has begun
                registering.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await registering
            # Each cancelled exchange goes on in the background, and may reach the daemon only now (a
            # memfd's on a thread of its own): the count can read 0 before the last is registered and let
            # go. So wait for the client's undoing to end, well within shm.idle_s: not the sweep's doing.
            end = time.monotonic() + 8
            while client._letting_go and time.monotonic() < end:
                await asyncio.sleep(0.01)
            assert not client._letting_go
            assert (await client.stats())["shm"] == {"regions": 0, "bytes": 0}
            region = await client.shared_region(4096, named=named)  # the peer's limit is whole again
            assert (await client.stats())["shm"]["regions"] == 1
            await client.unregister(region)
            region.close()

    asyncio.run(cancel_then_register())


def test_concurrent_async_registrations_share_one_memfd_connection(own_daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """An AsyncClient registers each memfd on a thread. The first ones at once each found no
    channel to the daemon's memfd socket and made one; the client kept the last, and a region
    registered on another was forgotten by the daemon once that channel was collected (its
    connection closed), while the client still held its handle. (The channel's making slowed
    here, to widen the race the way a busy box does.)"""

    class Slow(api.FdChannel):
        def __init__(self, endpoint: str) -> None:
            time.sleep(0.05)
            super().__init__(endpoint)

    monkeypatch.setattr(api, "FdChannel", Slow)
    running = own_daemon("[shm]\nenabled = true\n")

    async def register_at_once() -> None:
        async with AsyncClient(running.ipc) as client:
            regions = await asyncio.gather(*(client.shared_region(4096) for _ in range(3)))
            gc.collect()  # a connection nobody holds is closed now, not whenever
            await asyncio.sleep(0.2)  # the daemon's intake hears a close at once; give it a moment
            assert (await client.stats())["shm"]["regions"] == 3
            for region in regions:
                await client.unregister(region)
                region.close()

    asyncio.run(register_at_once())


def test_a_routing_id_reused_on_another_socket_has_a_budget_of_its_own(daemon: RunningDaemon) -> None:
    """A ROUTER refuses a duplicate routing id on its own socket only: a client on a class's
    socket that set another client's id on the shared one used up that client's
    shm.max_regions_per_peer (and its pending bytes). A peer is its socket and its id."""
    name = f"edged-shared-id-{os.getpid()}"
    made = shared_memory.SharedMemory(name=name, create=True, size=4096)
    context = zmq.Context()
    try:
        victim, other = context.socket(zmq.DEALER), context.socket(zmq.DEALER)
        for sock, endpoint in ((victim, daemon.ipc), (other, class_endpoint(daemon.ipc, "standard"))):
            sock.setsockopt(zmq.ROUTING_ID, b"camera-7")
            sock.connect(endpoint)
        taken = [register(other, name, 4096, request_id) for request_id in range(3)]
        assert [status for status, _ in taken] == ["OK"] * 3
        status, handle = register(victim, name, 4096)
        assert status == "OK", handle
        for sock, handles in ((other, [handle for _, handle in taken]), (victim, [handle])):
            for registered in handles:
                reply = exchange(sock, encode_request(5, "shm_unregister", region=ShmRef(registered, 0, 0)))
                assert reply.status == "OK", reply.header
    finally:
        context.destroy(linger=0)
        made.close()
        made.unlink()


def test_a_client_that_ends_its_connection_leaves_no_region_mapped() -> None:
    """Regions count toward shm.max_regions, every client's: a client that closes its socket
    without unregistering (one that crashed, or reconnects in a loop) has its regions
    forgotten at once, not after shm.idle_s, on the shared socket and on a class's; another
    client's stay, and serve it."""
    running = start_daemon("[shm]\nenabled = true\ntrust_posix_names = true\nidle_s = 300\nmax_regions = 4\n")
    prefix = f"edged-closing-{os.getpid()}"
    left, kept = (shared_memory.SharedMemory(name=f"{prefix}-{n}", create=True, size=4096) for n in ("left", "kept"))
    context = zmq.Context()
    try:
        stays = connect(context, running.ipc)
        status, handle = register(stays, kept.name, 4096)
        assert status == "OK", handle
        # Six times past max_regions: each would still hold its region had it not been forgotten.
        for attempt in range(6):
            endpoint = running.ipc if attempt % 2 else class_endpoint(running.ipc, "standard")
            leaves = connect(context, endpoint)
            status, error = register(leaves, left.name, 4096)
            assert status == "OK", error
            assert mapped(running, left.name) == 1
            leaves.close(linger=0)
            wait_for(lambda: mapped(running, left.name) == 0, 10, "the closed connection's region to be unmapped")
        assert mapped(running, kept.name) == 1
        assert_serves_from(stays, handle, 9)
    finally:
        context.destroy(linger=0)
        running.close()
        for made in (left, kept):
            made.unlink()
            made.close()


def test_a_connection_that_takes_a_closed_ones_descriptor_keeps_its_region(
    own_daemon, short_tmp: Path, context: zmq.Context, obj: shared_memory.SharedMemory
) -> None:
    """The daemon's descriptor of a closed connection goes to the next one it accepts. Here
    both come and go while realtime's loop runs a long call inline, with a request behind it:
    the new one's registration is read in the same burst as that request, before the loop
    turns to its connections' ends, and keeps its region; the closed one's is forgotten."""
    save_sleeper(short_tmp)
    shm = "[shm]\nenabled = true\ntrust_posix_names = true\nidle_s = 300\n"
    running = own_daemon(f'[server]\nmodel_repository = "{short_tmp}"\n{shm}')
    realtime = class_endpoint(running.ipc, "realtime")
    first, busy = connect(context, realtime), connect(context, realtime)
    assert register(first, obj.name, 4096)[0] == "OK"
    # Priced by its warm-up (n = 0), the sleeper runs inline, and the loop reads nothing for a while.
    busy.send_multipart(encode_request(1, model="sleeper", deadline_ms=60_000, inputs=sleep_for(6000)))
    busy.send_multipart(encode_request(2, model="mlp-light", deadline_ms=60_000, inputs={"x": X[:1]}))
    time.sleep(0.05)
    first.close(linger=0)
    time.sleep(0.05)
    second = connect(context, realtime)
    status, handle = register(second, obj.name, 4096)
    assert status == "OK", handle
    assert [receive(busy).status for _ in range(2)] == ["OK", "OK"]
    assert_serves_from(second, handle, 3)
    assert mapped(running, obj.name) == 1  # the closed connection's is gone


def test_connections_closing_by_thousands_beside_a_busy_loop_stall_no_other_socket(
    own_daemon, short_tmp: Path, context: zmq.Context
) -> None:
    """ZeroMQ tells each connection's end on a pipe its I/O thread writes with a blocking send;
    read by the socket's loop, which reads nothing while it runs a call. Unbounded, 3,000 ends
    told meanwhile (a local client opening and closing connections) stall nothing: realtime,
    whose socket the same I/O thread serves, answers before standard's long call ends (with
    ZeroMQ's bounded monitor pipe, it waited for that call's end)."""
    save_sleeper(short_tmp)
    running = own_daemon(f'[server]\nmodel_repository = "{short_tmp}"\n')
    churn = zmq.Context()
    churn.MAX_SOCKETS = 60_000
    standard = class_endpoint(running.ipc, "standard")
    try:
        realtime, busy = connect(context, class_endpoint(running.ipc, "realtime")), connect(context, standard)
        busy.send_multipart(encode_request(1, model="sleeper", deadline_ms=120_000, inputs=sleep_for(40_000)))
        time.sleep(0.3)  # standard's loop is inside the call, priced by a free warm-up
        for _ in range(3000):
            sock = churn.socket(zmq.DEALER)
            sock.connect(standard)
            sock.close(linger=0)
        time.sleep(0.5)
        realtime.send_multipart(encode_request(2, "health"))
        poller = zmq.Poller()
        for sock in (realtime, busy):
            poller.register(sock, zmq.POLLIN)
        first = dict(poller.poll(120_000))
        assert realtime in first and busy not in first, "realtime waited for standard's call"
        assert receive(realtime).status == "OK"
        assert receive(busy).status == "OK"
    finally:
        churn.destroy(linger=0)


def test_a_client_gone_right_after_registering_leaves_nothing_and_its_routing_id_is_not_cursed(
    own_daemon, short_tmp: Path, context: zmq.Context, obj: shared_memory.SharedMemory
) -> None:
    """A client that sends shm_register and ends its connection while realtime's loop runs a
    long call (a crash): the loop reads its end before its request, and still forgets the
    region (the handle's reply finds no one). The same client back with the same routing id,
    on a new connection, keeps what it registers there when the next connection to take the
    gone one's descriptor closes."""
    save_sleeper(short_tmp)
    shm = "[shm]\nenabled = true\ntrust_posix_names = true\nidle_s = 300\n"
    running = own_daemon(f'[server]\nmodel_repository = "{short_tmp}"\n{shm}')
    realtime = class_endpoint(running.ipc, "realtime")

    def camera() -> zmq.Socket:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, b"camera-1")
        sock.connect(realtime)
        return sock

    busy = connect(context, realtime)
    busy.send_multipart(encode_request(1, model="sleeper", deadline_ms=60_000, inputs=sleep_for(6000)))
    time.sleep(0.05)  # realtime's loop is inside the call
    crashed = camera()
    crashed.send_multipart(encode_request(2, "shm_register", region=ShmRef(obj.name, 0, 4096)))
    crashed.close(linger=2000)  # the request leaves first
    assert receive(busy).status == "OK"
    wait_for(lambda: mapped(running, obj.name) == 0, 10, "the gone client's region to be unmapped")
    other = connect(context, realtime)  # the gone one's descriptor, most likely
    assert exchange(other, encode_request(3, "health")).status == "OK"
    restarted = camera()
    status, handle = register(restarted, obj.name, 4096, 4)
    assert status == "OK", handle
    other.close(linger=0)
    time.sleep(0.3)
    assert_serves_from(restarted, handle, 5)
