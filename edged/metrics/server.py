"""The scrape endpoint's HTTP server: prometheus-client's WSGI app, served with a bound on
what clients may hold. Its own server (not prometheus-client's start_http_server, a thread
per connection for as long as the client keeps it) because any local user can reach the
port: idle connections by the thousand used up the daemon's descriptors, and its steering
thread failed, stopping the daemon.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from edged.threads import NamedThread

MAX_CONNECTIONS = 8  # served at once; one more is closed at once (a scraper asks once per interval)
IDLE_TIMEOUT_S = 5.0  # a connection silent this long mid-request is closed
# A connection's whole life: one that sends a byte every few seconds, never silent for
# IDLE_TIMEOUT_S, would otherwise hold its slot, and eight such every slot, for good.
CONNECTION_DEADLINE_S = 10.0


class _Handler(WSGIRequestHandler):
    timeout = IDLE_TIMEOUT_S  # StreamRequestHandler sets it on the connection

    def handle(self) -> None:
        cut = threading.Timer(CONNECTION_DEADLINE_S, self._cut)
        cut.start()
        try:
            super().handle()
        finally:
            cut.cancel()

    def _cut(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged: one a few seconds would fill the daemon's log."""


class ScrapeServer(ThreadingMixIn, WSGIServer):
    """A WSGI server of at most MAX_CONNECTIONS threads, each connection bounded by
    IDLE_TIMEOUT_S between reads and CONNECTION_DEADLINE_S in all."""

    daemon_threads = True
    request_queue_size = 64  # socketserver's 5 made a burst of connects wait a second each 6th

    def __init__(self, host: str, port: int, app: Any) -> None:
        self.address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__((host, port), _Handler)
        self.set_app(app)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away costs its connection, and no traceback in the log."""


def serve_scrapes(host: str, port: int, app: Any) -> tuple[ScrapeServer, threading.Thread]:
    """Listen on host:port (OSError where it cannot) and serve `app` on a thread of its own."""
    server = ScrapeServer(host, port, app)
    thread = NamedThread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server, thread
