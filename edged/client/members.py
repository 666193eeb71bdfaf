"""A fleet named by DNS: `tcp://edged.NAMESPACE.svc:5555` stands for every address the
name resolves to (a Kubernetes headless Service has one record per ready daemon), and
follows them as they change, as gRPC's `dns:///` targets and Envoy's STRICT_DNS
clusters do.

One thread resolves the name: every `period_s`, and at once when a call finds no daemon
to take it (`refresh`). It never touches a socket: it hands each new answer to the
client through a queue, and the client's owner (the calling thread, or the event loop)
takes it in between turns of its calls (edged.client.fleet.Fleet.follow). A lookup that
fails or finds no address changes nothing: the last good answer stands, and a line is
logged. Daemons really gone show as silence or refusals, which calls already route round.
"""

from __future__ import annotations

import ipaddress
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Sequence

DEFAULT_PERIOD_S = 5.0  # as Envoy's STRICT_DNS clusters re-resolve by default
REFRESH_GAP_S = 0.1  # at least this between two lookups, however often calls ask for one

# resolve(host, port) -> the addresses behind the name (IPv4 or IPv6, as text)
Resolve = Callable[[str, int], Sequence[str]]

log = logging.getLogger("edged.client")


def named(endpoint: str) -> tuple[str, int] | None:
    """(host, port) of a tcp endpoint whose host is a name to resolve; None for an ipc
    endpoint, an address, or `*`."""
    if not endpoint.startswith("tcp://"):
        return None
    address = endpoint[len("tcp://") :]
    host, colon, port = address.rpartition(":")
    if not colon:
        host, port = address, ""
    if not host or host == "*" or host.startswith("["):
        return None
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not port.isdigit():
            raise ValueError(f"{endpoint}: give a port, as in tcp://{host}:5555") from None
        return host, int(port)
    return None


def system_resolve(host: str, port: int) -> list[str]:
    """The system resolver's addresses for `host` (what /etc/resolv.conf and nsswitch say)."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(sockaddr[0]) for *_, sockaddr in found})


def endpoint_of(address: str, port: int) -> str:
    return f"tcp://[{address}]:{port}" if ":" in address else f"tcp://{address}:{port}"


class Membership:
    """The addresses behind one name, kept fresh by a thread of its own."""

    def __init__(self, host: str, port: int, period_s: float = DEFAULT_PERIOD_S, resolve: Resolve | None = None):
        if period_s <= 0:
            raise ValueError(f"resolve_every_s must be above 0 (got {period_s})")
        self.name = f"tcp://{host}:{port}"
        self._host, self._port = host, port
        self._period_s = period_s
        self._resolve = resolve or system_resolve
        self._answers: queue.SimpleQueue[list[str]] = queue.SimpleQueue()  # to the owner, each a change
        self._now = threading.Event()  # a call found no daemon: look now
        self._stop = threading.Event()
        self.error: str | None = None  # why the last lookup gave nothing, for the caller's error
        self.members = self._lookup([])  # the first answer, before any call
        self._thread = threading.Thread(target=self._run, name=f"edged-dns {host}", daemon=True)
        self._thread.start()

    def latest(self) -> list[str] | None:
        """The newest answer not yet taken, if any (the owner's side)."""
        answer = None
        while not self._answers.empty():
            answer = self._answers.get_nowait()
        return answer

    def refresh(self) -> None:
        """Look the name up now rather than at the next period (any thread)."""
        self._now.set()

    def close(self) -> None:
        """Stop following; a lookup under way is not waited for past a second (the system
        resolver cannot be interrupted, and the thread holds nothing of the client's)."""
        self._stop.set()
        self._now.set()
        self._thread.join(timeout=1.0)

    def _run(self) -> None:
        known = self.members
        while not self._stop.is_set():
            self._now.wait(self._period_s)
            self._now.clear()
            if self._stop.is_set():
                return
            answer = self._lookup(known)
            if answer != known:
                log.info("%s: now %s (was %s)", self.name, ", ".join(answer), ", ".join(known) or "none")
                known = answer
                self._answers.put(answer)
            self._stop.wait(REFRESH_GAP_S)

    def _lookup(self, known: list[str]) -> list[str]:
        """The endpoints behind the name now, or `known` if the lookup fails or is empty."""
        started = time.perf_counter_ns()
        try:
            addresses = sorted(set(self._resolve(self._host, self._port)))
        except Exception as exc:  # whatever a resolver raises, this thread goes on and the members stay
            self.error = f"{self._host} did not resolve: {exc!r}"
        else:
            if addresses:
                self.error = None
                return [endpoint_of(address, self._port) for address in addresses]
            self.error = f"{self._host} resolved to no address"
        elapsed_ms = (time.perf_counter_ns() - started) / 1e6
        log.warning("%s (%.0f ms); keeping %s", self.error, elapsed_ms, ", ".join(known) or "no daemon")
        return known
