"""Security: CURVE on tcp (keys from `edged keygen`, only allowed clients served), the
refusal of plain tcp beyond loopback, the ipc socket's mode and group, and the keys'
configuration errors. Real daemons, real sockets, real handshakes."""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import os
import shutil
import stat
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq
import zmq.auth
from support import (
    RunningDaemon,
    bounded,
    established,
    free_tcp_port,
    header,
    nothing_more,
    random_input,
    run_edged,
    short_dir,
    start_daemon,
    wait_for,
)

from edged.client import AsyncClient, Client
from edged.client.keys import ClientKeys
from edged.config import Config, ConfigError, SecurityConfig, parse_config
from edged.loadgen.launch import DaemonProcess
from edged.serve.transport.curve import server_keys
from edged.wire.endpoints import is_loopback

# Long enough for a CURVE handshake and a reply on loopback, many times over.
NO_REPLY_MS = 300


@dataclass
class Keys:
    folder: Path
    server_public: Path
    server_secret: Path
    allowed_dir: Path
    allowed_secret: Path
    stranger_secret: Path  # a valid key pair the daemon was never told about

    def client(self, secret: Path) -> ClientKeys:
        return ClientKeys.from_files(self.server_public, secret)


def keygen(folder: Path, name: str) -> tuple[Path, Path]:
    result = run_edged("keygen", str(folder), "--name", name)
    assert result.returncode == 0, result.stderr
    return folder / f"{name}.key", folder / f"{name}.key_secret"


@pytest.fixture(scope="module")
def keys() -> Iterator[Keys]:
    folder = short_dir()
    server_public, server_secret = keygen(folder / "server", "server")
    _, allowed_secret = keygen(folder / "clients", "alice")
    _, stranger_secret = keygen(folder / "strangers", "mallory")
    yield Keys(folder, server_public, server_secret, folder / "clients", allowed_secret, stranger_secret)
    shutil.rmtree(folder, ignore_errors=True)


def security_toml(keys: Keys) -> str:
    return f'[security]\nserver_secret_key_file = "{keys.server_secret}"\nallowed_clients_dir = "{keys.allowed_dir}"\n'


@pytest.fixture(scope="module")
def curve_daemon(keys: Keys) -> Iterator[RunningDaemon]:
    running = start_daemon(security_toml(keys), tcp=True)
    yield running
    running.close()


# --- keygen ------------------------------------------------------------------


def test_keygen_writes_a_pair_whose_secret_only_the_owner_reads(keys: Keys) -> None:
    public, secret = keys.server_public, keys.server_secret
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    public_key, no_secret = zmq.auth.load_certificate(public)
    same_public, secret_key = zmq.auth.load_certificate(secret)
    assert no_secret is None and public_key == same_public
    assert secret_key is not None and zmq.curve_public(secret_key) == public_key


def test_keygen_never_overwrites_a_key(keys: Keys) -> None:
    before = keys.server_secret.read_bytes()
    result = run_edged("keygen", str(keys.server_secret.parent), "--name", "server")
    assert result.returncode == 1
    assert "exists" in result.stderr
    assert keys.server_secret.read_bytes() == before


# --- CURVE -------------------------------------------------------------------


def test_an_allowed_client_is_served_over_curve(curve_daemon: RunningDaemon, keys: Keys) -> None:
    assert curve_daemon.tcp is not None
    with Client(curve_daemon.tcp, curve=keys.client(keys.allowed_secret)) as client:
        assert client.health()["state"] == "serving"
        scores = client.infer("mlp-light", random_input("mlp-light", 2, seed=1))["scores"]
    assert scores.shape == (2, 10)


def test_the_async_client_speaks_curve_too(curve_daemon: RunningDaemon, keys: Keys) -> None:
    assert curve_daemon.tcp is not None

    async def health() -> dict[str, object]:
        async with AsyncClient(curve_daemon.tcp, curve=keys.client(keys.allowed_secret)) as client:
            return await client.health()

    assert asyncio.run(health())["state"] == "serving"


@pytest.mark.parametrize("who", ["unknown key", "plain client"])
def test_a_client_without_an_allowed_key_gets_no_service(curve_daemon: RunningDaemon, keys: Keys, who: str) -> None:
    assert curve_daemon.tcp is not None
    context = zmq.Context()
    try:
        intruder = bounded(context.socket(zmq.DEALER), NO_REPLY_MS)
        intruder.linger = 0
        if who == "unknown key":
            keys.client(keys.stranger_secret).apply(intruder)
        intruder.connect(curve_daemon.tcp)
        # A handshake refused before this send leaves the socket no peer, so the send
        # cannot be queued: a request never sent is not served either.
        with contextlib.suppress(zmq.Again):
            intruder.send_multipart([header(id=1, op="health")])
        assert nothing_more(intruder, NO_REPLY_MS), f"a {who} was answered"
    finally:
        context.destroy(linger=0)
    # The refused handshake cost the daemon nothing: the allowed client is still served.
    assert curve_daemon.alive()
    with Client(curve_daemon.tcp, curve=keys.client(keys.allowed_secret)) as client:
        assert client.health()["state"] == "serving"


def test_ipc_stays_plain_beside_curve(curve_daemon: RunningDaemon) -> None:
    with Client(curve_daemon.ipc) as client:
        assert client.health()["state"] == "serving"


def test_client_commands_take_curve_keys(curve_daemon: RunningDaemon, keys: Keys) -> None:
    assert curve_daemon.tcp is not None
    result = run_edged(
        "health",
        "--json",
        "--endpoint",
        curve_daemon.tcp,
        "--server-key",
        str(keys.server_public),
        "--client-key",
        str(keys.allowed_secret),
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["state"] == "serving"


# --- plain tcp beyond loopback -----------------------------------------------


def test_a_secret_key_of_the_wrong_length_is_refused_naming_the_key(keys: Keys) -> None:
    """Two characters inserted in the z85 text: a traceback at start (ValueError from
    zmq.curve_public), where a configuration error names the key and the fix."""
    folder = short_dir()
    secret = folder / "server.key_secret"
    secret.write_text(keys.server_secret.read_text().replace('secret-key = "', 'secret-key = "ab'))
    secret.chmod(0o600)
    config = folder / "edged.toml"
    config.write_text(security_toml(keys).replace(str(keys.server_secret), str(secret)))
    try:
        result = run_edged("serve", "--config", str(config), "--endpoint", f"tcp://127.0.0.1:{free_tcp_port()}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "security.server_secret_key_file" in result.stderr and "edged keygen" in result.stderr, result.stderr


def test_plain_tcp_beyond_loopback_is_refused_at_start() -> None:
    result = run_edged("serve", "--endpoint", f"tcp://0.0.0.0:{free_tcp_port()}")
    assert result.returncode == 2
    assert "security.allow_plain_tcp" in result.stderr
    assert "security.server_secret_key_file" in result.stderr


def test_allow_plain_tcp_serves_beyond_loopback() -> None:
    folder = short_dir()
    port = free_tcp_port()
    config = folder / "edged.toml"
    config.write_text("[security]\nallow_plain_tcp = true\n")
    try:
        with DaemonProcess([f"ipc://{folder}/d.sock", f"tcp://0.0.0.0:{port}"], config=config) as daemon:
            daemon.wait_serving(timeout_s=60)
            with Client(f"tcp://127.0.0.1:{port}") as client:
                assert client.health()["state"] == "serving"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize(
    ("endpoint", "loopback"),
    [
        ("tcp://127.0.0.1:5555", True),
        ("tcp://127.0.0.2:5555", True),
        ("tcp://[::1]:5555", True),
        ("tcp://localhost:5555", True),
        ("tcp://lo:5555", True),
        ("tcp://0.0.0.0:5555", False),
        ("tcp://*:5555", False),
        ("tcp://192.168.1.10:5555", False),
        ("tcp://[::]:5555", False),
        ("tcp://eth0:5555", False),
        ("tcp://edge.example.com:5555", False),
    ],
)
def test_only_loopback_addresses_count_as_local(endpoint: str, loopback: bool) -> None:
    assert is_loopback(endpoint) is loopback


# --- ipc socket mode and group -------------------------------------------------


def test_the_ipc_socket_is_owner_and_group_only_by_default(daemon: RunningDaemon) -> None:
    mode = Path(daemon.ipc.removeprefix("ipc://")).stat().st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o660


def test_ipc_mode_and_group_are_applied(own_daemon: Callable[..., RunningDaemon]) -> None:
    group = grp.getgrgid(os.getgid()).gr_name
    running = own_daemon(f'[server]\nipc_mode = 0o600\nipc_group = "{group}"\n')
    status = Path(running.ipc.removeprefix("ipc://")).stat()
    assert stat.S_IMODE(status.st_mode) == 0o600
    assert status.st_gid == os.getgid()
    with Client(running.ipc) as client:
        assert client.health()["state"] == "serving"


# --- configuration -------------------------------------------------------------


def parse(text: str, base_dir: Path = Path("/srv")) -> Config:
    return parse_config(tomllib.loads(text), base_dir=base_dir)


def test_security_and_ipc_keys_are_read(keys: Keys) -> None:
    group = grp.getgrgid(os.getgid())
    config = parse(
        security_toml(keys) + f'allow_plain_tcp = true\n[server]\nipc_mode = 0o640\nipc_group = "{group.gr_name}"\n'
    )
    assert config.security == SecurityConfig(keys.server_secret, keys.allowed_dir, True)
    assert (config.ipc_mode, config.ipc_group) == (0o640, group.gr_gid)
    assert parse("").ipc_mode == 0o660 and parse("").ipc_group is None
    assert parse("").security == SecurityConfig()


def test_key_paths_are_taken_from_the_config_files_folder(keys: Keys) -> None:
    text = '[security]\nserver_secret_key_file = "server/server.key_secret"\nallowed_clients_dir = "clients"\n'
    config = parse(text, base_dir=keys.folder)
    assert config.security.server_secret_key_file == keys.server_secret
    assert config.security.allowed_clients_dir == keys.allowed_dir


INVALID = {
    "secret key not a string": ("[security]\nserver_secret_key_file = 5", "security.server_secret_key_file"),
    "secret key missing": (
        '[security]\nserver_secret_key_file = "/nonexistent/s.key_secret"\nallowed_clients_dir = "/"',
        "security.server_secret_key_file",
    ),
    "clients dir missing": (
        '[security]\nserver_secret_key_file = "/etc/hostname"\nallowed_clients_dir = "/nonexistent"',
        "security.allowed_clients_dir",
    ),
    "secret key without clients": ('[security]\nserver_secret_key_file = "/etc/hostname"', "allowed_clients_dir"),
    "clients without secret key": ('[security]\nallowed_clients_dir = "/"', "server_secret_key_file"),
    "allow plain a string": ('[security]\nallow_plain_tcp = "yes"', "security.allow_plain_tcp"),
    "security not a table": ("security = 1", "security"),
    "ipc mode decimal": ("[server]\nipc_mode = 660", "server.ipc_mode"),
    "ipc mode a string": ('[server]\nipc_mode = "0660"', "server.ipc_mode"),
    "ipc mode too large": ("[server]\nipc_mode = 0o1777", "server.ipc_mode"),
    "ipc mode bool": ("[server]\nipc_mode = true", "server.ipc_mode"),
    "ipc mode owner cannot write": ("[server]\nipc_mode = 0o060", "server.ipc_mode = 0o60 leaves the daemon's own"),
    "ipc group unknown": ('[server]\nipc_group = "no-such-group-edged"', "server.ipc_group"),
    "ipc group negative": ("[server]\nipc_group = -1", "server.ipc_group"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_security_setting_is_refused_naming_its_key(case: str) -> None:
    text, key = INVALID[case]
    with pytest.raises(ConfigError) as caught:
        parse(text)
    assert key in str(caught.value)


def test_unknown_security_key_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"^unknown key security\.allow_plain:"):
        parse("[security]\nallow_plain = true")


def test_unusable_key_files_are_refused_naming_the_key(keys: Keys) -> None:
    def refusal(secret: Path, allowed: Path) -> str:
        with pytest.raises(ConfigError) as caught:
            server_keys(("tcp://127.0.0.1:1",), SecurityConfig(secret, allowed))
        return str(caught.value)

    assert "no secret key" in refusal(keys.server_public, keys.allowed_dir)
    empty = keys.folder / "empty"
    empty.mkdir(exist_ok=True)
    assert "security.allowed_clients_dir" in refusal(keys.server_secret, empty)
    # A client key cut short loads, then matches no client: its handshakes failed without a word.
    cut = keys.folder / "cut"
    cut.mkdir(exist_ok=True)
    for key in keys.allowed_dir.glob("*.key"):
        shutil.copy(key, cut)
    for name, text in {"short": "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf", "tilde": "~" * 40, "hash": "#" * 40}.items():
        (cut / f"{name}.key").write_text(f'metadata\ncurve\n    public-key = "{text}"\n')
        assert f"{name}.key holds no valid public key" in refusal(keys.server_secret, cut)
        (cut / f"{name}.key").unlink()
    readable = keys.folder / "readable.key_secret"
    shutil.copy(keys.server_secret, readable)
    readable.chmod(0o644)
    assert "readable by every user" in refusal(readable, keys.allowed_dir)


def test_a_daemon_with_a_public_key_for_its_secret_exits_with_the_key_named(keys: Keys) -> None:
    folder = short_dir()
    config = folder / "edged.toml"
    text = f'[security]\nserver_secret_key_file = "{keys.server_public}"\nallowed_clients_dir = "{keys.allowed_dir}"\n'
    config.write_text(text)
    try:
        result = run_edged("serve", "--config", str(config), "--endpoint", f"tcp://127.0.0.1:{free_tcp_port()}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert result.returncode == 2
    assert "security.server_secret_key_file" in result.stderr


def test_a_class_tcp_socket_takes_the_same_curve_keys(keys: Keys) -> None:
    """A class's tcp_port socket serves the allowed key, through the client given the
    port, and nothing to a plain client: CURVE guards it as it guards the shared one."""
    port = free_tcp_port()
    text = security_toml(keys) + f"[classes.realtime]\ntcp_port = {port}\n[classes.standard]\n[classes.bulk]\n"
    running = start_daemon(text, tcp=True)
    context = zmq.Context()
    try:
        assert running.tcp is not None
        own = f"tcp://127.0.0.1:{port}"
        allowed = keys.client(keys.allowed_secret)
        with Client(running.tcp, curve=allowed, class_ports={"realtime": port}) as client:
            assert own in client.health()["ingress"]["realtime"]
            # Held, not refused and retried: the client's handshake there carried its key.
            wait_for(lambda: established(port), 5.0, "the client's connection to realtime's tcp socket")
            for _ in range(10):
                assert client.infer("mlp-light", random_input("mlp-light", 1, seed=2), klass="realtime")
                assert established(port)
                time.sleep(0.02)
        wait_for(lambda: not established(port), 5.0, "the client's connection to close")
        # Not given the port: it reads it from health over CURVE, and connects there with its key.
        with Client(running.tcp, curve=allowed) as learner:
            for _ in range(3):
                assert learner.infer("mlp-light", random_input("mlp-light", 1, seed=2), klass="realtime")
            wait_for(lambda: established(port), 5.0, "the learning client's connection to realtime's tcp socket")
            for _ in range(5):
                assert learner.infer("mlp-light", random_input("mlp-light", 1, seed=2), klass="realtime")
                assert established(port)
                time.sleep(0.02)
        keyed = bounded(context.socket(zmq.DEALER))
        keyed.linger = 0
        allowed.apply(keyed)
        keyed.connect(own)
        keyed.send_multipart([header(id=1, op="health")])
        assert keyed.poll(10_000), "the allowed key got no answer on realtime's tcp socket"
        plain = bounded(context.socket(zmq.DEALER), NO_REPLY_MS)
        plain.linger = 0
        plain.connect(own)
        with contextlib.suppress(zmq.Again):
            plain.send_multipart([header(id=1, op="health")])
        assert nothing_more(plain, NO_REPLY_MS), "a plain client was answered on realtime's tcp socket"
    finally:
        context.destroy(linger=0)
        running.close()
