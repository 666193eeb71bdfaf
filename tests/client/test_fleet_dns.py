"""A client of a DNS name follows its records: real daemons on 127.0.0.2-4 (one port, as
a headless Service's pods share theirs), each with CURVE on its tcp endpoint, and a
real DNS server on 127.0.0.1 (edged.loadgen.dns) whose records each test changes while
the client runs.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from support import RunningDaemon, random_input, short_dir, wait_for

from edged.cli.commands import main
from edged.client import AsyncClient, Client, ClientKeys, NoReply
from edged.client.keys import write_key_pair
from edged.client.members import named
from edged.loadgen.dns import Records, shared_port
from edged.loadgen.launch import DaemonProcess

NAME = "edged.edged.svc.cluster.local"
PERIOD_S = 2.0
ONE_CLASS = "[server]\ndrain_timeout_ms = 20000\n[classes.standard]\ndeadline_ms = 60000\n"


@dataclass
class Keys:
    config: str  # the [security] table every daemon here is started with
    client: ClientKeys


@pytest.fixture(scope="module")
def keys() -> Iterator[Keys]:
    folder = short_dir()
    _, server_secret = write_key_pair(folder / "server", "server")
    _, client_secret = write_key_pair(folder / "clients", "alice")
    config = f'[security]\nserver_secret_key_file = "{server_secret}"\nallowed_clients_dir = "{folder / "clients"}"\n'
    yield Keys(config, ClientKeys.from_files(folder / "server" / "server.key", client_secret))
    shutil.rmtree(folder, ignore_errors=True)


PORT = shared_port([f"127.0.0.{n}" for n in range(2, 5)])


def serve_at(address: str, keys: Keys) -> RunningDaemon:
    """A daemon on `tcp://ADDRESS:PORT` with CURVE, and a plain ipc socket to wait on."""
    folder = short_dir()
    (folder / "edged.toml").write_text(ONE_CLASS + keys.config)
    endpoints = [f"ipc://{folder}/d.sock", f"tcp://{address}:{PORT}"]
    process = DaemonProcess(endpoints, config=folder / "edged.toml", log_path=folder / "daemon.log")
    running = RunningDaemon(process, endpoints[0], endpoints[1], folder, folder / "daemon.log")
    try:
        process.wait_serving(timeout_s=60)
    except RuntimeError as exc:
        log = running.log()
        running.close()
        raise RuntimeError(f"{exc}; daemon log:\n{log}") from None
    return running


@pytest.fixture(scope="module")
def pair(keys: Keys) -> Iterator[list[RunningDaemon]]:
    """Two daemons every test here leaves running, on 127.0.0.2 and 127.0.0.3."""
    daemons = [serve_at(f"127.0.0.{n}", keys) for n in (2, 3)]
    yield daemons
    for running in daemons:
        running.close()


@pytest.fixture
def third(keys: Keys) -> Iterator[RunningDaemon]:
    """A daemon of this test's own on 127.0.0.4: one it adds, removes or stops."""
    running = serve_at("127.0.0.4", keys)
    yield running
    running.close()


@pytest.fixture
def records() -> Iterator[Records]:
    with Records() as served:
        yield served


def at(n: int) -> str:
    return f"tcp://127.0.0.{n}:{PORT}"


def client_of(records: Records, keys: Keys, period_s: float = PERIOD_S, **options: float) -> Client:
    return Client(
        f"tcp://{NAME}:{PORT}", curve=keys.client, resolve_every_s=period_s, resolve=records.resolver(), **options
    )


def mlp() -> dict[str, np.ndarray]:
    return random_input("mlp-light", 1, 0)


def served_by(client: Client, endpoint: str, within_s: float) -> float:
    """Call until `endpoint` has answered one; the seconds it took. Every call must succeed."""
    start = time.monotonic()
    while time.monotonic() - start < within_s:
        client.infer("mlp-light", mlp())
        counters = client.counters().get(endpoint)
        if counters is not None and counters.ok:
            return time.monotonic() - start
    raise AssertionError(f"{endpoint} served no call within {within_s} s: {client.counters()}")


# --- which endpoints are followed -------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "followed"),
    [
        ("tcp://edged.edged.svc:5555", ("edged.edged.svc", 5555)),
        ("tcp://localhost:5555", ("localhost", 5555)),
        ("tcp://10.0.0.5:5555", None),
        ("tcp://[fd00::5]:5555", None),
        ("ipc:///run/edged/edged.sock", None),
    ],
)
def test_a_tcp_endpoint_with_a_host_name_is_followed_an_address_is_not(
    endpoint: str, followed: tuple[str, int] | None
) -> None:
    assert named(endpoint) == followed


def test_a_name_without_a_port_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="give a port"):
        Client("tcp://edged.edged.svc")


def test_the_system_resolver_is_the_default(daemon: RunningDaemon) -> None:
    """`localhost` through getaddrinfo, as a Service's name would be in a cluster."""
    assert daemon.tcp is not None
    port = daemon.tcp.rpartition(":")[2]
    with Client(f"tcp://localhost:{port}") as client:
        assert f"tcp://127.0.0.1:{port}" in client.endpoints
        assert client.health()["state"] == "serving"


# --- membership ---------------------------------------------------------------


def test_every_address_is_a_member_and_one_added_is_served_within_a_period(
    records: Records, keys: Keys, pair: list[RunningDaemon], third: RunningDaemon
) -> None:
    records.set(NAME, ["127.0.0.2", "127.0.0.3"])
    with client_of(records, keys) as client:
        assert client.endpoints == [at(2), at(3)]
        served_by(client, at(2), 10)
        served_by(client, at(3), 10)
        records.set(NAME, ["127.0.0.2", "127.0.0.3", "127.0.0.4"])
        took = served_by(client, at(4), 5 * PERIOD_S)  # within one period; 5x for a busy box
        assert client.endpoints == [at(2), at(3), at(4)]
    print(f"the added daemon served its first call {took:.2f} s after its record appeared")


def test_a_daemon_removed_and_stopped_loses_no_call(
    records: Records, keys: Keys, pair: list[RunningDaemon], third: RunningDaemon
) -> None:
    """The async client keeps 16 calls in flight while 127.0.0.4 leaves the records with
    copies of calls in flight (held there by a SIGSTOP) and, once the client has stopped
    sending there (a pod's preStop pause), is stopped (its drain answers what it holds).
    Every call is answered OK, once, and the leaver's socket stays open until its copies
    have settled (closed at once, they would be lost, and given up on)."""
    records.set(NAME, ["127.0.0.2", "127.0.0.3", "127.0.0.4"])
    outcomes: list[str] = []

    async def load(client: AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await client.infer("mlp-light", mlp(), timeout_ms=20_000)
                outcomes.append("ok")
            except Exception as exc:
                outcomes.append(repr(exc))

    async def run() -> None:
        name = f"tcp://{NAME}:{PORT}"
        async with AsyncClient(name, curve=keys.client, resolve_every_s=PERIOD_S, resolve=records.resolver()) as client:
            stop = asyncio.Event()
            workers = [asyncio.ensure_future(load(client, stop)) for _ in range(16)]
            end = time.monotonic() + 30
            while time.monotonic() < end and not client.counters().get(at(4), None):
                await asyncio.sleep(0.05)
            while time.monotonic() < end and client.counters()[at(4)].ok < 20:
                await asyncio.sleep(0.05)
            third.pause()  # the copies sent there now stay in flight
            await asyncio.sleep(0.3)
            records.set(NAME, ["127.0.0.2", "127.0.0.3"])
            while time.monotonic() < end and at(4) in client.endpoints:
                await asyncio.sleep(0.01)
            still_open = at(4) in client.counters()  # left the members, not yet its copies' replies
            third.resume()
            await asyncio.to_thread(third.stop)
            while time.monotonic() < end and at(4) in client.counters():
                await asyncio.sleep(0.05)
            members, known = client.endpoints, set(client.counters())
            await asyncio.sleep(0.5)  # calls go on on the two left
            stop.set()
            await asyncio.gather(*workers)
            assert still_open, "the leaver's socket was closed with copies in flight"
            assert members == [at(2), at(3)] and known == {at(2), at(3)}, (members, known)

    asyncio.run(run())
    failed = [o for o in outcomes if o != "ok"]
    assert not failed, f"{len(failed)} of {len(outcomes)} calls failed: {failed[:5]}"


def test_a_dns_failure_keeps_the_known_daemons(records: Records, keys: Keys, pair: list[RunningDaemon]) -> None:
    records.set(NAME, ["127.0.0.2", "127.0.0.3"])
    with client_of(records, keys, period_s=0.2) as client:
        served_by(client, at(2), 10)
        asked = records.asked
        records.failing = True
        wait_for(lambda: records.asked >= asked + 3, 10, "three lookups answered SERVFAIL")
        records.failing = False
        records.remove(NAME)  # the name itself gone: NXDOMAIN
        asked = records.asked
        wait_for(lambda: records.asked >= asked + 3, 10, "three lookups answered NXDOMAIN")
        assert client.endpoints == [at(2), at(3)]
        for _ in range(20):
            client.infer("mlp-light", mlp())


def test_when_every_known_daemon_is_gone_the_name_is_looked_up_at_once(
    records: Records, keys: Keys, pair: list[RunningDaemon], third: RunningDaemon
) -> None:
    """A period of a minute: the call that finds its one daemon gone does not wait for it."""
    records.set(NAME, ["127.0.0.4"])
    with client_of(records, keys, period_s=60) as client:
        served_by(client, at(4), 10)
        records.set(NAME, ["127.0.0.2"])
        third.stop()
        client.infer("mlp-light", mlp(), timeout_ms=10_000)
        assert client.counters()[at(2)].ok == 1


def test_a_name_that_resolves_to_nothing_yet_says_so_and_is_served_once_it_does(
    records: Records, keys: Keys, pair: list[RunningDaemon]
) -> None:
    with client_of(records, keys, timeout_ms=300) as client:
        assert client.endpoints == []
        with pytest.raises(NoReply, match=f"no daemon behind tcp://{NAME}:{PORT} .*NXDOMAIN"):
            client.health()
        records.set(NAME, ["127.0.0.3"])
        client.timeout_ms = 10_000
        assert client.health()["state"] == "serving"
        assert client.endpoints == [at(3)]


def test_explicit_lists_are_not_followed(records: Records, keys: Keys, pair: list[RunningDaemon]) -> None:
    with Client([at(2), at(3)], curve=keys.client, resolve=records.resolver()) as client:
        client.infer("mlp-light", mlp())
        assert client.endpoints == [at(2), at(3)]
    assert records.asked == 0


def test_edged_infer_and_bench_take_a_name(
    daemon: RunningDaemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`edged infer` and `edged bench --endpoint tcp://NAME:PORT`: the bench measures the
    fleet behind the name, per daemon. The standard class: its 200 ms budget, not
    realtime's, is what a busy test box can keep."""
    assert daemon.tcp is not None
    port = daemon.tcp.rpartition(":")[2]
    assert main(["infer", "mlp-light", "--endpoint", f"tcp://localhost:{port}"]) == 0, capsys.readouterr().err
    out = tmp_path / "fleet.json"
    argv = ["bench", "--endpoint", f"tcp://localhost:{port}", "--mix", "standard:mlp-light:100"]
    assert main([*argv, "--duration", "1", "--json", str(out)]) == 0, capsys.readouterr().err
    figures = json.loads(out.read_text())
    assert f"tcp://127.0.0.1:{port}" in figures["daemons"]
    assert figures["streams"][0]["results"] == figures["streams"][0]["calls"]
