"""The bytes that requests admitted and not yet answered hold, per peer and in all. Queue
capacities count requests, not bytes, so a request that would take its peer past
`limits.max_pending_bytes_per_peer`, or the daemon past `limits.max_pending_bytes`, is
shed OVERLOADED on arrival. Whoever answers a request gives its bytes back (edged.serve.answers)."""

from __future__ import annotations

import threading

from edged.serve.admission import Backlog, Shed, retry_hint_ms
from edged.wire.codec import DEFAULT_LIMITS, Limits


class PendingBytes:
    """Written by the loops (`take`) and by whoever answers (`give_back`), each under `_lock`."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self._total_cap = limits.max_pending_bytes
        self._peer_cap = limits.max_pending_bytes_per_peer
        self._total = 0
        self._by_peer: dict[bytes, int] = {}
        self._lock = threading.Lock()

    def take(self, peer: bytes, nbytes: int, backlog: Backlog) -> Shed | None:
        """Hold `nbytes` for `peer`: None when held, else the shed, its retry hint the average
        job on `backlog` (the request's lane), as bytes come back when requests are answered."""
        with self._lock:
            held = self._by_peer.get(peer, 0)
            if held + nbytes > self._peer_cap:
                why = (
                    f"this client's pending requests hold {held} bytes, and this one {nbytes}: "
                    f"more than limits.max_pending_bytes_per_peer = {self._peer_cap}"
                )
            elif self._total + nbytes > self._total_cap:
                why = (
                    f"the pending requests hold {self._total} bytes, and this one {nbytes}: "
                    f"more than limits.max_pending_bytes = {self._total_cap}"
                )
            else:
                if nbytes:  # nothing held (inputs in shared memory, 0 rows): no entry, which give_back would keep
                    self._by_peer[peer] = held + nbytes
                    self._total += nbytes
                return None
        return Shed("bytes", why, retry_hint_ms(backlog.average_job_ns))

    def give_back(self, peer: bytes, nbytes: int) -> None:
        if not nbytes:  # nothing was held, and `take` made no entry for it
            return
        with self._lock:
            left = self._by_peer.pop(peer) - nbytes
            if left:
                self._by_peer[peer] = left
            self._total -= nbytes

    @property
    def total(self) -> int:
        """The bytes held now, by every peer."""
        return self._total

    @property
    def peers(self) -> int:
        """How many peers hold bytes now."""
        return len(self._by_peer)
