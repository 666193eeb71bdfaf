"""From frames to a decision, on the loop that read them: decode, answer the control
ops, and hand an inference request to its class's loop, which admits or sheds it.

A request read on a class's own socket is admitted at once, on that thread. One read on
a shared endpoint (the default class's loop) for another class goes to that class's
loop (`call_soon`): admission state has one writer. Nothing here blocks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edged.config import Config
from edged.daemon.lifecycle import Lifecycle
from edged.daemon.loading import Loaded
from edged.models.repository import ModelEntry
from edged.serve.admission import Shed
from edged.serve.figures import figures, model_wire
from edged.serve.lanes.inline_cap import LoopDeadlines
from edged.serve.pending import PendingBytes
from edged.serve.transport import Route, local, reply, when_closed
from edged.serve.transport.loop import Loop
from edged.shm.maps import Slot
from edged.shm.registry import Regions
from edged.wire import fast
from edged.wire.codec import Buffer, ProtocolError, Request, RequestId, ShmRef, Status, decode_request, encode_reply

log = logging.getLogger("edged.dispatch")


@dataclass
class Serving:
    """What every class's dispatcher shares. `lifecycle` and `settling` are the steering thread's;
    `regions` and `pending` keep their own locks; the rest is fixed at start-up."""

    config: Config
    lifecycle: Lifecycle
    regions: Regions
    pending: PendingBytes
    ingress: dict[str, list[str]]
    wake_steering: Callable[[], None]  # a loop has passed a fence (Dispatcher.pass_fence)
    started_ns: int = field(default_factory=time.monotonic_ns)
    dispatchers: dict[str, Dispatcher] = field(default_factory=dict)  # by class, in class order
    settling: bool = True  # lanes being built, warmed or retired (start-up, a reload), or a new worker warming

    def quiet(self, klass: str) -> bool:
        """Whether nothing but class `klass`'s loop wants the interpreter now: every other loop
        asleep in its poll, no lane with work queued or running, and none being built or
        retiring (edged.serve.transport.spin)."""
        if self.settling:
            return False
        for dispatcher in self.dispatchers.values():
            if dispatcher.klass != klass and not (dispatcher.loop is not None and dispatcher.loop.blocked):
                return False
            loaded = dispatcher.loaded
            if loaded is not None and loaded.lanes[dispatcher.klass].backlog.depth:
                return False
        return True


class Dispatcher:
    """One class's decisions, on its loop's thread, which alone writes its fields."""

    def __init__(self, klass: str, serving: Serving) -> None:
        self.klass = klass
        self.serving = serving
        self.loop: Loop | None = None  # set once, before the loop starts
        self.loaded: Loaded | None = None
        self.generation = 0  # the number of `loaded`
        self.fence = 0  # the steering thread's latest fence this loop has passed (Loops.ask)
        self.invalid = 0  # requests refused here: malformed, unknown model or class, not serving
        self._models: dict[str, ModelEntry] = {}
        self._class_deadline_ms: dict[str, float] = {}  # a request's, if it sends none
        # The loop's, not a lane's: what it reads is what waits behind its inline calls, across reloads.
        self.deadlines = LoopDeadlines()

    def take_up(self, loaded: Loaded, generation: int) -> None:
        """Admit to these lanes from now on, and give back the inline runners of the ones they replace."""
        old, self.loaded = self.loaded, loaded
        self._models = {model.name: model for model in loaded.models}
        config = loaded.config
        by_class = self._class_deadline_ms = {c.name: c.deadline_ms for c in config.classes}
        # As if it had read now every deadline it may (the default class's loop reads the shared
        # endpoints, where any class's request may come): at start, and after a reload changed them.
        readable = by_class.values() if self.klass == config.default_class else [by_class[self.klass]]
        self.deadlines.read(min(readable), time.monotonic_ns())
        loaded.lanes[self.klass].own()
        if old is not None:
            old.lanes[self.klass].disown()
        self.generation = generation

    def pass_fence(self, fence: int) -> None:
        """Tell the steering thread this loop has run all it was handed before `fence`."""
        self.fence = fence
        self.serving.wake_steering()

    def handle(self, route: Route, frames: list[Buffer], received_ns: int, more: bool = False) -> None:
        """Answer or admit one request: exactly one reply each. `more`: another waits behind it."""
        request_id: RequestId = None
        try:
            limits = self.serving.config.limits
            request = fast.decode_request(frames, limits) or decode_request(frames, limits)
            request_id = request.id
            if request.op == "infer":
                self._route(route, request, received_ns, more)
            elif request.op == "health":
                reply(route, encode_reply(request.id, Status.OK, **self.health()))
            elif request.op == "models":
                self._models_op(route, request)
            elif request.region is not None:
                self._region_op(route, request, request.region)
            else:
                reply(route, encode_reply(request.id, Status.OK, **figures(self.serving)))
        except ProtocolError as exc:
            self._refuse(route, exc, received_ns)
        except Exception as exc:  # a bug here must cost one request, never the daemon
            self._failed(route, request_id, exc, received_ns)

    def admit(
        self, route: Route, request: Request, received_ns: int, more: bool, slots: dict[str, Slot] | None
    ) -> None:
        """Admit or shed a request handed over by the loop that read it (`slots`: its shared memory, resolved there)."""
        try:
            self._admit(route, request, received_ns, more, slots)
        except ProtocolError as exc:
            self._refuse(route, exc, received_ns)
        except Exception as exc:
            self._failed(route, request.id, exc, received_ns)

    def _refuse(self, route: Route, exc: ProtocolError, received_ns: int) -> None:
        self.invalid += 1
        timing = _refused_in(received_ns)
        reply(route, encode_reply(exc.request_id, exc.status, error=exc.message, timing_us=timing, **exc.fields))

    def _failed(self, route: Route, request_id: RequestId, exc: Exception, received_ns: int) -> None:
        log.exception("failed to handle a request")
        error, timing = f"the daemon failed on this request: {exc}", _refused_in(received_ns)
        reply(route, encode_reply(request_id, Status.INTERNAL, error=error, timing_us=timing))

    def _route(self, route: Route, request: Request, received_ns: int, more: bool) -> None:
        ingress = route[0].bound[route[1]].klass
        # Named, even as "", it is checked: only a header without `class` takes the socket's or the default.
        name = request.klass if request.klass is not None else ingress or self.serving.config.default_class
        if ingress is not None and name != ingress:
            raise ProtocolError(
                Status.INVALID_ARGUMENT,
                f"this socket takes class {ingress!r} alone; send class {name!r} to the shared endpoint",
                request.id,
            )
        owner = self.serving.dispatchers.get(name)
        if owner is None:
            known = sorted(self.serving.dispatchers)
            raise ProtocolError(Status.NOT_FOUND, f"unknown class {name!r}: this daemon has {known}", request.id)
        if owner is self:
            self._admit(route, request, received_ns, more)
        else:
            self._check_open(request.id)  # refused here while it cannot run: nothing to hand over
            self.deadlines.read(request.deadline_ms or self._class_deadline_ms[name], received_ns)
            assert owner.loop is not None
            # Resolved here, in its connection's order: an shm_unregister read next finds the region held.
            slots = self._regions_of(route, request) if request.shm_inputs or request.outputs_shm else None
            owner.loop.call_soon(owner.admit, route, request, received_ns, more, slots)

    def _check_open(self, request_id: RequestId) -> None:
        lifecycle = self.serving.lifecycle
        if not lifecycle.open:
            raise ProtocolError(Status.UNAVAILABLE, f"the daemon is {lifecycle.reported}; retry later", request_id)

    def _admit(
        self, route: Route, request: Request, received_ns: int, more: bool, slots: dict[str, Slot] | None = None
    ) -> None:
        self._check_open(request.id)
        loaded = self.loaded
        if loaded is None:  # open, but this loop has not taken up its lanes yet: a moment at start
            raise ProtocolError(Status.UNAVAILABLE, "the daemon is starting; retry later", request.id)
        lane = loaded.lanes[self.klass]
        model = self._model(request)
        # From the header alone: a request that is shed never has its payload looked at.
        model.signature.check(request)
        rows, elements = model.signature.measure(request)
        if slots is None:
            slots = self._regions_of(route, request) if request.shm_inputs or request.outputs_shm else {}
        if model.pipeline is not None and request.device_inputs:
            raise ProtocolError(
                Status.INVALID_ARGUMENT,
                f"pipeline {model.name!r} takes its inputs in frames or POSIX shared memory, not in device memory "
                "(a CUDA IPC region): its steps start from host arrays",
                request.id,
            )
        if loaded.fixed_rows and rows > lane.klass.max_batch:
            raise ProtocolError(
                Status.INVALID_ARGUMENT,
                f"{rows} rows exceed classes.{self.klass}.max_batch = {lane.klass.max_batch}, the most rows "
                "one call may carry on this backend: split the request or send it to a class with a larger max_batch",
                request.id,
            )
        assert self.loop is not None
        deadlines = self.deadlines
        deadlines.read(request.deadline_ms or lane.klass.deadline_ms, received_ns)
        # With requests behind it, a job goes to a worker, which may batch them; the highest
        # class's loop runs cheap ones in turn (InlineCap.limit_ns).
        top = lane.klass.order == self.serving.config.classes[0].order
        cap = lane.inline_cap
        inline_ns = 0 if more and not top else cap.limit_ns(self.loop.handoff_ns, more, deadlines.shortest_ms)
        outcome = lane.offer(route, request, model, rows, elements, received_ns, slots, inline_ns, self.loop.handoff_ns)
        if isinstance(outcome, Shed):
            # The shed's time inside the daemon is in the reply: a client can check it was immediate.
            total_us = (time.monotonic_ns() - received_ns) // 1000
            reply(route, fast.encode_overloaded(request.id, outcome.message, outcome.retry_after_ms, total_us))

    def _model(self, request: Request) -> ModelEntry:
        model = self._models.get(request.model or "")
        if model is None:
            if self.loaded is not None and (why := self.loaded.failed.get(request.model or "")) is not None:
                raise ProtocolError(
                    Status.UNAVAILABLE,
                    f"model {request.model!r} is not loaded ({why}); retry once a reload has loaded it, or elsewhere",
                    request.id,
                    {"scope": "model"},  # not the daemon: a fleet client sets it aside for this model alone
                )
            served = sorted(self._models)
            raise ProtocolError(
                Status.NOT_FOUND, f"unknown model {request.model!r}: this daemon serves {served}", request.id
            )
        return model

    def _regions_of(self, route: Route, request: Request) -> dict[str, Slot]:
        """The request's inputs in shared memory resolved in place, and where its outputs go."""
        model = self._model(request)
        produced = set(request.outputs or model.signature.output_names)
        if unknown := sorted(set(request.outputs_shm) - produced):
            raise ProtocolError(
                Status.INVALID_ARGUMENT,
                f"outputs_shm names {unknown}, which this request does not return: it returns {sorted(produced)}",
                request.id,
            )
        return self.serving.regions.resolve(request, local(route))

    def _region_op(self, route: Route, request: Request, region: ShmRef) -> None:
        """shm_register (a POSIX object or device memory) or shm_unregister, for the sending peer."""
        regions, is_local, request_id = self.serving.regions, local(route), request.id
        if request.op == "shm_unregister":
            regions.unregister(region.region, is_local, request_id)
            reply(route, encode_reply(request_id, Status.OK, region=region.region))
            return
        # A client that ends its connection leaves no region behind: shm.max_regions is every client's.
        # The regions are the connection's, not the peer's: a client may reconnect with its routing id.
        connection = when_closed(route, regions.forget)
        if request.ipc_handle is not None:
            handle = regions.register_ipc(connection, request.ipc_handle, region.nbytes, is_local, request_id)
        else:
            handle = regions.register(connection, region, is_local, request_id)
        if not reply(route, encode_reply(request_id, Status.OK, region=handle, bytes=region.nbytes)):
            # Gone before this was read, its end maybe told already: no one has the handle.
            regions.unregister(handle, is_local, request_id)

    def _models_op(self, route: Route, request: Request) -> None:
        loaded = self.loaded
        models = [model_wire(model, loaded, request.memory) for model in self._models.values()] if loaded else []
        failed = [{"name": name, "error": error} for name, error in (loaded.failed if loaded else {}).items()]
        reply(route, encode_reply(request.id, Status.OK, models=models, failed=failed))

    def health(self) -> dict[str, Any]:
        lifecycle, loaded = self.serving.lifecycle, self.loaded
        lanes = {name: lane.crew.health for name, lane in loaded.lanes.items()} if loaded else {}
        return {
            "state": lifecycle.reported,
            # What a readiness probe trusts: inference open, and no lane waiting for a worker.
            "ready": lifecycle.open and bool(lanes) and all(health == "ok" for health in lanes.values()),
            "uptime_s": round((time.monotonic_ns() - self.serving.started_ns) / 1e9, 3),
            "lanes": lanes,
            "failed_models": dict(loaded.failed) if loaded else {},
            "ingress": self.serving.ingress,
        }


def _refused_in(received_ns: int) -> dict[str, int]:
    """A refusal's timing_us: nothing queued or computed, and the time the decision took (the
    protocol gives every reply to an infer request one; a client cannot always tell the op was read)."""
    return {"queue": 0, "compute": 0, "total": (time.monotonic_ns() - received_ns) // 1000}
