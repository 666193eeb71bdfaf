"""Lanes: one per priority class, reserved at start-up, each with its workers and their
queue (its crew: edged.serve.lanes.crew) and its admission state. `offer` prices a
request, lets admission decide (edged.serve.admission), and sheds it at once or places
the job in one of its class's ways:
- inline: on the class's loop thread, now, when the lane is idle, no request waits
  behind it on its socket (the highest class's loop runs cheap ones in turn too: see
  edged.serve.dispatch), and the job is priced within what the loop may run itself
  (edged.serve.lanes.inline_cap: a job that two hand-offs to a worker and back would
  slow by 2%);
- a worker of the class, which a class with `batch_wait_us` (bulk's batcher) lets wait
  that long to fill a batch.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from functools import partial
from typing import Any

from edged.backends import Backend
from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry
from edged.serve.admission import Backlog, Shed, admit
from edged.serve.answers import Answers
from edged.serve.contention import Contention
from edged.serve.lanes.batching import Job
from edged.serve.lanes.crew import Crew
from edged.serve.lanes.inline_cap import InlineCap
from edged.serve.lanes.precedence import Precedence
from edged.serve.lanes.priced import Priced
from edged.serve.lanes.worker import Remeasure, Worker
from edged.serve.pending import PendingBytes
from edged.serve.pricing import ServiceTimes, price_clock
from edged.serve.stats import ClassStats
from edged.serve.transport import Route, peer
from edged.wire.codec import Request, tensor_views

log = logging.getLogger("edged.lanes")

REMEASURE_EVERY_NS = 1_000_000_000
PRICED_PAST_MEASURED = (
    "priced past the largest input measured on this lane; a warm-up sample of this size in the model's manifest "
    "measures it"
)


class Lane:
    """One class's lane. Built and started by the loader; from then on its admission
    state is written by one thread, its owner: the class's loop, from `own` on (`offer`
    checks, as asyncio's loop checks its thread). Its workers write nothing of the
    lane's own: they time calls into `service`, and count and answer through its
    Answers, which takes finished work off `backlog`. The daemon's steering thread
    retires it, watches its calls and replaces a stuck worker (`check_stuck`)."""

    def __init__(
        self,
        klass: ClassConfig,
        models: list[ModelEntry],
        backend: Backend,
        stats: ClassStats | None = None,
        precedence: Precedence | None = None,
        pending: PendingBytes | None = None,
        pipelines: list[ModelEntry] | None = None,
        contention: Contention | None = None,
        loop_deadline_ms: float | None = None,
    ) -> None:
        """`loop_deadline_ms`: the shortest deadline among the requests its loop reads (the
        default class's loop reads the shared endpoints, for every class); None: its own."""
        self.klass = klass
        self.stats = stats or ClassStats()
        self.precedence = precedence or Precedence()  # shared with the other lanes of its generation
        share = partial(contention.share, klass.nice) if contention else None
        self.backlog = Backlog(klass.workers, self.precedence.idle, klass.gives_way, share)
        self.precedence.join(klass.order, self.backlog)
        self.service = ServiceTimes()
        self._pending = pending or PendingBytes()  # daemon-wide, kept across reloads
        self._answers = Answers(self.stats, self.backlog, self._pending)
        # A pipeline's steps run on the workers (edged.serve.lanes.steps).
        self._crew = Crew(klass, models, pipelines or [], backend, self._answers, self.service, self.precedence)
        self._models = models
        self.inline_cap = InlineCap.of(klass, loop_deadline_ms)  # read by its loop at each arrival
        self._inline: Worker | None = None  # runners of the owner's own: never shared with a worker
        self._owner: int | None = None  # the loop thread that admits (`own`)
        self._last_remeasure_ns = 0

    # --- life cycle --------------------------------------------------------

    def start(self) -> None:
        """Start the workers; returns once each has loaded and warmed every model. Then
        load the loop's own runners, where the class runs jobs inline: one per model, since
        a price may change while the lane serves (the GPU memory plan counts them)."""
        self._crew.start()
        if self.klass.runs_inline:
            # Never a CUDA graph on a loop: ONNX Runtime captures in global mode, which a
            # capture on a loop, while other lanes serve, would break.
            worker = self._crew.new_worker(replace(self.klass, cuda_graph=False), inline=self._models)
            worker.load(pin=False)  # the loop's thread keeps its own settings
            self._inline = worker

    def own(self) -> None:
        """Become the lane of the calling thread, the class's loop, which alone admits to
        it from now on. Each inline runner of a model priced within the cap makes one call
        here first: a runtime keeps per-thread state (ONNX Runtime's CUDA handles) that a
        first call would make mid-request."""
        self._owner = threading.get_ident()
        for model in self._inline.models if self._inline is not None else ():
            if self.service.estimate_ns(model.name) <= self.inline_cap.most_ns:
                self._inline.runners[model.name].run(model.samples[0].inputs(), model.signature.output_names)

    def disown(self) -> None:
        """Give the inline runners back (the owner, once it admits to newer lanes)."""
        if self._inline is not None:
            for runner in self._inline.runners.values():
                runner.close()
            self._inline = None

    @property
    def health(self) -> str:
        """ "ok", or why not: shown by the health op."""
        return self._crew.health

    def reject_queued(self, message: str) -> int:
        """Answer every job still queued UNAVAILABLE, without running it."""
        return self._crew.reject_queued(message)

    def retire(self) -> None:
        """Let the workers finish every job already queued, then end."""
        self._crew.retire()

    @property
    def alive(self) -> bool:
        return self._crew.alive

    def stop(self, timeout_s: float) -> None:
        """Retire, and wait up to `timeout_s` for the workers to end."""
        self.retire()
        self._crew.join(timeout_s)

    # --- admission (the owner only) ----------------------------------------

    def offer(
        self,
        route: Route,
        request: Request,
        model: ModelEntry,
        rows: int,
        elements: int,
        received_ns: int,
        into: dict[str, Any] | None = None,
        inline_ns: int = 0,
        handoff_ns: float = 0.0,
    ) -> Job | Shed:
        """Admit a checked request of `rows` rows (and `elements`, for a model priced by
        size) and place it, or shed it at once: from its header, its payload untouched.
        `into`: where its outputs go in the client's shared memory (edged.shm.maps.Slot);
        `inline_ns`: the dearest job the loop may run itself now (`inline_cap.limit_ns`; 0
        while other requests wait behind this one, which may then share a worker's call);
        `handoff_ns`: what a hand-off to a worker costs now (a pipeline's price counts it)."""
        if threading.get_ident() != self._owner:
            thread = threading.current_thread().name
            raise RuntimeError(f"class {self.klass.name}'s lane admits on its own loop only, not on {thread!r}")
        self.stats.received += 1  # valid requests only: the invalid are counted daemon-wide
        budget_ns = int((request.deadline_ms or self.klass.deadline_ms) * 1e6)
        pipeline = model.pipeline
        priced = Priced.of(pipeline, self.service, rows, elements, handoff_ns) if pipeline is not None else None
        cost_ns = priced.span_ns if priced is not None else self.service.charge_ns(model.name, rows, elements)
        now_ns = time.monotonic_ns()
        left_ns = budget_ns - (now_ns - received_ns)
        # A lane that yields waits for the higher classes' work as well as its own.
        above_ns = self.precedence.work_above(self.klass.order) if self.klass.yields else 0
        backlog, depth = self.backlog, self.backlog.depth
        # Watched whether or not a higher class holds work now: the higher classes' loops
        # run beside this one, so that work is often in flight at an arrival, and an
        # outlook taken on trust then admitted a burst at the ideal pace (a third expired).
        # An idle lane has no work ahead to weigh, and admission none to ask of it.
        outlook = backlog.outlook(now_ns, self._crew.calls.progress(now_ns), self.klass.gives_way) if depth else None
        shed = admit(self.klass, backlog, cost_ns, left_ns, above_ns, outlook, priced.bound_ns if priced else 0)
        if shed is None:  # its bytes are held only once admission admits it
            who, nbytes = peer(route), sum(len(payload) for payload in request.payloads)
            shed = self._pending.take(who, nbytes, backlog)
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
            peer=who,
            nbytes=nbytes,
            into=into or {},
            device=bool(request.device_inputs),
            priced=priced,
            wakes=depth < self.klass.workers,
        )
        if not depth and self._inline_fits(job, inline_ns):
            backlog.add(cost_ns)
            self._run_inline(job)
        else:
            self.enqueue(job)
        return job

    def enqueue(self, job: Job) -> None:
        """Hand an admitted job to the lane's workers."""
        self.backlog.add(job.cost_ns)
        self._crew.jobs.put(job)

    def _inline_fits(self, job: Job, inline_ns: int) -> bool:
        # A size past those measured is priced by extrapolation: it runs on a worker, which measures it.
        # A pipeline runs on a worker: its Python steps never run on a loop.
        return (
            self._inline is not None
            and job.model.pipeline is None
            and job.cost_ns <= inline_ns
            and self.service.measured(job.model.name, job.rows, job.elements)
        )

    def _run_inline(self, job: Job) -> None:
        """Run a job here, now, and answer it: a worker's call without its queue. A job
        just admitted to an idle lane has not expired and has nothing to batch with. The
        watchdog does not answer it: its reply would leave through this loop, which is
        inside the call; a loop that stops turning stops the systemd watchdog instead."""
        assert self._inline is not None
        runner, name = self._inline.runners[job.model.name], job.model.name
        self.stats.inline += 1
        self.stats.call(job.rows)
        clock = price_clock(runner)
        start_ns, priced_from = time.monotonic_ns(), clock()
        try:
            outputs = dict(zip(job.output_names, runner.run(job.inputs, job.output_names)))
        except Exception as exc:
            log.warning("backend error on %s: %s", name, exc)
            self._answers.result(job, start_ns, 0, error=f"the backend failed on this request: {exc}")
            return
        price_ns = clock() - priced_from
        self._answers.result(job, start_ns, time.monotonic_ns() - start_ns, outputs=outputs)
        self.service.observe(name, price_ns, job.rows, job.elements)

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
        """Refresh the model's price on an idle lane, at most once a second: were it stale
        (inflated by a burst of contention, say), the lane would shed those requests for
        ever, since nothing admitted would ever measure it again."""
        if self.backlog.depth == 0 and now_ns - self._last_remeasure_ns > REMEASURE_EVERY_NS:
            self._last_remeasure_ns = now_ns
            cost_ns = self.service.estimate_ns(model.name)
            self.backlog.add(cost_ns)
            self._crew.jobs.put(Remeasure(model, cost_ns))

    # --- the watchdog (the steering thread, and the shutdown) ---------------

    def check_stuck(self, now_ns: int) -> None:
        """Answer the requests of a backend call open past `stuck_after_ms`, and replace
        the worker inside it (edged.serve.lanes.crew)."""
        self._crew.check_stuck(now_ns)

    def next_check_ns(self, now_ns: int) -> float:
        """When `check_stuck` must look next."""
        return self._crew.next_check_ns(now_ns)

    def answer_open_calls(self, message: str) -> int:
        """Answer INTERNAL every request still inside a backend call: the last act of a
        shutdown whose grace ran out, so that nothing admitted goes unanswered."""
        return self._crew.answer_open_calls(message)
