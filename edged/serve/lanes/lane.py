"""Lanes: one per priority class, reserved at start-up, each with its own queue,
worker threads and backend runners (its crew: edged.serve.lanes.crew), and its own
admission state. `offer` prices a request, lets admission decide
(edged.serve.admission), and sheds it at once or places the job on one of its routes
(edged.serve.lanes.routes): on the socket loop's thread when the lane is idle, else on
a worker. Replies go through the lane's Transport."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from edged.backends import Backend
from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry
from edged.serve.admission import Backlog, Shed, admit
from edged.serve.answers import Answers
from edged.serve.lanes.batching import Job
from edged.serve.lanes.crew import Crew
from edged.serve.lanes.inline import InlinePath
from edged.serve.lanes.precedence import Precedence
from edged.serve.lanes.routes import Aside, Inline, Queued, Route
from edged.serve.lanes.steps import Priced
from edged.serve.lanes.worker import Remeasure
from edged.serve.pending import PendingBytes
from edged.serve.pricing import ServiceTimes
from edged.serve.stats import ClassStats
from edged.serve.transport import Transport
from edged.wire.codec import Request, tensor_views

REMEASURE_EVERY_NS = 1_000_000_000
PRICED_PAST_MEASURED = (
    "priced past the largest input measured on this lane; a warm-up sample of this size in the model's manifest "
    "measures it"
)


class Lane:
    """One class's lane. Its own state is written on one thread at a time: by the
    loader while it builds and starts the lane, then by the socket loop (`offer`:
    admission and arrivals; `check_stuck`: workers and health, through its crew). Its
    workers write nothing of the lane's own: they time calls into `service`, and count
    and answer through its Answers, which takes finished work off `backlog`."""

    def __init__(
        self,
        klass: ClassConfig,
        models: list[ModelEntry],
        backend: Backend,
        transport: Transport,
        stats: ClassStats | None = None,
        precedence: Precedence | None = None,
        pending: PendingBytes | None = None,
        pipelines: list[ModelEntry] | None = None,
    ) -> None:
        self.klass = klass
        self.stats = stats or ClassStats()
        self.precedence = precedence or Precedence()  # shared with the other lanes of its generation
        self.backlog = Backlog(klass.workers, self.precedence.idle, klass.gives_way)
        self.precedence.join(klass.order, self.backlog)
        self.service = ServiceTimes()
        self._transport = transport
        self._pending = pending or PendingBytes()  # daemon-wide, kept across reloads
        answers = Answers(transport, self.stats, self.backlog, self._pending)
        # A pipeline's steps run on the workers (edged.serve.lanes.steps).
        self._crew = Crew(klass, models, pipelines or [], backend, answers, self.service, self.precedence)
        self._inline: InlinePath | None = None
        self._queued = Queued(self._crew.jobs)
        self._idle_routes: tuple[Route, ...] = (self._queued,)  # where a job goes when nothing is ahead of it
        self._last_remeasure_ns = 0

    # --- life cycle --------------------------------------------------------

    def start(self) -> None:
        """Start the workers; returns once each has loaded and warmed every model."""
        self._crew.start()
        if self.klass.inline_max_us:
            # Never a CUDA graph on the loop: ONNX Runtime captures in global mode, which
            # a capture on the loop, while other lanes serve, would break.
            loop_worker = self._crew.new_worker(replace(self.klass, cuda_graph=False), on_worker=False)
            loop_worker.load(pin=False)  # the loop's own thread keeps its settings
            self._inline = InlinePath(self.klass, loop_worker)
            loop_routes: list[Route] = [Inline(self._inline, self.stats)]
            if self.klass.stand_in:
                loop_routes.append(Aside(self._inline, self.stats, self._transport))
            self._idle_routes = (*loop_routes, self._queued)

    def warm_on_loop(self) -> None:
        """Warm the inline path's runners on the socket loop's own thread, before it
        serves: a runtime keeps per-thread state (ONNX Runtime's cuBLAS and cuDNN
        handles), which a first call on a new thread would create mid-request."""
        if self._inline is not None:
            self._inline.warm()

    @property
    def health(self) -> str:
        """ "ok", or why not: shown by the health op."""
        return self._crew.health

    def reject_queued(self, message: str) -> int:
        """Answer every job still queued UNAVAILABLE, without running it."""
        return self._crew.reject_queued(message)

    def retire(self) -> None:
        """Let the workers finish every job already queued, then end (socket loop, or
        the loader for a lane it never opened: the inline path is not called after)."""
        self._crew.retire()
        if self._inline is not None:
            self._idle_routes = (self._queued,)
            self._inline.close()
            self._inline = None

    @property
    def alive(self) -> bool:
        return self._crew.alive

    def stop(self, timeout_s: float) -> None:
        """Retire, and wait up to `timeout_s` for the workers to end."""
        self.retire()
        self._crew.join(timeout_s)

    # --- admission (socket loop only) --------------------------------------

    def offer(
        self,
        route: Any,
        request: Request,
        model: ModelEntry,
        rows: int,
        elements: int,
        received_ns: int,
        into: dict[str, Any] | None = None,
    ) -> Job | Shed:
        """Admit a checked request of `rows` rows (and `elements`, for a model priced by
        size) and place it, or shed it at once: from its header, its payload untouched.
        `into`: where its outputs go in the client's shared memory (edged.serve.regions)."""
        self.stats.received += 1  # valid requests only: the invalid are counted daemon-wide
        budget_ns = int((request.deadline_ms or self.klass.deadline_ms) * 1e6)
        priced = Priced.of(model.pipeline, self.service, rows, elements) if model.pipeline is not None else None
        cost_ns = priced.span_ns if priced is not None else self.service.charge_ns(model.name, rows, elements)
        now_ns = time.monotonic_ns()
        left_ns = budget_ns - (now_ns - received_ns)
        # A lane that yields waits for the higher classes' work as well as its own.
        above_ns = self.precedence.work_above(self.klass.order) if self.klass.yields else 0
        outlook = self.backlog.outlook(now_ns, self._crew.calls.progress(now_ns), self.klass.gives_way and not above_ns)
        shed = admit(self.klass, self.backlog, cost_ns, left_ns, above_ns, outlook)
        if shed is None:  # its bytes are held only once admission admits it
            peer, nbytes = self._transport.peer(route), sum(len(payload) for payload in request.payloads)
            shed = self._pending.take(peer, nbytes, self.backlog)
        if shed is not None and shed.reason == "deadline" and priced is not None:
            shed = replace(shed, message=priced.shed(left_ns, shed.message))
        if shed is not None:
            return self._shed(shed, model, rows, elements, now_ns)
        self.stats.admitted += 1
        job = Job(
            route=route,
            request_id=request.id,
            model=model,
            inputs=tensor_views(request),
            output_names=tuple(request.outputs or model.signature.output_names),
            received_ns=received_ns,
            deadline_ns=received_ns + budget_ns,
            cost_ns=cost_ns,
            rows=rows,
            elements=elements,
            peer=peer,
            nbytes=nbytes,
            into=into or {},
            device=bool(request.device_inputs),
            priced=priced,
        )
        if self.precedence.flying:
            slack_ns = left_ns - cost_ns - int(self.backlog.work_ns / self.backlog.pace)
            self.precedence.make_room(self.klass.order, slack_ns, now_ns)
        self.place(job)
        return job

    def place(self, job: Job) -> None:
        """Hand an admitted job to the first route that takes it. An idle lane's job runs
        on the loop's thread, now: the hand-off to a sleeping worker costs more than a
        cheap job takes, and most of a dear one's overhead. Counted in the backlog first:
        the stand-in may admit behind an aside call."""
        # A pipeline runs on a worker: its Python steps never run on the loop.
        routes = self._idle_routes if not self.backlog.depth and job.model.pipeline is None else (self._queued,)
        self.backlog.add(job.cost_ns)
        for where in routes:
            if where.take(job):
                return

    def _shed(self, shed: Shed, model: ModelEntry, rows: int, elements: int, now_ns: int) -> Shed:
        """Count a refusal, and see that a price that caused it is not stale."""
        if shed.beyond_one_run:
            # Re-timing the warm-up sample refreshes a measured price; a guessed one
            # (a size past every one measured) it could not correct.
            if self.service.measured(model.name, rows, elements):
                self._remeasure(model, now_ns)
            else:
                shed = replace(shed, message=f"{shed.message} ({PRICED_PAST_MEASURED})")
        self.stats.count_shed(shed.reason)
        return shed

    def _remeasure(self, model: ModelEntry, now_ns: int) -> None:
        """Refresh the model's service estimate on an idle lane, at most once a second.

        Called when admission sheds a request as too slow for its deadline: were the
        estimate stale (inflated by a burst of contention, say), it would shed those
        requests forever, since nothing admitted would ever measure it again.
        """
        if self.backlog.depth == 0 and now_ns - self._last_remeasure_ns > REMEASURE_EVERY_NS:
            self._last_remeasure_ns = now_ns
            self._crew.jobs.put(Remeasure(model))

    # --- the watchdog (socket loop's tick, and the shutdown) ---------------

    def check_stuck(self, now_ns: int) -> None:
        """Answer the requests of a backend call open past `stuck_after_ms`, and replace
        the worker inside it (edged.serve.lanes.crew)."""
        self._crew.check_stuck(now_ns)

    def answer_open_calls(self, message: str) -> int:
        """Answer INTERNAL every request still inside a backend call: the last act of a
        shutdown whose grace ran out, so that nothing admitted goes unanswered."""
        return self._crew.answer_open_calls(message)
