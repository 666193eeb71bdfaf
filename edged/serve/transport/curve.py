"""CURVE on the daemon's tcp endpoints: the key set, checked at start-up, and the ZAP
handler that admits only the allowed client keys. Not on ipc: its file mode and group
guard it, and a handshake would cost local clients time for nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
import zmq.utils.z85
from zmq.auth.thread import ThreadAuthenticator

from edged.config import ConfigError, SecurityConfig
from edged.wire.endpoints import is_loopback, is_tcp

ZAP_DOMAIN = "edged"


@dataclass(frozen=True, slots=True)
class ServerKeys:
    public_key: bytes
    secret_key: bytes
    allowed_clients_dir: Path


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
    _check_client_keys(security.allowed_clients_dir)
    if not allowed:
        raise ConfigError(
            f"security.allowed_clients_dir = {str(security.allowed_clients_dir)!r} holds no client keys (*.key): "
            "copy in the NAME.key file of each client that `edged keygen` made"
        )
    try:
        public = zmq.curve_public(secret)
    except ValueError as exc:  # z85 text of the wrong length: a file edited by hand, or cut short
        raise ConfigError(
            f"security.server_secret_key_file = {str(key_file)!r} holds no valid secret key ({exc}): "
            "make the keys again with `edged keygen`"
        ) from None
    return ServerKeys(public, secret, security.allowed_clients_dir)


def _check_client_keys(folder: Path) -> None:
    """Each client key a valid CURVE public key: ZeroMQ loads a cut-short one too, which then
    matches no client, and that client's handshakes fail with no word on either side."""
    for path in sorted(folder.glob("*.key")):
        public, _ = zmq.auth.load_certificate(path)
        try:
            valid = len(zmq.utils.z85.decode(public)) == 32
        except Exception:  # not z85: ValueError, KeyError or struct.error, by what is wrong with it
            valid = False
        if not valid:
            raise ConfigError(
                f"security.allowed_clients_dir: {path} holds no valid public key (40 characters of z85): "
                "copy in the client's NAME.key from `edged keygen` again"
            )


def start_authenticator(context: zmq.Context, allowed_clients_dir: Path) -> ThreadAuthenticator:
    """Answer ZAP requests: only allowed client keys complete a handshake (once per connection)."""
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
