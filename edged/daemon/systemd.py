"""systemd's notify protocol, spoken directly (no libsystemd): a datagram of `KEY=value`
lines to $NOTIFY_SOCKET ('@' names an abstract socket). Without that variable every call
is a no-op, so the daemon runs the same under systemd, in a terminal and in tests."""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self) -> None:
        address = os.environ.get("NOTIFY_SOCKET", "")
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self._socket: socket.socket | None = None
        if self._address:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        watchdog_usec = os.environ.get("WATCHDOG_USEC", "")
        watchdog_pid = os.environ.get("WATCHDOG_PID", "")
        ours = not watchdog_pid or watchdog_pid == str(os.getpid())
        # systemd restarts the service when pings stop for WATCHDOG_USEC; ping at half of it.
        self.watchdog_interval_ns = int(watchdog_usec) * 1000 // 2 if watchdog_usec.isdigit() and ours else 0

    def notify(self, **fields: str) -> None:
        """Send e.g. notify(READY="1", STATUS="serving"); lost messages are not retried."""
        if self._socket is None:
            return
        message = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        try:
            self._socket.sendto(message, self._address)
        except OSError:
            pass  # systemd gone or the socket full: the service goes on, as sd_notify does

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
