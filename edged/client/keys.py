"""CURVE keys: a client's key set and key generation.

The daemon's side (its key set, the ZAP check of client keys) is edged.serve.transport.curve;
this module reads no configuration, so the client imports none. Keys are kept in
pyzmq's certificate files (`zmq.auth.create_certificates`): NAME.key holds a public
key, NAME.key_secret the public and the secret key, both as Z85 text. A server
serves the clients whose NAME.key is in its allowed-clients folder.

CURVE applies to tcp only: an ipc socket is guarded by its file mode and group, and
a handshake there would cost local clients time for nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth


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
