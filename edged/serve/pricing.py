"""Prices: what a backend call of each model costs on one lane with its core (or its device) to itself,
learned live. Admission (edged.serve.admission) weighs them against a deadline at the lane's measured pace."""

from __future__ import annotations

import heapq
import math
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from edged.backends import Runner, computes_on_caller

# Weight of the newest observation once an Average holds 1/EWMA_WEIGHT of them: it follows a change of
# load within a few dozen requests, yet one outlier barely moves it.
EWMA_WEIGHT = 0.1

# `bound_ns`: the second-dearest of the last RUNS_KEPT runs relative to their price (a 99.5th percentile that
# one stalled run does not move). A mean plus deviations misses the long tail (light-chain: p99 3.3x its p50,
# mean deviation a tenth of its mean); a 99th percentile of 100 runs is too noisy (admitted as it dipped, 1.4% expired).
RUNS_KEPT = 200
# The most one run counts, relative to its price: else a pipeline warmed up cheap on zeros, whose first real
# run is slow, is bounded at thousands of times its price and shed for ever, never running to replace that run.
MAX_OVER_PRICE = 5.0
# ... and a run counts this long at most: a bound set by slow runs sheds the requests that would replace them,
# and only re-timings (one a second at most, Lane._remeasure) come while it does.
RUN_KEPT_NS = 60_000_000_000

# Sizes remembered per size-priced model, least recently seen dropped first: a few image or chunk sizes in
# rotation, few enough to republish per call.
SIZES_KEPT = 8

Key = TypeVar("Key", str, int)


def price_clock(runner: Runner) -> Callable[[], int]:
    """The clock `runner`'s calls are priced by, in ns: the calling thread's CPU time where the call computes
    on that thread alone, else the wall's. The lane's share of a core is its pace, measured apart: a wall
    price would count a starved lane's slowness twice (docs/models.md, "What a request costs")."""
    return time.thread_time_ns if computes_on_caller(runner) else time.perf_counter_ns


class ServiceTimes:
    """What a backend call of each model costs on one lane (by `price_clock`), learned live.

    A call costs a first row plus each further row, so a few large batches do not make small requests look
    dear. A size-priced model (`Signature.sized`) costs each row at its own size's price (SizeCosts), so four
    small images are not taken for one four times their size.
    Owned by a Lane: its workers, and its loop's thread for the calls it runs itself, write it under the
    lock; `Lane.offer` reads single values and the published SizeCosts without it.
    """

    def __init__(self) -> None:
        self._first_row_ns: dict[str, Average] = {}
        self._extra_row_ns: dict[str, Average] = {}
        self._measured: dict[str, dict[int, Average]] = {}  # by model: elements -> call ns; workers only
        self._sizes: dict[str, SizeCosts] = {}  # by model: what admission reads, replaced whole
        # By pipeline: its last runs (when, cost relative to the price); workers only.
        self._runs: dict[str, deque[tuple[int, float]]] = {}
        self._bound: dict[str, float] = {}  # by pipeline: the second-dearest of those (bound_ns)
        self._lock = threading.Lock()

    def observe(self, model: str, call_ns: int, rows: int, elements: int = 0) -> None:
        """A call of `rows` rows took `call_ns`; `elements`: its inputs' size, for a size-priced model."""
        # Each average is read, then written: unlocked, a GIL switch between the two loses a sample.
        with self._lock:
            if rows <= 1:
                _update(self._first_row_ns, model, call_ns)
            else:
                first = _value(self._first_row_ns, model, call_ns / rows)
                _update(self._extra_row_ns, model, max(call_ns - first, 0.0) / (rows - 1))
            if elements:
                size = elements // max(rows, 1)
                table = self._measured.setdefault(model, {})
                _update(table, size, call_ns / max(rows, 1))
                table[size] = table.pop(size)  # the most recently seen last
                if len(table) > SIZES_KEPT:
                    del table[next(iter(table))]
                self._sizes[model] = SizeCosts.of({size: average.value for size, average in table.items()})

    def observe_run(self, model: str, call_ns: int, rows: int, elements: int = 0) -> None:
        """`observe`, plus the run's cost relative to its price, for `bound_ns`; for a pipeline's served runs and
        re-timings (not its warm-up's, whose first is cold)."""
        expected = self.charge_ns(model, rows, elements)
        if expected > 0:
            now_ns = time.monotonic_ns()
            with self._lock:
                runs = self._runs.setdefault(model, deque(maxlen=RUNS_KEPT))
                runs.append((now_ns, min(call_ns / expected, MAX_OVER_PRICE)))
                while now_ns - runs[0][0] > RUN_KEPT_NS:
                    runs.popleft()
                self._bound[model] = heapq.nlargest(2, (over for _, over in runs))[-1]
        self.observe(model, call_ns, rows, elements)

    def estimate_ns(self, model: str, rows: int = 1) -> int:
        return int(_value(self._first_row_ns, model, 0.0) + (rows - 1) * self.extra_row_ns(model))

    def charge_ns(self, model: str, rows: int, elements: int = 0) -> int:
        """What a job of `rows` rows adds to a lane's work: each row at the dearer of a call's first row and
        a batch's further rows (which cost more beside other work; at the cheaper, a long queue of batched jobs
        looks shorter than it is). A size-priced model's job (`elements` given): each row at its size's price."""
        sizes = self._sizes.get(model) if elements else None
        if sizes is not None:
            return rows * sizes.estimate_ns(elements // max(rows, 1))
        return int(rows * max(_value(self._first_row_ns, model, 0.0), self.extra_row_ns(model)))

    def bound_ns(self, model: str, rows: int, elements: int = 0) -> int:
        """What a pipeline's run rarely passes: its price times its runs' bound (RUNS_KEPT), or its price alone."""
        return int(self.charge_ns(model, rows, elements) * max(self._bound.get(model, 1.0), 1.0))

    def measured(self, model: str, rows: int, elements: int) -> bool:
        """Whether a request's rows are no larger than a size measured (always, for a model not size-priced)."""
        if not elements:
            return True
        sizes = self._sizes.get(model)
        return sizes is not None and elements // max(rows, 1) <= sizes.sizes[-1]

    def prices(self) -> dict[str, dict[str, Any]]:
        """What the lane charges, by model, as the stats op shows it (any thread): per row by size, and
        "line" or "guess" past the largest (SizeCosts.beyond_ns), for a size-priced model; else first and
        extra row; for a pipeline also `bound_over_price` (`bound_ns`)."""
        shown: dict[str, dict[str, Any]] = {}
        # Copied in one step each (the workers add models meanwhile), then deduplicated in order.
        for model in dict.fromkeys([*self._first_row_ns, *self._sizes]):
            sizes = self._sizes.get(model)
            if sizes is None:
                shown[model] = {
                    "first_row_ms": round(_value(self._first_row_ns, model, 0.0) / 1e6, 3),
                    "extra_row_ms": round(self.extra_row_ns(model) / 1e6, 3),
                }
            else:
                by_size = {str(size): round(cost / 1e6, 3) for size, cost in zip(sizes.sizes, sizes.costs_ns)}
                shown[model] = {"row_ms_by_elements": by_size, "past_largest": "line" if sizes.slope_ns else "guess"}
            if model in self._bound:
                shown[model]["bound_over_price"] = round(self._bound[model], 3)
        return shown

    def extra_row_ns(self, model: str) -> float:
        """What each row past the first adds to a call (the first row's cost until a batch is seen)."""
        return _value(self._extra_row_ns, model, _value(self._first_row_ns, model, 0.0))


@dataclass(frozen=True, slots=True)
class SizeCosts:
    """A size-priced model's row costs at the sizes measured lately, joined by straight lines, not one fitted
    line: costs are seldom linear, and the chord of a cost that grows ever faster lies above it, so the price
    errs high. Published whole by each observation: admission reads one reference, bisects SIZES_KEPT at most."""

    sizes: tuple[int, ...]  # a row's elements, ascending
    costs_ns: tuple[float, ...]  # what a row of each size adds to a call
    top_ns: float  # the dearest measured call
    slope_ns: float  # per element past the largest size, by the last two; 0: unknown

    @classmethod
    def of(cls, measured: dict[int, float]) -> SizeCosts:
        sizes = tuple(sorted(measured))
        costs = tuple(measured[size] for size in sizes)
        slope = (costs[-1] - costs[-2]) / (sizes[-1] - sizes[-2]) if len(sizes) > 1 else 0.0
        return cls(sizes, costs, max(costs), max(slope, 0.0))

    def estimate_ns(self, elements: int) -> int:
        """A row of `elements`: the smallest size's cost at or below it, else on the lines, else `beyond_ns`."""
        sizes, costs = self.sizes, self.costs_ns
        i = bisect_left(sizes, elements)
        if i == len(sizes):
            return self.beyond_ns(elements)
        if i == 0 or sizes[i] == elements:
            return int(costs[i])
        low, high = sizes[i - 1], sizes[i]
        return int(costs[i - 1] + (costs[i] - costs[i - 1]) * (elements - low) / (high - low))

    def beyond_ns(self, elements: int) -> int:
        """A row past the largest size: on the line through the two largest, never below the dearest cost. With
        no such line (one size, or costs that fell with size: noise), the geometric mean of the least and the most
        (in proportion to size) it can cost: a long deadline runs it once, to measure it; a short one sheds it."""
        largest = self.sizes[-1]
        if self.slope_ns:
            return int(max(self.costs_ns[-1] + self.slope_ns * (elements - largest), self.top_ns))
        return int(self.top_ns * math.sqrt(elements / largest))


@dataclass(slots=True)
class Average:
    """A running mean of the first 1/EWMA_WEIGHT observations, an exponential average after: a price from one
    slow call is corrected within a few calls, and later no call moves it by more than EWMA_WEIGHT of the gap."""

    value: float
    count: int = 1

    def add(self, sample: float) -> None:
        self.count += 1
        self.value += max(EWMA_WEIGHT, 1 / self.count) * (sample - self.value)


def _update(averages: dict[Key, Average], key: Key, value: float) -> None:
    current = averages.get(key)
    if current is None:
        averages[key] = Average(value)
    else:
        current.add(value)


def _value(averages: dict[Key, Average], key: Key, default: float) -> float:
    current = averages.get(key)
    return default if current is None else current.value
