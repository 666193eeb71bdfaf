"""The daemons' sockets as the fleet changes: one DEALER per daemon (and per class where
a daemon's endpoint has a class's own), opened as daemons join and closed once a
leaver's copies have settled (edged.client.fleet's slots), and the one socket setup.
Run by the sockets' owner, as edged.client.sync and edged.client.aio say who that is."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import zmq

from edged.client.fleet import Fleet
from edged.client.keys import ClientKeys
from edged.client.members import Membership, Resolve, named
from edged.wire.codec import Reply, Status, encode_request
from edged.wire.endpoints import class_endpoint, is_tcp, tcp_class_ports

# A class-port health request unanswered this long is asked again: its reply was lost (the daemon
# stopped or restarted while answering it), and the client would go the shared way for good.
ASK_AGAIN_S = 1.0
# Unanswered asks kept per daemon: a daemon that never answers costs a client no more than these.
ASKS_KEPT = 4


class Sockets:
    """A client's daemons and their sockets; `_watch` and `_unwatch` are the client's own."""

    _fleet: Fleet
    _members: Membership | None  # a client of a DNS name: who resolves it
    _context: Any
    _curve: ClientKeys | None
    _ids: Iterator[int]
    # By class: the port of its own socket beside a tcp endpoint, as given; None: each daemon's, from its health.
    _class_ports: dict[str, int] | None
    _learned: dict[int, dict[str, int]]  # per daemon (slot), when not given: its class ports, from its health
    _asking: dict[int, tuple[int, float]]  # by request id: the daemon (slot) asked for its class ports, and when
    _sockets: list[Any]  # per daemon (fleet slot): its shared endpoint's DEALER; None once the slot is free
    _daemon_of: dict[Any, int]  # every socket open: the daemon it reaches, by slot
    # Per daemon and class: a DEALER on that class's own socket; None where it has none.
    _class_sockets: dict[tuple[int, str], Any]
    closed: bool  # by close(): a call then raises at once

    def _start(
        self,
        endpoints: str | Sequence[str],
        hedge: bool,
        hedge_after_ms: float | None,
        resolve_every_s: float,
        resolve: Resolve | None,
    ) -> None:
        """The fleet and a socket per daemon. One tcp endpoint whose host is a name (alone,
        or a list of one) is followed (edged.client.members): every address behind it, as
        they change. Several endpoints are taken as given."""
        listed = endpoint_list(endpoints)
        name = named(listed[0]) if len(listed) == 1 else None
        self._members = None if name is None else Membership(*name, resolve_every_s, resolve)
        if self._members is None:
            self._fleet = Fleet(listed, hedge, hedge_after_ms)
        else:
            self._fleet = Fleet(self._members.members, hedge, hedge_after_ms, followed=True)
            self._fleet.on_no_daemon = self._members.refresh
        self._sockets = []
        self._class_sockets = {}
        self._daemon_of = {}
        self._learned, self._asking = {}, {}
        self.closed = False
        for index in range(len(self._fleet.endpoints)):
            self._open(index)

    def _watch(self, sock: Any, index: int) -> None:
        """Read `sock`'s replies as daemon `index`'s from now on."""
        raise NotImplementedError

    def _unwatch(self, sock: Any) -> None:
        raise NotImplementedError

    def _try_send(self, sock: Any, frames: list[Any]) -> bool:
        """Send without waiting; False where the socket takes nothing now."""
        raise NotImplementedError

    def _connect(self, index: int, endpoint: str) -> Any:
        """A DEALER on daemon `index`'s `endpoint` (a class's own), read like the others."""
        sock = dealer(self._context, endpoint, self._curve, immediate=True)
        self._watch(sock, index)
        return sock

    def _open(self, index: int) -> None:
        """The shared endpoint's socket of daemon `index`, new in the fleet or in a freed slot,
        and those of the classes given ports; CURVE keys apply to every daemon of a fleet alike."""
        sock = dealer(self._context, self._fleet.endpoints[index], self._curve, self._fleet.several)
        if index == len(self._sockets):
            self._sockets.append(sock)
        else:
            self._sockets[index] = sock
        self._watch(sock, index)
        # A freed slot's daemon is another: what was learned or asked of the last one is not its.
        self._learned.pop(index, None)
        self._asking = {request_id: ask for request_id, ask in self._asking.items() if ask[0] != index}
        # A class given a tcp port connects now, so that its first call finds its socket ready
        # (a connection still in its handshake takes nothing: the call would go the shared way).
        for klass in self._class_ports or ():
            self._sockets_for(index, klass)

    def _follow(self) -> None:
        """Take in the name's latest answer: sockets for the daemons that joined, and the
        sockets of those that left closed once no copy there is in flight. Run by the
        sockets' owner, between turns of a call."""
        if self._members is None:
            return
        answer = self._members.latest()
        if answer is not None:
            for index in self._fleet.follow(answer):
                self._open(index)
        for index in self._fleet.settled_leavers():
            own = [key for key in self._class_sockets if key[0] == index]
            for sock in [self._sockets[index], *(self._class_sockets.pop(key) for key in own)]:
                if sock is not None:
                    self._unwatch(sock)
                    sock.close(linger=0)
            self._sockets[index] = None

    def _close_sockets(self) -> None:
        """Every socket closed, and the name no longer followed."""
        self.closed = True
        if self._members is not None:
            self._members.close()
        for sock in self._daemon_of:
            sock.close(linger=0)

    def _sockets_for(self, index: int, klass: str | None) -> list[Any]:
        """Where a copy for daemon `index` may go, in order: its class's own socket, when
        its endpoint has one (edged.wire.endpoints.class_endpoint: beside a tcp endpoint,
        on the class's port, `_ports`), then the shared one.
        The class's socket takes nothing while it is not connected (ZMQ_IMMEDIATE)."""
        if klass is None:
            return [self._sockets[index]]
        key = (index, klass)
        if key not in self._class_sockets:
            ports = self._ports(index)
            if ports is None:  # nothing kept: the next call looks again
                return [self._sockets[index]]
            endpoint = class_endpoint(self._fleet.endpoints[index], klass, ports.get(klass))
            self._class_sockets[key] = None if endpoint is None else self._connect(index, endpoint)
        own = self._class_sockets[key]
        return [self._sockets[index]] if own is None else [own, self._sockets[index]]

    def _ports(self, index: int) -> dict[str, int] | None:
        """The class ports of daemon `index`: those given, else those its health listed. None
        while not known beside a tcp endpoint: its health is asked, and calls go the shared way."""
        if self._class_ports is not None:
            return self._class_ports
        learned = self._learned.get(index)
        if learned is None and is_tcp(self._fleet.endpoints[index]):
            self._ask_ports(index)
            return None
        return learned or {}

    def _ask_ports(self, index: int) -> None:
        """Ask daemon `index`'s health for its class ports, unless asked within ASK_AGAIN_S."""
        now = time.monotonic()
        asked = sorted((at, request_id) for request_id, (slot, at) in self._asking.items() if slot == index)
        if asked and now - asked[-1][0] < ASK_AGAIN_S:
            return
        # The earlier asks stay, so that a reply to one, late, still teaches and counts as no call's.
        for _, request_id in asked[: max(len(asked) + 1 - ASKS_KEPT, 0)]:
            del self._asking[request_id]
        request_id = next(self._ids)
        if self._try_send(self._sockets[index], encode_request(request_id, "health")):
            self._asking[request_id] = (index, now)

    def _learn(self, reply: Reply) -> bool:
        """Whether `reply` answers a health request of `_ports`: if so, its class ports are
        taken in, and each class's next call there gets its own socket."""
        ask = self._asking.pop(reply.id, None)  # type: ignore[arg-type]  # another id's type: not ours
        if ask is None:
            return False
        index = ask[0]
        ingress = reply.header.get("ingress") if reply.status is Status.OK else None
        self._learned[index] = tcp_class_ports(ingress) if isinstance(ingress, dict) else {}
        return True

    def _why_none(self) -> str:
        """What a client of a name says when it knows no daemon at all."""
        if self._members is None or self._fleet.members():
            return ""
        return f": no daemon behind {self._members.name} ({self._members.error or 'none resolved yet'})"


def endpoint_list(endpoints: str | Sequence[str]) -> list[str]:
    """One endpoint or several, as a list."""
    return [endpoints] if isinstance(endpoints, str) else list(endpoints)


def dealer(context: zmq.Context, endpoint: str, curve: ClientKeys | None, immediate: bool) -> Any:
    """The one socket setup of both clients. With several daemons, ZMQ_IMMEDIATE: a
    copy is never queued for a daemon that is not connected (one killed, say); the
    send fails at once and the call picks another."""
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    if endpoint.startswith("tcp://["):
        sock.ipv6 = True
    if immediate:
        sock.setsockopt(zmq.IMMEDIATE, 1)
    if curve is not None and is_tcp(endpoint):
        curve.apply(sock)
    sock.connect(endpoint)
    return sock
