"""What both clients share: every operation of the protocol, written once (`Api`), over
the daemons' sockets (edged.client.sockets). `Client` (edged.client.sync) and
`AsyncClient` (edged.client.aio) differ only in how they wait for a call's replies
(`_call`) and watch a socket (`_watch`)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from edged.client.call import Call
from edged.client.errors import NoReply, raise_for_status
from edged.client.fleet import EndpointCounters
from edged.client.members import DEFAULT_PERIOD_S
from edged.client.shm import CudaIpcRegion, FdChannel, NamedRegion, SharedRegion, little_endian
from edged.client.sockets import Sockets
from edged.wire.codec import Buffer, Reply, ShmRef, Status, encode_request
from edged.wire.messages import FRAME_OVERHEAD
from edged.wire.shm import ShmTensor

DEFAULT_TIMEOUT_MS = 5000.0
_MAKING_CHANNEL = threading.Lock()  # held while a client makes its memfd channel (Api._register_fd)
CLOSED = "this client is closed: its sockets are gone; make a new one"
DEFAULT_RESOLVE_EVERY_S = DEFAULT_PERIOD_S


class Api(Sockets):
    """Every operation of the protocol, written once for both clients; each call is a
    `edged.client.fleet.Call`, which the two classes drive over their sockets (`_call`)."""

    timeout_ms: float
    max_message_bytes: int
    _ids: Iterator[int]
    _regions: list[SharedRegion]  # registered with the daemon (edged.client.shm)
    _fd_channel: FdChannel | None  # to the daemon's memfd socket, once a memfd was registered
    # Made by shared_region and not yet answered: the caller never holds one whose call raised (NoReply,
    # cancelled), so close() closes it.
    _made: list[SharedRegion]

    def _call(self, op: str, fields: dict[str, Any], timeout_ms: float, parse: Callable[[Reply], Any]) -> Any:
        raise NotImplementedError

    def _call_fd(self, region: SharedRegion, owned: bool, parse: Callable[[Reply], Any]) -> Any:
        """`_register_fd`, waited for as the client waits."""
        raise NotImplementedError

    def _register_fd(self, region: SharedRegion, owned: bool) -> Reply:
        """shm_register `region`'s memfd on the daemon's memfd socket (blocking: the
        daemon's intake thread answers at once); an `owned` region is closed on failure."""
        # An AsyncClient registers on threads: two making a channel at once would each register on
        # their own, and the daemon forgets the regions of the one dropped once it is collected.
        with _MAKING_CHANNEL:
            if self._fd_channel is None:
                self._fd_channel = FdChannel(self._fleet.endpoints[0])
            channel = self._fd_channel
        try:
            return channel.register(region, self.timeout_ms)
        except BaseException:
            if owned:
                self._made.remove(region)
                region.close()
            raise

    def _request(self, op: str, parse: Callable[[Reply], Any], timeout_ms: float | None = None, **fields: Any) -> Any:
        timeout_ms = self.timeout_ms if timeout_ms is None else timeout_ms
        return self._call(op, fields, timeout_ms, lambda r: parse(raise_for_status(r)))

    def _new_call(self, op: str, fields: dict[str, Any], timeout_ms: float) -> Call:
        if self.closed:
            raise RuntimeError(CLOSED)
        if math.isnan(timeout_ms):  # every comparison with it is False: the call would wait for ever
            raise ValueError("timeout_ms is NaN: give milliseconds (inf waits for ever, 0 or less not at all)")
        for name, value in (fields.get("inputs") or {}).items():
            if isinstance(value, ShmTensor):
                continue
            nbytes = (value if isinstance(value, np.ndarray) else np.asarray(value)).nbytes
            if nbytes + FRAME_OVERHEAD > self.max_message_bytes:
                raise ValueError(
                    f"input {name!r} is {nbytes} bytes, over max_message_bytes = {self.max_message_bytes} (the "
                    f"daemon's server.max_message_bytes, 64 MiB by default, less {FRAME_OVERHEAD} bytes for CURVE): "
                    "ZeroMQ would drop the connection, and with it every call in flight; put it in shared memory "
                    "(shared_region), or give the client the daemon's limit"
                )
        model = fields.get("model") if op == "infer" else None
        return Call(self._fleet, model, fields.get("deadline_ms"), timeout_ms, now_ms())

    def _frames(self, op: str, fields: dict[str, Any], deadline_ms: float | None) -> tuple[int, list[Buffer]]:
        """A copy of the request under a new id (ids are unique per client, so a late reply
        to a copy that lost is recognised), with what is left of its deadline."""
        request_id = next(self._ids)
        if deadline_ms is not None:
            fields = {**fields, "deadline_ms": deadline_ms}
        return request_id, encode_request(request_id, op, **fields)

    def _outcome(self, call: Call, parse: Callable[[Reply], Any]) -> Any:
        if call.reply is None and self.closed:  # closed while it waited (AsyncClient.close)
            raise RuntimeError(CLOSED)
        if call.reply is None:
            refused = call.refusal
            before = f"; {refused.status.value} from a daemon before: {refused.error}" if refused is not None else ""
            raise NoReply(f"no reply within {call.timeout_ms:.0f} ms{self._why_none()}{before}")
        return parse(call.reply)

    @property
    def endpoints(self) -> list[str]:
        """The daemons calls go to now: those given, or those a name resolves to."""
        return self._fleet.members()

    def counters(self) -> dict[str, EndpointCounters]:
        """Per daemon: copies sent, OK, shed, unavailable, failed, timed out, hedged,
        hedges won and late replies dropped (see edged.client.fleet.EndpointCounters).
        A daemon that left a name's records is here until its last copy settles."""
        fleet = self._fleet
        return {e: replace(c) for e, c, s in zip(fleet.endpoints, fleet.counters, fleet.state) if s != "free"}

    def infer(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        *,
        klass: str | None = None,
        deadline_ms: float | None = None,
        outputs: Sequence[str] | None = None,
        timeout_ms: float | None = None,
        outputs_into: dict[str, np.ndarray] | None = None,
    ) -> Any:
        """Run `model`; returns {output name: array}. Raises an EdgedError unless OK.

        `klass` picks the priority class, `deadline_ms` the daemon-side budget,
        `outputs` a subset of outputs, `timeout_ms` how long this client waits (left out with a
        deadline: past the deadline, docs/clients.md). An input
        that lies in a registered SharedRegion goes by reference; `outputs_into` names
        arrays in one for the daemon to write outputs into (edged.client.shm).
        """
        return self._infer(lambda r: r.outputs, model, inputs, klass, deadline_ms, outputs, timeout_ms, outputs_into)

    def infer_reply(self, model: str, inputs: dict[str, np.ndarray], **options: Any) -> Any:
        """Like infer, with the same options, but returns the whole Reply (timing_us is in its header)."""
        return self._infer(lambda r: r, model, inputs, **options)

    def _infer(
        self,
        parse: Callable[[Reply], Any],
        model: str,
        inputs: dict[str, np.ndarray],
        klass: str | None = None,
        deadline_ms: float | None = None,
        outputs: Sequence[str] | None = None,
        timeout_ms: float | None = None,
        outputs_into: dict[str, np.ndarray] | None = None,
    ) -> Any:
        if timeout_ms is None and deadline_ms is not None and math.isfinite(deadline_ms):
            # Past its deadline the daemon answers by itself; wait a little beyond it. (One not finite it
            # refuses at once.)
            timeout_ms = max(deadline_ms * 2, deadline_ms + 1000)
        fields: dict[str, Any] = {}
        if self._regions:
            inputs = {name: self._by_reference(array) for name, array in inputs.items()}
        if outputs_into:
            fields["outputs_shm"] = {name: self._slot(name, array) for name, array in outputs_into.items()}
            parse = self._reading_regions(parse)
        return self._request(
            "infer",
            parse,
            timeout_ms,
            model=model,
            inputs=inputs,
            klass=klass,
            deadline_ms=deadline_ms,
            outputs=outputs,
            **fields,
        )

    # --- shared memory (edged.client.shm) ---------------------------------------

    def shared_region(self, size: int, prefix: str = "edged-", group: str | None = None, named: bool = False) -> Any:
        """A new region of `size` bytes, registered with the daemon (its [shm] on, an ipc
        endpoint): a sealed memfd handed over on the daemon's memfd socket (SharedRegion);
        with `named`, a POSIX object registered by name, for a daemon that trusts its
        clients so far (NamedRegion, which `group` is for: a memfd needs none)."""
        if group is not None and not named:
            raise ValueError("group applies to a named region (named=True); a memfd is handed to the daemon itself")
        return self.register(NamedRegion(size, prefix, group) if named else SharedRegion(size, prefix), owned=True)

    def register(self, region: SharedRegion, owned: bool = False) -> Any:
        """Have the daemon map `region` (shm_register): a memfd on the memfd socket, a
        NamedRegion by its name; returns it, its handle set. `owned`: the region was made
        for this call, and is closed if the daemon refuses it."""
        if isinstance(region, NamedRegion):
            return self._register(region, {"region": ShmRef(region.name, 0, region.size)}, owned)
        return self._register(region, None, owned)

    def register_cuda_ipc(self, ipc_handle: bytes, nbytes: int) -> Any:
        """Have a GPU daemon open `nbytes` of device memory by its CUDA IPC handle (64 bytes,
        from cudaIpcGetMemHandle); returns a CudaIpcRegion, whose `tensor` names inputs in it."""
        fields = {"region": ShmRef("cuda-ipc", 0, nbytes), "cuda_ipc": ipc_handle}
        return self._register(CudaIpcRegion(ipc_handle, nbytes), fields)

    def _register(
        self, region: SharedRegion | CudaIpcRegion, fields: dict[str, Any] | None, owned: bool = False
    ) -> Any:
        """shm_register `region` with `fields` (None: a memfd, on the memfd socket); a
        SharedRegion registered is one whose arrays go by reference (a CudaIpcRegion's
        inputs are named with its `tensor`)."""
        if self._fleet.several:
            raise ValueError("shared memory needs a client of one endpoint: a region is registered with one daemon")

        def registered(reply: Reply) -> SharedRegion | CudaIpcRegion:
            if owned and isinstance(region, SharedRegion):
                self._made.remove(region)
                if reply.status is not Status.OK:
                    region.close()  # made for this call alone, and refused: nothing is left behind
            region.handle = raise_for_status(reply).header["region"]
            if isinstance(region, SharedRegion):
                self._regions.append(region)
            return region

        if owned and isinstance(region, SharedRegion):
            self._made.append(region)
        if fields is None and isinstance(region, SharedRegion):
            return self._call_fd(region, owned, registered)
        return self._call("shm_register", fields or {}, self.timeout_ms, registered)

    def _close_shared(self) -> None:
        """At close: the memfd socket, and the regions made for calls that never returned them."""
        if self._fd_channel is not None:
            self._fd_channel.close()
        for region in self._made:
            region.close()
        self._made.clear()

    def unregister(self, region: SharedRegion | CudaIpcRegion) -> Any:
        """Have the daemon forget `region` (shm_unregister); inputs in it go as frames again."""
        handle, region.handle = region.handle, None
        if region in self._regions:
            self._regions.remove(region)
        return self._request("shm_unregister", lambda r: None, region=ShmRef(handle or "", 0, 0))

    def _by_reference(self, array: Any) -> Any:
        for region in self._regions:
            if isinstance(array, np.ndarray) and (tensor := region.tensor(array)) is not None:
                return tensor
        return array

    def _slot(self, name: str, array: np.ndarray) -> ShmRef:
        if not little_endian(array.dtype):
            raise ValueError(
                f"outputs_into[{name!r}] is {array.dtype.str}, big-endian; the daemon writes little-endian bytes: "
                "give an array of the output's dtype in little-endian order"
            )
        for region in self._regions:
            if (ref := region.ref(array)) is not None:
                return ref
        raise ValueError(f"outputs_into[{name!r}] is not a C-ordered view of a registered SharedRegion")

    def _reading_regions(self, parse: Callable[[Reply], Any]) -> Callable[[Reply], Any]:
        """`parse`, with the outputs the daemon wrote into this client's regions among the reply's."""
        by_handle = {region.handle: region for region in self._regions}

        def read(reply: Reply) -> Any:
            for spec in reply.header.get("outputs", []):
                if "shm" in spec:
                    region = by_handle[spec["shm"]["region"]]
                    reply.outputs[spec["name"]] = region.view(spec["shm"], spec["dtype"], spec["shape"])
            return parse(reply)

        return read

    def models(self, memory: bool = False) -> Any:
        """The served models: [{name, backend, precision, inputs, outputs}]; with `memory`,
        each with its `weights` as the daemon holds them."""
        fields = {"memory": True} if memory else {}
        return self._request("models", lambda r: r.header["models"], **fields)

    def health(self) -> Any:
        """{state: starting | serving | draining, uptime_s}."""
        return self._request("health", lambda r: {k: v for k, v in r.header.items() if k not in ("v", "id", "status")})

    def stats(self) -> Any:
        """Per-class counters and latency percentiles (see docs/protocol.md)."""
        return self._request("stats", lambda r: {k: v for k, v in r.header.items() if k not in ("v", "id", "status")})


def now_ms() -> float:
    """The clock every call's deadlines and round trips are read on."""
    return time.monotonic_ns() / 1e6
