"""edged.client against the real daemon: the blocking Client and the AsyncClient on
uvloop, their results, and the exception each non-OK status raises."""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import uvloop
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
    wait_for,
)

from edged.client import (
    AsyncClient,
    Client,
    EdgedError,
    InvalidArgument,
    NoReply,
    NotFound,
    Overloaded,
)
from edged.wire.codec import Status, encode_request


def test_client_infer_matches_the_model(endpoint: str, reference: Reference) -> None:
    with Client(endpoint) as client:
        for model in ("mlp-light", "cnn-heavy"):
            inputs = random_input(model, rows=2, seed=3)
            (name, array), *rest = client.infer(model, inputs).items()
            assert rest == []
            assert name == {"mlp-light": "scores", "cnn-heavy": "logits"}[model]
            assert_close(array, reference.run(model, inputs))


def test_client_infer_reply_carries_timing(daemon: RunningDaemon) -> None:
    with Client(daemon.ipc) as client:
        reply = client.infer_reply("mlp-light", random_input("mlp-light", 1, 0), klass="realtime", deadline_ms=1000)
    assert reply.status is Status.OK
    assert set(reply.header["timing_us"]) == {"queue", "compute", "total"}
    assert reply.outputs["scores"].shape == (1, 10)


def test_client_control_ops(daemon: RunningDaemon) -> None:
    with Client(daemon.tcp) as client:
        assert {model["name"] for model in client.models()} == {"mlp-light", "cnn-heavy"}
        assert client.health()["state"] == "serving"
        assert set(client.stats()["classes"]) == {"realtime", "standard", "bulk"}


def test_client_asks_for_a_subset_of_outputs(daemon: RunningDaemon) -> None:
    with Client(daemon.ipc) as client:
        assert list(client.infer("mlp-light", random_input("mlp-light", 1, 0), outputs=["scores"])) == ["scores"]


# (infer arguments, exception class, a phrase of the daemon's message)
ERRORS = {
    "wrong shape": (
        {"model": "mlp-light", "inputs": {"x": np.zeros((1, 63), dtype=np.float32)}},
        InvalidArgument,
        "the model takes [-1, 64]",
    ),
    "wrong dtype": (
        {"model": "mlp-light", "inputs": {"x": np.zeros((1, 64), dtype=np.float16)}},
        InvalidArgument,
        "must be float32",
    ),
    "unknown output": (
        {"model": "mlp-light", "inputs": {"x": np.zeros((1, 64), dtype=np.float32)}, "outputs": ["y"]},
        InvalidArgument,
        "no outputs ['y']",
    ),
    "unknown model": (
        {"model": "resnet", "inputs": {"x": np.zeros((1, 64), dtype=np.float32)}},
        NotFound,
        "unknown model",
    ),
    "unknown class": (
        {"model": "mlp-light", "inputs": {"x": np.zeros((1, 64), dtype=np.float32)}, "klass": "vip"},
        NotFound,
        "unknown class 'vip'",
    ),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_client_raises_the_status_exception_with_the_daemons_message(daemon: RunningDaemon, case: str) -> None:
    arguments, error_class, phrase = ERRORS[case]
    with Client(daemon.ipc) as client:
        with pytest.raises(error_class) as caught:
            client.infer(**arguments)
    error = caught.value
    assert isinstance(error, EdgedError)
    assert error.reply is not None and error.reply.status is error_class.status
    assert phrase in error.message
    assert error.reply.header["error"] in error.message


def test_client_raises_overloaded_when_the_class_is_busy(context: zmq.Context, daemon: RunningDaemon) -> None:
    """Behind 40 queued cnn-heavy requests (about 100 ms of work, past realtime's queue of
    32), a realtime request with the class's 20 ms budget is shed on arrival."""
    watcher, flood = connect(context, daemon.ipc), connect(context, daemon.ipc)

    def received() -> int:
        return exchange(watcher, [header(id="s", op="stats")]).header["classes"]["realtime"]["received"]

    before = received()
    for i in range(40):
        image = random_input("cnn-heavy", 1, i)
        flood.send_multipart(encode_request(i, model="cnn-heavy", klass="realtime", deadline_ms=60_000, inputs=image))
    wait_for(lambda: received() - before >= 40, 10, "the flood arrived")
    with Client(daemon.ipc) as client, pytest.raises(Overloaded) as caught:
        client.infer("cnn-heavy", random_input("cnn-heavy", 1, 0), klass="realtime")
    assert caught.value.reply is not None and caught.value.reply.status is Status.OVERLOADED
    assert caught.value.reply.header["error"] in caught.value.message
    assert "deadline" in caught.value.message or "capacity" in caught.value.message
    assert caught.value.retry_after_ms >= 0.1
    assert {receive(flood).status for _ in range(40)} <= {"OK", "OVERLOADED"}


def test_client_with_no_daemon_raises_no_reply(short_tmp: Path) -> None:
    with Client(f"ipc://{short_tmp}/nobody.sock", timeout_ms=200) as client, pytest.raises(NoReply):
        client.health()


def test_async_client_on_uvloop_keeps_many_requests_in_flight(endpoint: str, reference: Reference) -> None:
    inputs = [random_input("mlp-light", rows=1 + i % 3, seed=i) for i in range(100)]
    images = [random_input("cnn-heavy", rows=1, seed=i) for i in range(8)]

    async def main() -> tuple[list, list, dict, list[BaseException | dict]]:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        async with AsyncClient(endpoint, timeout_ms=20_000) as client:
            light, heavy, health = await asyncio.gather(
                asyncio.gather(*(client.infer("mlp-light", x) for x in inputs)),
                asyncio.gather(*(client.infer("cnn-heavy", x, klass="bulk") for x in images)),
                client.health(),
            )
            # A failure among many in flight is that request's alone.
            mixed = await asyncio.gather(
                client.infer("mlp-light", inputs[0]),
                client.infer("resnet", inputs[0]),
                client.infer("mlp-light", inputs[1]),
                return_exceptions=True,
            )
        return light, heavy, health, mixed

    light, heavy, health, mixed = uvloop.run(main())
    for x, out in zip(inputs, light):
        assert_close(out["scores"], reference.run("mlp-light", x))
    for x, out in zip(images, heavy):
        assert_close(out["logits"], reference.run("cnn-heavy", x))
    assert health["state"] == "serving"
    assert isinstance(mixed[1], NotFound) and "unknown model 'resnet'" in mixed[1].message
    assert_close(mixed[0]["scores"], reference.run("mlp-light", inputs[0]))
    assert_close(mixed[2]["scores"], reference.run("mlp-light", inputs[1]))


def test_async_client_raises_the_status_exception(daemon: RunningDaemon) -> None:
    async def main() -> None:
        async with AsyncClient(daemon.ipc) as client:
            with pytest.raises(InvalidArgument, match="must be float32"):
                await client.infer("mlp-light", {"x": np.zeros((1, 64), dtype=np.int32)})
            with pytest.raises(NotFound, match="unknown class 'vip'"):
                await client.infer("mlp-light", random_input("mlp-light", 1, 0), klass="vip")
            assert {model["name"] for model in await client.models()} == {"mlp-light", "cnn-heavy"}

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


@pytest.mark.parametrize("deadline_ms", [0, -5, 1e-4, float("inf"), float("nan")])
def test_a_deadline_the_daemon_refuses_is_sent_and_refused_not_timed_out(
    daemon: RunningDaemon, deadline_ms: float
) -> None:
    """A deadline of 0 or less, a tiny one, or one not finite goes to the daemon as given, whose
    answer is the call's (before: NoReply after 0 ms for the first three, OverflowError after
    sending for the last two); either way within a second."""
    x = random_input("mlp-light", 1, 0)
    with Client(daemon.ipc) as client:
        started = time.monotonic()
        with pytest.raises((InvalidArgument, Overloaded)) as raised:
            client.infer("mlp-light", x, deadline_ms=deadline_ms)
        assert time.monotonic() - started < 1.0
        assert "deadline" in str(raised.value), raised.value
        assert client.infer("mlp-light", x)["scores"].shape == (1, 10)
        (counters,) = client.counters().values()
        assert counters.late == 0 and counters.timed_out == 0, counters


def test_a_client_that_waits_for_ever_is_answered(daemon: RunningDaemon) -> None:
    with Client(daemon.ipc, timeout_ms=float("inf")) as client:
        assert client.infer("mlp-light", random_input("mlp-light", 1, 0))["scores"].shape == (1, 10)


def test_an_async_client_serves_a_second_event_loop(daemon: RunningDaemon) -> None:
    """asyncio.run twice with one client: its readers follow the new loop (before: the first
    loop's, cancelled at its end, and the second run's call raised NoReply)."""
    client = AsyncClient(daemon.ipc, timeout_ms=2000)
    x = random_input("mlp-light", 1, 0)

    async def one() -> tuple[int, ...]:
        return (await client.infer("mlp-light", x))["scores"].shape

    try:
        assert asyncio.run(one()) == (1, 10)
        assert asyncio.run(one()) == (1, 10)
    finally:
        asyncio.run(client.close())


def test_a_closed_client_says_so_at_once(daemon: RunningDaemon) -> None:
    """Sync and async alike (before: ZMQError ENOTSOCK; the async client waited out its timeout)."""
    x = random_input("mlp-light", 1, 0)
    client = Client(daemon.ipc)
    client.close()
    with pytest.raises(RuntimeError, match="this client is closed"):
        client.infer("mlp-light", x)

    async def after_close() -> None:
        async with AsyncClient(daemon.ipc, timeout_ms=3000) as async_client:
            assert (await async_client.infer("mlp-light", x))["scores"].shape == (1, 10)
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="this client is closed"):
            await async_client.infer("mlp-light", x)
        assert time.monotonic() - started < 1.0

    asyncio.run(after_close())


@pytest.mark.parametrize("klass", ["a/b", ""])
def test_a_class_no_socket_file_can_name_is_refused_by_the_daemon(daemon: RunningDaemon, klass: str) -> None:
    """Before: "a/b" raised pathlib's ValueError from the client's class-socket path."""
    with Client(daemon.ipc) as client, pytest.raises(NotFound, match="unknown class"):
        client.infer("mlp-light", random_input("mlp-light", 1, 0), klass=klass)


def test_a_named_region_whose_registration_got_no_reply_is_gone_once_the_client_closes(short_tmp: Path) -> None:
    """No daemon answers: shared_region raises NoReply and the caller never holds the region,
    so the client unlinks it at close (before: its POSIX object stayed in /dev/shm)."""
    prefix = f"edged-noreply-{os.getpid()}-"
    client = Client(f"ipc://{short_tmp}/nobody.sock", timeout_ms=200)
    with pytest.raises(NoReply):
        client.shared_region(4096, prefix=prefix, named=True)
    assert any(name.startswith(prefix) for name in os.listdir("/dev/shm"))
    client.close()
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(prefix)]


@pytest.fixture
def refuses_unread(short_tmp: Path, context: zmq.Context):  # type: ignore[no-untyped-def]
    """An endpoint whose peer refuses every request as unreadable, its reply's id nil, as the
    protocol lets a daemon do with a header it cannot read."""
    endpoint = f"ipc://{short_tmp}/unread.sock"
    router = context.socket(zmq.ROUTER)
    router.linger = 0
    router.bind(endpoint)
    stop = threading.Event()
    refusal = msgpack.packb({"v": 1, "id": None, "status": "INVALID_ARGUMENT", "error": "header is not valid msgpack"})

    def serve() -> None:
        while not stop.is_set():
            if router.poll(20):
                peer, *_ = router.recv_multipart()
                router.send_multipart([peer, refusal])

    thread = threading.Thread(target=serve)
    thread.start()
    yield endpoint
    stop.set()
    thread.join()
    router.close()


def test_a_refusal_whose_id_the_daemon_could_not_read_reaches_the_one_call_waiting(refuses_unread: str) -> None:
    """A reply whose id is nil matched no call, and the client said 'no reply' once its
    timeout ran out: with one call waiting on that daemon, it is that call's."""
    x = random_input("mlp-light", 1, 0)
    started = time.monotonic()
    with Client(refuses_unread, timeout_ms=20_000) as client:
        with pytest.raises(InvalidArgument, match="not valid msgpack"):
            client.infer("mlp-light", x)

    async def main() -> None:
        async with AsyncClient(refuses_unread, timeout_ms=20_000) as client:
            with pytest.raises(InvalidArgument, match="not valid msgpack"):
                await client.infer("mlp-light", x)

    asyncio.run(main())
    assert time.monotonic() - started < 10  # two timeouts would be 40 s


def test_a_hedged_call_refused_at_both_daemons_leaves_the_next_call_alone(own_daemon) -> None:  # type: ignore[no-untyped-def]
    """A hedged call whose header is over both daemons' limit: the first refusal settles it, the
    second must not reach the next call. With the refusals' ids nil, the second was taken by the
    next call (a review's probe: 37 of 100), and once the fix held them back, a loser's nil reply
    stood for a copy still computing and the call after timed out (CI, 2 of 8 runs here): the
    daemon now reads the id from the start of a header over the limit."""
    config = "[limits]\nmax_header_bytes = 256\n"
    daemons = [own_daemon(config), own_daemon(config)]
    x = random_input("mlp-light", 1, 0)
    with Client([d.ipc for d in daemons], hedge=True, hedge_after_ms=0, timeout_ms=10_000) as client:
        for _ in range(30):
            with pytest.raises(InvalidArgument, match="over the limit of 256"):
                client.infer("mlp-light", x, outputs=["scores"] * 40)  # a header of some 400 bytes
            assert client.infer("mlp-light", x)["scores"].shape == (1, 10)

    async def main() -> None:
        endpoints = [d.ipc for d in daemons]
        async with AsyncClient(endpoints, hedge=True, hedge_after_ms=0, timeout_ms=10_000) as client:
            for _ in range(30):
                with pytest.raises(InvalidArgument, match="over the limit of 256"):
                    await client.infer("mlp-light", x, outputs=["scores"] * 40)
                assert (await client.infer("mlp-light", x))["scores"].shape == (1, 10)

    asyncio.run(main())


@pytest.fixture
def silent(short_tmp: Path, context: zmq.Context):  # type: ignore[no-untyped-def]
    """An endpoint where a ROUTER reads requests and answers none: a call there waits."""
    router = context.socket(zmq.ROUTER)
    router.linger = 0
    endpoint = f"ipc://{short_tmp}/silent.sock"
    router.bind(endpoint)
    yield endpoint
    router.close()


def test_an_input_over_the_daemons_frame_limit_is_refused_before_it_is_sent(own_daemon) -> None:  # type: ignore[no-untyped-def]
    """Past server.max_message_bytes ZeroMQ drops the connection, with no reply: the call,
    and every other call in flight on it, waited out their timeouts. The client refuses it."""
    running = own_daemon("[server]\nmax_message_bytes = 1048576\n")
    big = {"x": np.zeros((5000, 64), np.float32)}  # 1.28 MB
    started = time.monotonic()
    with Client(running.ipc, max_message_bytes=1048576, timeout_ms=20_000) as client:
        with pytest.raises(ValueError, match="input 'x' is 1280000 bytes, over max_message_bytes = 1048576"):
            client.infer("mlp-light", big)
        with pytest.raises(ValueError, match="input 'x' is 2560000 bytes"):  # a list, as the float64 array it becomes
            client.infer("mlp-light", {"x": [[0.0] * 64] * 5000})
        assert client.infer("mlp-light", random_input("mlp-light", 1, 0))["scores"].shape == (1, 10)

    async def main() -> None:
        async with AsyncClient(running.ipc, max_message_bytes=1048576, timeout_ms=20_000) as client:
            x = random_input("mlp-light", 1, 0)
            beside = asyncio.ensure_future(client.infer("mlp-light", x))
            with pytest.raises(ValueError, match="over max_message_bytes"):
                await client.infer("mlp-light", big)
            assert (await beside)["scores"].shape == (1, 10)  # the call in flight beside it is answered

    asyncio.run(main())
    assert time.monotonic() - started < 10  # a dropped connection would have cost a 20 s timeout


def test_a_nan_timeout_is_refused_at_once(silent: str) -> None:
    """Every comparison with NaN is False: a call with timeout_ms NaN waited for ever."""
    x = random_input("mlp-light", 1, 0)
    with Client(silent, timeout_ms=float("nan")) as client, pytest.raises(ValueError, match="timeout_ms is NaN"):
        client.infer("mlp-light", x)
    with Client(silent) as client, pytest.raises(ValueError, match="timeout_ms is NaN"):
        client.infer("mlp-light", x, timeout_ms=float("nan"))


def test_a_client_in_a_call_refuses_a_call_from_another_thread(silent: str) -> None:
    """Two threads on one Client read each other's replies (a review's probe: 117 of 600
    calls got no reply, two got another call's outputs): the second is refused at once."""
    x = random_input("mlp-light", 1, 0)
    outcomes: list[str] = []
    with Client(silent, timeout_ms=2000) as client:

        def waiting() -> None:
            try:
                client.infer("mlp-light", x)
            except NoReply:
                outcomes.append("no reply")

        first = threading.Thread(target=waiting)
        first.start()
        time.sleep(0.3)  # the first call waits on the silent daemon
        with pytest.raises(RuntimeError, match="a Client makes one call at a time"):
            client.infer("mlp-light", x)
        first.join()
    assert outcomes == ["no reply"]


def test_closing_an_async_client_ends_its_waiting_calls_at_once(silent: str) -> None:
    """Closed with a call in flight, the call waited out its whole timeout (for ever with inf)."""

    async def main() -> float:
        client = AsyncClient(silent, timeout_ms=math.inf)
        waiting = asyncio.ensure_future(client.infer("mlp-light", random_input("mlp-light", 1, 0)))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await client.close()
        with pytest.raises(RuntimeError, match="this client is closed"):
            await asyncio.wait_for(waiting, 10)
        return time.monotonic() - started

    assert asyncio.run(main()) < 2  # a fifth of the wait_for above: at once
