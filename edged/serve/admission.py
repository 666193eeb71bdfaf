"""Admission: admit a request to its class's queue, or shed it at once.

Pure decisions over a lane's live figures; nothing here blocks, sleeps or sends.
A shed is a value with a reason and a retry hint, not an exception.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from edged.config.classes import ClassConfig

# Weight of the newest observation in the service-time average: heavy enough to
# follow a change of load within a few dozen requests, light enough to ignore one outlier.
EWMA_WEIGHT = 0.1
# Admission keeps 1/this of the queued work ahead in hand (20%): see admit().
QUEUE_SLACK_DIVISOR = 5
# Input sizes remembered per size-priced model, the least recently seen dropped first:
# enough for a few image or chunk sizes in rotation, few enough to republish per call.
SIZES_KEPT = 8

Key = TypeVar("Key", str, int)


@dataclass(frozen=True, slots=True)
class Shed:
    reason: str  # "queue_full", "deadline" or "bytes": the stats counter it lands in
    message: str
    retry_after_ms: float
    beyond_one_run: bool = False  # the deadline is shorter than the model's own run


class ServiceTimes:
    """How long a backend call of each model takes on one lane, learned live.

    A call costs a first row plus each further row: priced per request, a few
    large batches would make every small request look expensive. A model whose cost
    follows its input's size (`Signature.sized`) is priced per row too, each row at
    what a row of its size costs, from the sizes measured (SizeCosts): per row, so
    that a batch of four small images and one image four times their size, equal in
    elements, are not taken for one size. Owned by a Lane: its workers, and the loop's
    thread for the calls it runs itself, write it, each observation under the lock;
    `Lane.offer` reads single values and the published SizeCosts, without it.
    """

    def __init__(self) -> None:
        self._first_row_ns: dict[str, float] = {}
        self._extra_row_ns: dict[str, float] = {}
        self._measured: dict[str, dict[int, float]] = {}  # by model: elements -> call ns; workers only
        self._sizes: dict[str, SizeCosts] = {}  # by model: what the loop reads, replaced whole
        self._lock = threading.Lock()  # between its writers: the lane's workers and the loop's thread

    def observe(self, model: str, call_ns: int, rows: int, elements: int = 0) -> None:
        """A call of `rows` rows took `call_ns`; `elements`: its inputs' size, for a size-priced model."""
        # Every averaging is a read, then a write: without the lock, a switch of the GIL
        # between the two loses the other writer's sample.
        with self._lock:
            if rows <= 1:
                _update(self._first_row_ns, model, call_ns)
            else:
                first = self._first_row_ns.get(model, call_ns / rows)
                _update(self._extra_row_ns, model, max(call_ns - first, 0.0) / (rows - 1))
            if elements:
                size = elements // max(rows, 1)
                table = self._measured.setdefault(model, {})
                _update(table, size, call_ns / max(rows, 1))
                table[size] = table.pop(size)  # the most recently seen last
                if len(table) > SIZES_KEPT:
                    del table[next(iter(table))]
                self._sizes[model] = SizeCosts.of(table)

    def estimate_ns(self, model: str, rows: int = 1) -> int:
        return int(self._first_row_ns.get(model, 0.0) + (rows - 1) * self.extra_row_ns(model))

    def charge_ns(self, model: str, rows: int, elements: int = 0) -> int:
        """What a job of `rows` rows adds to a lane's work: each row at the dearer of
        a call's first row and a batch's further rows. A job alone costs its first
        row; one batched behind others costs further rows, which cost more than the
        first when batches run beside other work. Priced at the cheaper, a long queue
        of batched jobs looked shorter than it was, and its tail expired.
        A size-priced model's job (`elements` given) costs each row at its size's price."""
        sizes = self._sizes.get(model) if elements else None
        if sizes is not None:
            return rows * sizes.estimate_ns(elements // max(rows, 1))
        return int(rows * max(self._first_row_ns.get(model, 0.0), self.extra_row_ns(model)))

    def measured(self, model: str, rows: int, elements: int) -> bool:
        """Whether a request is priced from measurements rather than extrapolated: its
        rows no larger than a size measured (always, for a model priced per row alone)."""
        if not elements:
            return True
        sizes = self._sizes.get(model)
        return sizes is not None and elements // max(rows, 1) <= sizes.sizes[-1]

    def extra_row_ns(self, model: str) -> float:
        """What each row past the first adds to a call (the first row's cost until a batch is seen)."""
        return self._extra_row_ns.get(model, self._first_row_ns.get(model, 0.0))


@dataclass(frozen=True, slots=True)
class SizeCosts:
    """A size-priced model's call times at the sizes measured lately, joined by
    straight lines: a fixed part plus a part per element between each two sizes.

    Lines rather than one fitted line: a model's cost is seldom exactly linear (the
    OCR detector's grows faster than its pixels), and the chord of a cost that grows
    ever faster lies above it, so a size between two measured ones is priced high
    rather than low. Published whole by each observation: admission reads one
    reference and bisects at most SIZES_KEPT sizes, a bounded constant of work.
    """

    sizes: tuple[int, ...]  # a row's elements, ascending
    costs_ns: tuple[float, ...]  # what a row of each size adds to a call
    top_ns: float  # the dearest measured call
    beyond_ns: float  # per element past the largest size

    @classmethod
    def of(cls, measured: dict[int, float]) -> SizeCosts:
        sizes = tuple(sorted(measured))
        costs = tuple(measured[size] for size in sizes)
        # Past the largest size: the steeper of the last segment and cost in proportion to
        # size (zero fixed part), the most any cost with a fixed part of zero or more grows.
        beyond = costs[-1] / sizes[-1]
        if len(sizes) > 1:
            beyond = max(beyond, (costs[-1] - costs[-2]) / (sizes[-1] - sizes[-2]))
        return cls(sizes, costs, max(costs), beyond)

    def estimate_ns(self, elements: int) -> int:
        """A row of `elements` elements: at or below the smallest size its cost, between
        two sizes on their line, past the largest the dearest cost measured plus
        `beyond_ns` per further element: never priced as a smaller input."""
        sizes, costs = self.sizes, self.costs_ns
        i = bisect_left(sizes, elements)
        if i == len(sizes):
            return int(self.top_ns + self.beyond_ns * (elements - sizes[-1]))
        if i == 0 or sizes[i] == elements:
            return int(costs[i])
        low, high = sizes[i - 1], sizes[i]
        return int(costs[i - 1] + (costs[i] - costs[i - 1]) * (elements - low) / (high - low))


def _update(averages: dict[Key, float], key: Key, value: float) -> None:
    current = averages.get(key)
    averages[key] = value if current is None else current + EWMA_WEIGHT * (value - current)


# A lane's pace: the priced work it answers per ns of wall time while it holds work,
# sampled over PACE_WINDOW_NS (or a shorter busy spell, of at least PACE_MIN_NS), each
# sample weighing PACE_WEIGHT in the average. After PACE_STALE_NS idle, it starts over.
PACE_WINDOW_NS = 50_000_000
PACE_MIN_NS = 1_000_000
PACE_WEIGHT = 0.5
PACE_STALE_NS = 1_000_000_000


class Backlog:
    """What a lane has accepted and not yet answered: a count, its estimated work, and
    the pace at which the lane gets through such work.

    Owned by a Lane. `Lane.offer` adds (the socket loop); whoever answers a job takes
    it away (the loop for a job it ran itself, else a worker, the watchdog or the
    shutdown): every change under `_lock`. `depth`, `work_ns` and `pace` are single
    fields, so a reader on any thread sees a value some moment held, never a torn one.

    The pace is measured, not assumed: whatever else takes the lane's cores (the
    higher classes it yields to, the socket loop reading a burst, another process)
    slows it, and admission divides the work ahead by it.
    """

    def __init__(self, workers: int = 1, on_empty: Callable[[], None] | None = None) -> None:
        self._depth = 0
        self._work_ns = 0
        self._lock = threading.Lock()
        self._on_empty = on_empty  # told each time the last job is answered
        self._ideal = float(workers)  # each worker getting through a priced ns in a ns
        self._pace = self._ideal
        self._spell_ns = 0  # when the current sample began
        self._answered_ns = 0  # priced work answered since then
        self._last_ns = 0  # when the last job was answered

    def add(self, cost_ns: int) -> None:
        with self._lock:
            if not self._depth:
                now_ns = time.monotonic_ns()
                if now_ns - self._last_ns > PACE_STALE_NS:
                    self._pace = self._ideal
                self._spell_ns, self._answered_ns = now_ns, 0
            self._depth += 1
            self._work_ns += cost_ns

    def finish(self, cost_ns: int) -> None:
        now_ns = time.monotonic_ns()
        with self._lock:
            self._depth -= 1
            self._work_ns -= cost_ns
            self._answered_ns += cost_ns
            self._last_ns = now_ns
            spell_ns = now_ns - self._spell_ns
            emptied = self._depth == 0
            if spell_ns >= PACE_WINDOW_NS or (emptied and spell_ns >= PACE_MIN_NS):
                sample = self._answered_ns / spell_ns
                self._pace = max((1 - PACE_WEIGHT) * self._pace + PACE_WEIGHT * sample, self._ideal / 100)
                self._spell_ns, self._answered_ns = now_ns, 0
        if emptied and self._on_empty is not None:
            self._on_empty()

    @property
    def average_job_ns(self) -> float:
        """The estimated work of the average job held (0 with none)."""
        return self._work_ns / max(self._depth, 1)

    @property
    def pace(self) -> float:
        """Priced ns of work the lane answers per ns while it has work (its workers' count, ideally)."""
        return self._pace

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def work_ns(self) -> int:
        return self._work_ns


def admit(
    klass: ClassConfig, backlog: Backlog, cost_ns: int, budget_ns: int, above_ns: int = 0, done_ns: int = 0
) -> Shed | None:
    """None to admit; a Shed when the queue is full or the deadline cannot be met.
    `above_ns` is the work of higher classes that this one waits for (it yields);
    `done_ns` the part of the lane's own backlog that its calls in flight have done."""
    depth = backlog.depth
    if depth >= klass.queue_capacity:
        # One slot frees when the average job ahead finishes on one of the workers.
        per_job_ns = backlog.average_job_ns
        return Shed(
            "queue_full",
            f"class {klass.name!r} has {depth} requests waiting or running, its capacity "
            f"(classes.{klass.name}.queue_capacity = {klass.queue_capacity})",
            retry_hint_ms(per_job_ns / klass.workers),
        )
    queued_ns = int(max(backlog.work_ns - done_ns, 0) / backlog.pace) + above_ns
    # The estimate of a long queue errs by a share of its length, and a job admitted with
    # no slack then expires: admission keeps that share in hand.
    ahead_ns = queued_ns + queued_ns // QUEUE_SLACK_DIVISOR
    if ahead_ns + cost_ns > budget_ns:
        if cost_ns > budget_ns:
            message = (
                f"class {klass.name!r} cannot meet the deadline: the model alone takes about {cost_ns / 1e6:.3f} ms, "
                f"more than the {max(budget_ns, 0) / 1e6:.3f} ms left; a retry needs a longer deadline"
            )
        else:
            message = (
                f"class {klass.name!r} cannot meet the deadline: about {ahead_ns / 1e6:.3f} ms of work is ahead "
                f"of this request and {max(budget_ns, 0) / 1e6:.3f} ms are left"
            )
        return Shed(
            "deadline", message, retry_hint_ms(ahead_ns + cost_ns - budget_ns), beyond_one_run=cost_ns > budget_ns
        )
    return None


def retry_hint_ms(ns: float) -> float:
    """A retry hint from a wait in ns."""
    # Rounded up to 0.1 ms: a retry hint of 0 would invite an immediate, doomed retry.
    return max(round(ns / 1e6 + 0.05, 1), 0.1)
