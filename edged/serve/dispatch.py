"""From frames to a decision: decode, validate, answer the control ops, and admit
or shed each inference request. Runs on the socket loop's thread and never blocks:
everything that is answered here (errors, sheds, control ops) is answered at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from edged.backends import DeviceMemory
from edged.backends.gpu_memory import LaneReservation
from edged.backends.host_memory import rss_bytes
from edged.backends.shared import MemoryPlan
from edged.config import Config
from edged.daemon.lifecycle import Lifecycle
from edged.models.repository import ModelEntry
from edged.serve.admission import Shed
from edged.serve.lanes.lane import Lane
from edged.serve.pending import PendingBytes
from edged.serve.regions import Regions, Slot
from edged.serve.transport import Transport
from edged.wire import fast
from edged.wire.codec import Buffer, ProtocolError, Request, ShmRef, Status, decode_request, encode_reply

log = logging.getLogger("edged.dispatch")


class Dispatcher:
    """Turns each request into one reply or one admitted job. Its models, lanes and
    reservations are written only by `serve` and `invalid` only by `handle`, both on
    the socket loop; the life cycle it reads is the daemon's."""

    def __init__(
        self,
        config: Config,
        transport: Transport,
        lifecycle: Lifecycle,
    ) -> None:
        self.config = config
        self.models: dict[str, ModelEntry] = {}
        self.lanes: dict[str, Lane] = {}
        self.invalid = 0  # requests refused here: malformed, unknown model or class, not serving
        self.reservations: dict[str, LaneReservation] = {}  # by class; empty on a backend that reserves nothing
        self.memory = MemoryPlan()
        self.regions = Regions(config.shm)  # the clients' shared memory: here, and edged.serve.fd_intake's thread
        self.fixed_rows = False  # the backend's buffers hold max_batch rows (see edged.backends.fixed_rows)
        self.failed: dict[str, str] = {}  # models not served, and why (server.on_model_failure = "skip")
        # The bytes admitted requests hold: daemon-wide, kept across reloads (its limits are start-up's).
        self.pending = PendingBytes(config.limits)
        self._lifecycle = lifecycle
        self._reply = transport.reply
        self._transport = transport
        self._class_names = {c.name for c in config.classes}
        self._started_ns = time.monotonic_ns()
        self._spin_until_ns = 0  # see spin_deadline_ns
        self._handled_ns: dict[str, int] = {}  # by class with a spin: when the loop was done with its latest request

    def serve(
        self,
        config: Config,
        models: list[ModelEntry],
        lanes: dict[str, Lane],
        reservations: dict[str, LaneReservation],
        memory: MemoryPlan,
        fixed_rows: bool,
        failed: dict[str, str],
        open_ipc: Callable[[bytes, int], DeviceMemory] | None = None,
    ) -> None:
        """Take warm lanes, at start-up or in place of the previous ones; the daemon opens inference.
        `open_ipc`: the backend's, where it reads clients' device memory (edged.backends.OpeningIpc)."""
        self.config = config
        self._class_names = {c.name for c in config.classes}
        self.models = {model.name: model for model in models}
        self.lanes = lanes
        self.reservations = reservations
        self.memory = memory
        self.fixed_rows = fixed_rows
        self.failed = failed
        self.regions.open_device, self.regions.backend = open_ipc, config.backend

    def handle(self, route: Any, frames: list[Buffer], received_ns: int, ingress: str | None) -> None:
        """Answer or admit one request; every call leads to exactly one reply. `ingress`:
        the class whose own socket it came on (None: a shared one)."""
        request_id = None
        try:
            limits = self.config.limits
            request = fast.decode_request(frames, limits) or decode_request(frames, limits)
            request_id = request.id
            if request.op == "infer":
                self._infer(route, request, received_ns, ingress)
            elif request.op == "health":
                self._reply(route, encode_reply(request.id, Status.OK, **self.health()))
            elif request.op == "models":
                models = [self._model_wire(model, request.memory) for model in self.models.values()]
                failed = [{"name": name, "error": error} for name, error in self.failed.items()]
                self._reply(route, encode_reply(request.id, Status.OK, models=models, failed=failed))
            elif request.region is not None:
                self._region_op(route, request, request.region)
            else:
                self._reply(route, encode_reply(request.id, Status.OK, **self.stats()))
        except ProtocolError as exc:
            self.invalid += 1
            self._reply(route, encode_reply(exc.request_id, exc.status, error=exc.message))
        except Exception as exc:  # a bug here must cost one request, never the daemon
            log.exception("failed to handle a request")
            message = f"the daemon failed on this request: {exc}"
            self._reply(route, encode_reply(request_id, Status.INTERNAL, error=message))

    def _region_op(self, route: Any, request: Request, region: ShmRef) -> None:
        """shm_register (of a POSIX object or of device memory) or shm_unregister, for the
        peer that sent it (edged.serve.regions)."""
        local, request_id = self._transport.local(route), request.id
        if request.op == "shm_unregister":
            self.regions.unregister(region.region, local, request_id)
            self._reply(route, encode_reply(request_id, Status.OK, region=region.region))
            return
        peer = self._transport.peer(route)
        if request.ipc_handle is not None:
            handle = self.regions.register_ipc(peer, request.ipc_handle, region.nbytes, local, request_id)
        else:
            handle = self.regions.register(peer, region, local, request_id)
        self._reply(route, encode_reply(request_id, Status.OK, region=handle, bytes=region.nbytes))

    def spin_deadline_ns(self) -> int:
        """Until when the loop should keep polling rather than sleep: spin_us after the
        loop is done with a request of a class with one, when that request came within
        spin_us of the loop being done with the class's previous one, and only while every
        lane is idle, since the spin takes a core the workers may need (0: sleep now)."""
        if not self._spin_until_ns or any(lane.backlog.depth for lane in self.lanes.values()):
            return 0
        return self._spin_until_ns

    def health(self) -> dict[str, Any]:
        lanes = {name: lane.health for name, lane in self.lanes.items()}
        return {
            "state": self._lifecycle.reported,
            # What a readiness probe trusts: inference open, and no lane waiting for a worker.
            "ready": self._lifecycle.open and bool(lanes) and all(health == "ok" for health in lanes.values()),
            "uptime_s": round((time.monotonic_ns() - self._started_ns) / 1e9, 3),
            "lanes": lanes,
            "failed_models": dict(self.failed),
            "ingress": self._transport.ingress,
        }

    def status_line(self) -> str:
        """One line for systemd's status: the state, then each class's counts and p99."""
        parts = []
        for name, lane in self.lanes.items():
            # A snapshot: the workers count outcomes meanwhile, under the stats' lock.
            figures = lane.stats.snapshot(lane.backlog.depth)
            shed, p99 = sum(figures["shed"].values()), figures["latency_us"]["total"]["p99"]
            parts.append(f"{name} {figures['completed']} ok, {shed} shed, p99 {p99} us")
        return f"{self._lifecycle.reported}: " + "; ".join(parts)

    def stats(self) -> dict[str, Any]:
        """The stats op's figures (socket loop only: another thread asks the loop, see edged.daemon.daemon)."""
        return {
            "state": self._lifecycle.reported,
            "invalid": self.invalid,
            "unroutable": self._transport.unroutable,
            "memory": {
                "rss_bytes": rss_bytes(),
                "weights": {model: weights.to_wire() for model, weights in self.memory.weights.items()},
            },
            "shm": self.regions.figures(),
            "classes": {name: self._class_stats(name, lane) for name, lane in self.lanes.items()},
        }

    def _class_stats(self, name: str, lane: Lane) -> dict[str, Any]:
        figures = lane.stats.snapshot(lane.backlog.depth)
        figures["prices"] = lane.service.prices()
        figures["memory_bytes"] = self.memory.lane_bytes.get(name)
        reservation = self.reservations.get(name)
        if reservation is not None:
            figures["gpu"] = reservation.to_wire()
        return figures

    def _model_wire(self, model: ModelEntry, memory: bool) -> dict[str, Any]:
        wire = model.to_wire()
        # Asked for: the entries stay the five keys docs/protocol.md promises to a plain request.
        weights = self.memory.weights.get(model.name) if memory else None
        if weights is not None:
            wire["weights"] = weights.to_wire()
        if self.reservations and model.pipeline is None:
            wire["gpu_memory"] = {
                klass: {
                    **next(m.to_wire() for m in reservation.models if m.model == model.name),
                    "lane_measured_bytes": reservation.measured_bytes,
                }
                for klass, reservation in self.reservations.items()
            }
        return wire

    def _infer(self, route: Any, request: Request, received_ns: int, ingress: str | None) -> None:
        class_name = request.klass or ingress or self.config.default_class
        if ingress is not None and class_name != ingress:
            raise ProtocolError(
                Status.INVALID_ARGUMENT,
                f"this socket takes class {ingress!r} alone; send class {class_name!r} to the shared endpoint",
                request.id,
            )
        if class_name not in self._class_names:
            raise ProtocolError(
                Status.NOT_FOUND,
                f"unknown class {class_name!r}: this daemon has {sorted(self._class_names)}",
                request.id,
            )
        if not self._lifecycle.open:
            raise ProtocolError(
                Status.UNAVAILABLE, f"the daemon is {self._lifecycle.reported}; retry later", request.id
            )
        lane = self.lanes[class_name]
        model = self.models.get(request.model or "")
        if model is None:
            raise ProtocolError(
                Status.NOT_FOUND,
                f"unknown model {request.model!r}: this daemon serves {sorted(self.models)}",
                request.id,
            )
        # From the header alone: a request that is shed never has its payload looked at.
        model.signature.check(request)
        rows, elements = model.signature.measure(request)
        slots = self._regions_of(route, request, model) if request.shm_inputs or request.outputs_shm else {}
        if model.pipeline is not None and request.device_inputs:
            raise ProtocolError(
                Status.INVALID_ARGUMENT,
                f"pipeline {model.name!r} takes its inputs in frames or POSIX shared memory, not in device memory "
                "(a CUDA IPC region): its steps start from host arrays",
                request.id,
            )
        if self.fixed_rows and rows > lane.klass.max_batch:
            raise ProtocolError(
                Status.INVALID_ARGUMENT,
                f"{rows} rows exceed classes.{class_name}.max_batch = {lane.klass.max_batch}, the most rows "
                "one call may carry on this backend: split the request or send it to a class with a larger max_batch",
                request.id,
            )
        outcome = lane.offer(route, request, model, rows, elements, received_ns, slots)
        if isinstance(outcome, Shed):
            # The time a shed took inside the daemon is part of the reply: a client can check it was immediate.
            total_us = (time.monotonic_ns() - received_ns) // 1000
            self._reply(route, fast.encode_overloaded(request.id, outcome.message, outcome.retry_after_ms, total_us))
        if lane.klass.spin_us:
            self._note_for_spin(class_name, lane.klass.spin_us * 1000, received_ns)

    def _regions_of(self, route: Any, request: Request, model: ModelEntry) -> dict[str, Slot]:
        """The request's inputs in shared memory resolved in place, and where its outputs go."""
        produced = set(request.outputs or model.signature.output_names)
        if unknown := sorted(set(request.outputs_shm) - produced):
            raise ProtocolError(
                Status.INVALID_ARGUMENT,
                f"outputs_shm names {unknown}, which this request does not return: it returns {sorted(produced)}",
                request.id,
            )
        return self.regions.resolve(request, self._transport.local(route))

    def _note_for_spin(self, class_name: str, spin_ns: int, received_ns: int) -> None:
        """Arm the spin when this request came within spin_ns of the loop being done with
        the class's previous one: a spin that would not have caught it burns the core for
        nothing. Both ends are the loop's idle gap, which is what a spin must span: from
        arrival to arrival, a closed-loop client's gap also holds the daemon's own time,
        and a spin counted from arrival ended before the client's next request came."""
        done_ns = time.monotonic_ns()
        if received_ns - self._handled_ns.get(class_name, 0) <= spin_ns:
            self._spin_until_ns = done_ns + spin_ns
        self._handled_ns[class_name] = done_ns
