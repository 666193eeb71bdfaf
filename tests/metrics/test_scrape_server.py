"""The scrape endpoint's server in-process, on a real port of 127.0.0.1: what a client that
holds its connection open costs the others."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from typing import Any

import pytest

from edged.metrics import server
from edged.metrics.server import MAX_CONNECTIONS, serve_scrapes


def hello(_environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello\n"]


def test_clients_that_dribble_bytes_lose_their_slots_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each sends a byte more often than the idle timeout: by the slot's count they held every
    slot for as long as they kept on, and every scrape was closed unanswered."""
    monkeypatch.setattr(server, "CONNECTION_DEADLINE_S", 0.5)
    scrapes, thread = serve_scrapes("127.0.0.1", 0, hello)
    port = scrapes.server_address[1]
    dribbling = threading.Event()
    dribbling.set()

    def dribble() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
            while dribbling.is_set():
                try:
                    connection.sendall(b"X")
                except OSError:
                    return  # cut
                time.sleep(0.1)

    dribblers = [threading.Thread(target=dribble, daemon=True) for _ in range(MAX_CONNECTIONS)]
    try:
        for dribbler in dribblers:
            dribbler.start()
        time.sleep(2.5)  # five times the deadline: their slots are free again
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
            assert response.read() == b"hello\n"
    finally:
        dribbling.clear()
        for dribbler in dribblers:
            dribbler.join(5)
        scrapes.shutdown()
        scrapes.server_close()
        thread.join(5)
