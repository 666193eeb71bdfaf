"""A lane: one priority class's admission state, its workers (`crew`) and its loop's
own runners. `offer` prices a request, lets admission decide, and sheds it or places it:
- inline, on the class's loop, now: the lane idle, no request waiting behind it on its
  socket (the highest class's loop runs cheap ones in turn), and the job within its
  inline cap (edged.serve.lanes.inline_cap);
- else on a worker of the class, which bulk's `batch_wait_us` lets wait to fill a batch.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from functools import partial
from typing import Any

from edged.backends import Backend, Runner
from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry
from edged.serve.admission import Backlog, Shed, admit
from edged.serve.answers import Answers
from edged.serve.contention import Contention
from edged.serve.lanes.batching import Job, named
from edged.serve.lanes.crew import Crew
from edged.serve.lanes.inline_cap import InlineCap
from edged.serve.lanes.precedence import Precedence
from edged.serve.lanes.priced import Priced
from edged.serve.lanes.warming import load_and_warm
from edged.serve.lanes.worker import Remeasure
from edged.serve.pending import PendingBytes
from edged.serve.pricing import ServiceTimes, price_clock
from edged.serve.stats import ClassStats
from edged.serve.transport import Route, peer
from edged.wire.codec import Request, tensor_views

log = logging.getLogger("edged.lanes")

# A price that sheds a request on its own is re-timed at most this often (`_remeasure`).
REMEASURE_EVERY_NS = 1_000_000_000
PRICED_PAST_MEASURED = (
    "priced past the largest input measured on this lane; a warm-up sample of this size in the model's manifest "
    "measures it"
)


class Lane:
    """One class's lane. Its admission state has one writer, the class's loop, from
    `own` on (`offer` checks). Workers time calls into `service` and answer through
    `Answers`, which takes finished work off `backlog`; the steering thread retires,
    watches and replaces them through `crew`."""

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
    ) -> None:
        self.klass = klass
        self.stats = stats or ClassStats()
        self.precedence = precedence or Precedence()  # shared with the other lanes of its generation
        share = partial(contention.share, klass.nice) if contention else None
        self.backlog = Backlog(klass.workers, self.precedence.idle, klass.gives_way, share)
        self.precedence.join(klass.order, self.backlog)
        self.service = ServiceTimes()
        self._pending = pending or PendingBytes()  # daemon-wide, kept across reloads
        self._answers = Answers(self.stats, self.backlog, self._pending)
        self.crew = Crew(klass, models, pipelines or [], backend, self._answers, self.service, self.precedence)
        self._models = models
        self._backend = backend
        self.inline_cap = InlineCap.of(klass)  # read by its loop at each arrival
        self._on_loop: dict[str, Runner] | None = None  # by model, the owner's own runners: never a worker's
        self._owner: int | None = None  # the loop thread that admits (`own`)
        self._last_remeasure_ns = 0

    def start(self) -> None:
        """Start the workers, each loaded and warm, then load the loop's own runners: one per
        model, since a price may change while the lane serves (the GPU memory plan counts them)."""
        self.crew.start()
        if self.klass.runs_inline:
            # No CUDA graph on a loop: ONNX Runtime captures in global mode, which other lanes' calls break.
            klass = replace(self.klass, cuda_graph=False)
            self._on_loop = {m.name: load_and_warm(self._backend, m, klass, self.service) for m in self._models}

    def own(self) -> None:
        """Make the calling thread, the class's loop, the lane's one admitter. Each inline runner
        within the cap makes one call here first: a runtime's per-thread state (ONNX Runtime's
        CUDA handles) is then not made mid-request."""
        self._owner = threading.get_ident()
        if self._on_loop is None:
            return
        for model in self._models:
            if self.service.estimate_ns(model.name) <= self.inline_cap.most_ns:
                self._on_loop[model.name].run(model.samples[0].inputs(), model.signature.output_names)

    def disown(self) -> None:
        """Give the inline runners back (the owner, once it admits to newer lanes)."""
        for runner in (self._on_loop or {}).values():
            runner.close()
        self._on_loop = None

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
        """Admit and place a checked request, or shed it, from its header alone. `into`: its
        outputs' slots in the client's shared memory; `inline_ns`: the dearest job the loop may
        run itself now; `handoff_ns`: a hand-off's cost now (a pipeline's price counts it)."""
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
        # Watched whatever the higher classes hold now (taken on trust, a burst was admitted at the
        # ideal pace and a third of it expired); an idle lane has no work ahead to weigh.
        outlook = None
        if depth:  # its calls in flight get through their work at each worker's share of the pace
            in_flight = self.crew.calls.progress(now_ns, backlog.pace / self.klass.workers)
            outlook = backlog.outlook(now_ns, in_flight, self.klass.gives_way, above_ns)
        shed = admit(self.klass, backlog, cost_ns, left_ns, above_ns, outlook, priced.bound_ns if priced else 0)
        if shed is None:  # its bytes are held only once admission admits it
            who, nbytes = peer(route), sum(len(payload) for payload in request.payloads)
            shed = self._pending.take(who, nbytes, backlog)
        if shed is not None and shed.reason == "deadline" and priced is not None:
            shed = replace(shed, message=priced.shed(left_ns, shed.message))
        if shed is not None:
            return self._shed(shed, model, rows, elements, now_ns)
        try:
            inputs = tensor_views(request)
        except BaseException:  # its caller answers it; the peer's budget must not keep its bytes for ever
            self._pending.give_back(who, nbytes)
            raise
        self.stats.admitted += 1
        job = Job(
            route=route,
            request_id=request.id,
            model=model,
            inputs=inputs,
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

    def enqueue(self, job: Job | Remeasure) -> None:
        """Hand an admitted job, or a re-timing, to the lane's workers."""
        self.backlog.add(job.cost_ns)
        self.crew.jobs.put(job)

    def _inline_fits(self, job: Job, inline_ns: int) -> bool:
        # A size past those measured (a guessed price) and a pipeline's Python steps run on a worker.
        return (
            self._on_loop is not None
            and job.model.pipeline is None
            and job.cost_ns <= inline_ns
            and self.service.measured(job.model.name, job.rows, job.elements)
        )

    def _run_inline(self, job: Job) -> None:
        """Run a job on the loop and answer it. The watchdog does not answer it (the reply
        would leave through this loop, inside the call): a stuck loop starves systemd's instead."""
        try:
            self._call_inline(job)
        except Exception as exc:  # a bug past the call: answered once (if not yet), off the backlog
            log.exception("class %s: a call of %s on its loop failed", self.klass.name, job.model.name)
            self._answers.failures([job], time.monotonic_ns(), f"the daemon failed on this request: {exc}")

    def _call_inline(self, job: Job) -> None:
        assert self._on_loop is not None
        runner, name = self._on_loop[job.model.name], job.model.name
        self.stats.inline += 1
        self.stats.call(job.rows)
        clock = price_clock(runner)
        start_ns, priced_from = time.monotonic_ns(), clock()
        try:
            outputs = named(job.output_names, runner.run(job.inputs, job.output_names))
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
            # Re-timing the warm-up sample refreshes a measured price, never a guessed one.
            if self.service.measured(model.name, rows, elements):
                self._remeasure(model, now_ns)
            else:
                shed = replace(shed, message=f"{shed.message} ({PRICED_PAST_MEASURED})")
        self.stats.count_shed(shed.reason)
        return shed

    def _remeasure(self, model: ModelEntry, now_ns: int) -> None:
        """Re-time the model on an idle lane, at most once a second: a price inflated by a
        moment's contention would otherwise shed its requests for ever, none admitted to correct it."""
        if self.backlog.depth == 0 and now_ns - self._last_remeasure_ns > REMEASURE_EVERY_NS:
            self._last_remeasure_ns = now_ns
            self.enqueue(Remeasure.of(model, self.service))
