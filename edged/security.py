"""CURVE on tcp endpoints: key files, the ZAP check of client keys, and key generation.

Keys are kept in pyzmq's certificate files (`zmq.auth.create_certificates`): NAME.key
holds a public key, NAME.key_secret the public and the secret key, both as Z85 text.
A server serves the clients whose NAME.key is in its allowed-clients folder.

CURVE applies to tcp only: an ipc socket is guarded by its file mode and group, and
a handshake there would cost local clients time for nothing.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from edged.config import SecurityConfig
from edged.config.settings import ConfigError

LOOPBACK_NAMES = ("localhost", "lo")
ZAP_DOMAIN = "edged"


@dataclass(frozen=True, slots=True)
class ServerKeys:
    public_key: bytes
    secret_key: bytes
    allowed_clients_dir: Path


@dataclass(frozen=True, slots=True)
class ClientKeys:
    """What a client needs to reach a CURVE endpoint: the server's public key and its own pair."""

    server_public_key: bytes
    public_key: bytes
    secret_key: bytes

    @classmethod
    def from_files(cls, server_key_file: str | os.PathLike[str], client_key_file: str | os.PathLike[str]) -> ClientKeys:
        """From the server's NAME.key (or .key_secret) and this client's NAME.key_secret."""
        server_public, _ = zmq.auth.load_certificate(server_key_file)
        public, secret = zmq.auth.load_certificate(client_key_file)
        if secret is None:
            raise ValueError(f"{client_key_file} holds no secret key: give the client's .key_secret file")
        return cls(server_public, public, secret)

    def apply(self, sock: zmq.Socket) -> None:
        """Make `sock` a CURVE client; call before connect."""
        sock.curve_serverkey = self.server_public_key
        sock.curve_publickey = self.public_key
        sock.curve_secretkey = self.secret_key


def is_tcp(endpoint: str) -> bool:
    return endpoint.startswith("tcp://")


def is_loopback(endpoint: str) -> bool:
    """Whether a tcp endpoint binds to loopback only; anything unclear (a host name, *, an interface) is not."""
    host = endpoint[len("tcp://") :].rpartition(":")[0].strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_keys(endpoints: tuple[str, ...], security: SecurityConfig) -> ServerKeys | None:
    """The keys the tcp endpoints use, or None to serve them plain; refuses plain tcp beyond loopback."""
    if not security.curve:
        exposed = [e for e in endpoints if is_tcp(e) and not is_loopback(e)]
        if exposed and not security.allow_plain_tcp:
            raise ConfigError(
                f"{exposed[0]} would serve plain, unauthenticated tcp beyond this machine: set "
                "security.server_secret_key_file and security.allowed_clients_dir to use CURVE "
                "(keys from `edged keygen`), bind tcp to 127.0.0.1, or set security.allow_plain_tcp = true"
            )
        return None
    assert security.server_secret_key_file is not None and security.allowed_clients_dir is not None
    key_file = security.server_secret_key_file
    try:
        _, secret = zmq.auth.load_certificate(key_file)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"security.server_secret_key_file = {str(key_file)!r} cannot be read: {exc}") from None
    if secret is None:
        raise ConfigError(
            f"security.server_secret_key_file = {str(key_file)!r} holds no secret key: give the .key_secret file"
        )
    if key_file.stat().st_mode & 0o004:
        raise ConfigError(
            f"security.server_secret_key_file = {str(key_file)!r} is readable by every user: chmod o-r {key_file}"
        )
    try:
        allowed = zmq.auth.load_certificates(security.allowed_clients_dir)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"security.allowed_clients_dir: {exc}") from None
    if not allowed:
        raise ConfigError(
            f"security.allowed_clients_dir = {str(security.allowed_clients_dir)!r} holds no client keys (*.key): "
            "copy in the NAME.key file of each client that `edged keygen` made"
        )
    return ServerKeys(zmq.curve_public(secret), secret, security.allowed_clients_dir)


def start_authenticator(context: zmq.Context, allowed_clients_dir: Path) -> ThreadAuthenticator:
    """Answer ZAP requests in `context`: only the allowed client keys complete a CURVE handshake.

    It sees handshakes only, once per connection: the requests that follow never pass here.
    """
    authenticator = ThreadAuthenticator(context)
    authenticator.configure_curve(domain=ZAP_DOMAIN, location=allowed_clients_dir)
    authenticator.start()
    return authenticator


def make_curve_server(sock: zmq.Socket, keys: ServerKeys) -> None:
    sock.curve_server = True
    sock.curve_publickey = keys.public_key
    sock.curve_secretkey = keys.secret_key
    sock.zap_domain = ZAP_DOMAIN.encode()
    # Without it libzmq admits every client key whenever no ZAP handler is bound.
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)


def write_key_pair(folder: Path, name: str) -> tuple[Path, Path]:
    """Write NAME.key (public, 0644) and NAME.key_secret (0600) into `folder`; never overwrite."""
    public, secret = folder / f"{name}.key", folder / f"{name}.key_secret"
    for path in (public, secret):
        if path.exists():
            raise FileExistsError(f"{path} exists: choose another --name or remove it first")
    folder.mkdir(parents=True, exist_ok=True)
    # The secret key is never readable by others, not even for the moment before a chmod.
    old_umask = os.umask(0o077)
    try:
        zmq.auth.create_certificates(folder, name)
    finally:
        os.umask(old_umask)
    public.chmod(0o644)
    return public, secret
