"""The receiving end of systemd's notify protocol, for tests of what the daemon tells it."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path


class NotifyListener:
    """The receiving end of $NOTIFY_SOCKET, as systemd holds it; stamps each message."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.05)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append((time.monotonic(), fields))

    def times(self, key: str) -> list[float]:
        return [at for at, fields in self.messages if key in fields]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()
