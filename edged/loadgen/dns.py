"""A small DNS server on loopback whose A records a test or a bench changes while clients
run, and a resolver for edged.client pointed at it: a Kubernetes headless Service's
records, scaled up and down, without Kubernetes. dnslib (the test extra) serves and asks.

    with Records() as records:
        records.set("edged.test", ["127.0.0.2", "127.0.0.3"])
        client = Client(f"tcp://edged.test:{daemon_port}", resolve=records.resolver())
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from typing import Any

from dnslib import QTYPE, RCODE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSServer

from edged.client.members import Resolve


class Records(BaseResolver):  # type: ignore[misc]
    """Names and their addresses, served over UDP on `address:port` (0: any free port);
    `set` changes them, `failing` makes every answer SERVFAIL (a resolver that has lost
    its upstream)."""

    def __init__(self, port: int = 0, address: str = "127.0.0.1") -> None:
        self.failing = False
        self.asked = 0  # questions answered, for a test that wants to see a lookup happen
        self._names: dict[str, list[str]] = {}
        self._lock = threading.Lock()  # the server's thread reads what the caller's sets
        self._server = DNSServer(self, port=port, address=address, logger=_Quiet())
        self.address, self.port = self._server.server.server_address[:2]  # port 0: the one the system chose

    def set(self, name: str, addresses: Sequence[str]) -> None:
        with self._lock:
            self._names[name.rstrip(".")] = list(addresses)

    def addresses(self, name: str) -> list[str]:
        with self._lock:
            return list(self._names.get(name.rstrip("."), []))

    def remove(self, name: str) -> None:
        with self._lock:
            self._names.pop(name.rstrip("."), None)

    def resolve(self, request: DNSRecord, handler: Any) -> DNSRecord:
        """dnslib's hook: an answer to one question (A only; any other type gets no record)."""
        reply = request.reply()
        name = str(request.q.qname).rstrip(".")
        with self._lock:
            self.asked += 1
            if self.failing:
                reply.header.rcode = RCODE.SERVFAIL
                return reply
            addresses = self._names.get(name)
        if addresses is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif request.q.qtype == QTYPE.A:
            for address in addresses:
                reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(address), ttl=1))
        return reply

    def resolver(self, timeout_s: float = 1.0) -> Resolve:
        """edged.client's `resolve` hook, asking this server instead of the system's."""
        return lambda host, port: lookup(host, self.address, self.port, timeout_s)

    def __enter__(self) -> Records:
        self._server.start_thread()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()
        self._server.server.server_close()


def lookup(host: str, server: str, port: int, timeout_s: float) -> list[str]:
    """The A records of `host` from the DNS server at `server:port`; raises unless it answers NOERROR."""
    answer = DNSRecord.parse(DNSRecord.question(host, "A").send(server, port, timeout=timeout_s))
    if answer.header.rcode != RCODE.NOERROR:
        raise OSError(f"{host}: {RCODE.get(answer.header.rcode)} from {server}:{port}")
    return [str(record.rdata) for record in answer.rr if record.rtype == QTYPE.A]


class _Quiet:
    """dnslib's logger, saying nothing: a line per question would drown a bench's output."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


def shared_port(addresses: Sequence[str]) -> int:
    """A TCP port free on every one of `addresses` (loopback addresses), as each pod of a
    headless Service has its own address and the same port."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((addresses[0], 0))
            port = probe.getsockname()[1]
        try:
            for address in addresses[1:]:
                with socket.socket() as probe:
                    probe.bind((address, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no port free on all of {list(addresses)}")
