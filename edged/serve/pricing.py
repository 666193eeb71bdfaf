"""Prices: what a backend call of each model costs on one lane with its core (or its
device) to itself, learned live, for admission (edged.serve.admission) to weigh a
request against its deadline, at the lane's measured pace."""

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

# Weight of the newest observation in the service-time average, once it holds
# 1/EWMA_WEIGHT of them: heavy enough to follow a change of load within a few dozen
# requests, light enough to ignore one outlier (see Average).
EWMA_WEIGHT = 0.1

# A bound (`ServiceTimes.bound_ns`) is the second-dearest of a pipeline's last RUNS_KEPT
# runs, relative to their price: at most one in two hundred passed it (their 99.5th
# percentile), and one stalled run moves it nothing. A mean and a few deviations would
# not do, for a pipeline's runs have a long tail (light-chain, on a quiet 2-core box:
# p99 3.3 times its p50, its mean absolute deviation a tenth of its mean); nor the 99th
# percentile of 100 runs, too noisy an estimate: admitted in the moments it dipped, 1.4%
# expired (bench/pipeline_deadlines.py, 2026-11-27).
RUNS_KEPT = 200
# The most one run counts, relative to its price: a pipeline warmed up cheap (priced at
# next to nothing on zeros) whose first real run takes 300 ms would otherwise be bounded
# at thousands of times its price, and shed from every deadline short of that, never to
# run again and replace that run.
MAX_OVER_PRICE = 5.0

# Input sizes remembered per size-priced model, the least recently seen dropped first:
# enough for a few image or chunk sizes in rotation, few enough to republish per call.
SIZES_KEPT = 8

Key = TypeVar("Key", str, int)


def price_clock(runner: Runner) -> Callable[[], int]:
    """The clock a call of `runner` is priced by, in ns: the calling thread's CPU time
    where the call computes on that thread alone, else the wall's. A price is what a call
    costs with a core to itself; how much of one the lane gets is its pace, measured apart:
    priced by the wall, a starved lane's slowness was counted twice (docs/models.md,
    "What a request costs")."""
    return time.thread_time_ns if computes_on_caller(runner) else time.perf_counter_ns


class ServiceTimes:
    """What a backend call of each model costs on one lane (by `price_clock`), learned live.

    A call costs a first row plus each further row: priced per request, a few
    large batches would make every small request look expensive. A model whose cost
    follows its input's size (`Signature.sized`) is priced per row too, each row at
    what a row of its size costs, from the sizes measured (SizeCosts): per row, so
    that a batch of four small images and one image four times their size, equal in
    elements, are not taken for one size. Owned by a Lane: its workers, and its loop's
    thread for the calls it runs itself, write it, each observation under the lock;
    `Lane.offer` reads single values and the published SizeCosts, without it.
    """

    def __init__(self) -> None:
        self._first_row_ns: dict[str, Average] = {}
        self._extra_row_ns: dict[str, Average] = {}
        self._measured: dict[str, dict[int, Average]] = {}  # by model: elements -> call ns; workers only
        self._sizes: dict[str, SizeCosts] = {}  # by model: what admission reads, replaced whole
        self._runs: dict[str, deque[float]] = {}  # by pipeline: its last runs, relative to their price; workers only
        self._bound: dict[str, float] = {}  # by pipeline: the second-dearest of those (bound_ns)
        self._lock = threading.Lock()  # between its writers: the lane's workers and the loop's thread

    def observe(self, model: str, call_ns: int, rows: int, elements: int = 0) -> None:
        """A call of `rows` rows took `call_ns`; `elements`: its inputs' size, for a size-priced model."""
        # Every averaging is a read, then a write: without the lock, a switch of the GIL
        # between the two loses the other writer's sample.
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
        """`observe`, and how the run compares with its price, for `bound_ns`: a pipeline's
        served runs (not its warm-up's, whose first is cold and which no hand-off precedes)."""
        expected = self.charge_ns(model, rows, elements)
        if expected > 0:
            with self._lock:
                runs = self._runs.setdefault(model, deque(maxlen=RUNS_KEPT))
                runs.append(min(call_ns / expected, MAX_OVER_PRICE))
                self._bound[model] = heapq.nlargest(2, runs)[-1]
        self.observe(model, call_ns, rows, elements)

    def estimate_ns(self, model: str, rows: int = 1) -> int:
        return int(_value(self._first_row_ns, model, 0.0) + (rows - 1) * self.extra_row_ns(model))

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
        return int(rows * max(_value(self._first_row_ns, model, 0.0), self.extra_row_ns(model)))

    def bound_ns(self, model: str, rows: int, elements: int = 0) -> int:
        """What a pipeline's run costs at most, but rarely: its price times what its last
        runs stayed within, relative to theirs (see RUNS_KEPT); its price alone until one is measured."""
        return int(self.charge_ns(model, rows, elements) * max(self._bound.get(model, 1.0), 1.0))

    def measured(self, model: str, rows: int, elements: int) -> bool:
        """Whether a request is priced from measurements rather than extrapolated: its
        rows no larger than a size measured (always, for a model priced per row alone)."""
        if not elements:
            return True
        sizes = self._sizes.get(model)
        return sizes is not None and elements // max(rows, 1) <= sizes.sizes[-1]

    def prices(self) -> dict[str, dict[str, Any]]:
        """What the lane charges, by model, as the stats op shows it (any thread): per
        row by size for a size-priced model, with how a larger size is priced
        ("line": through the two largest measured; "guess": see SizeCosts.beyond_ns);
        else a call's first row and each further row; for a pipeline, `bound_over_price`: what
        its last runs stayed within, relative to their price (`bound_ns`)."""
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
            if model in self._bound:  # a pipeline's: what its bound keeps in hand
                shown[model]["bound_over_price"] = round(self._bound[model], 3)
        return shown

    def extra_row_ns(self, model: str) -> float:
        """What each row past the first adds to a call (the first row's cost until a batch is seen)."""
        return _value(self._extra_row_ns, model, _value(self._first_row_ns, model, 0.0))


@dataclass(frozen=True, slots=True)
class SizeCosts:
    """A size-priced model's call times at the sizes measured lately, joined by
    straight lines: a fixed part plus a part per element between each two sizes.

    Lines rather than one fitted line: a model's cost is seldom exactly linear (the
    OCR detector's grows faster than its pixels), and the chord of a cost that grows
    ever faster lies above it, so a size between two measured ones is priced high
    rather than low. Past the largest size, see `beyond_ns`. Published whole by each observation: admission reads one
    reference and bisects at most SIZES_KEPT sizes, a bounded constant of work.
    """

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
        """A row of `elements` elements: at or below the smallest size its cost, between
        two sizes on their line; past the largest, `beyond_ns`."""
        sizes, costs = self.sizes, self.costs_ns
        i = bisect_left(sizes, elements)
        if i == len(sizes):
            return self.beyond_ns(elements)
        if i == 0 or sizes[i] == elements:
            return int(costs[i])
        low, high = sizes[i - 1], sizes[i]
        return int(costs[i - 1] + (costs[i] - costs[i - 1]) * (elements - low) / (high - low))

    def beyond_ns(self, elements: int) -> int:
        """A row larger than any measured, never below the dearest cost measured: on the
        line through the two largest sizes, extended. With one size (or two whose costs
        fell with size: noise), a guess between the least it can cost and the most (that
        cost in proportion to size): their geometric mean, the cost times the square root
        of the size ratio, which runs a size once in a long deadline, so that it is
        measured, and sheds it from a short one (docs/models.md, "What a request costs")."""
        largest = self.sizes[-1]
        if self.slope_ns:
            return int(max(self.costs_ns[-1] + self.slope_ns * (elements - largest), self.top_ns))
        return int(self.top_ns * math.sqrt(elements / largest))


@dataclass(slots=True)
class Average:
    """A running mean of the first 1/EWMA_WEIGHT observations, an exponential average
    after: the first calls of a size each count equally, so a price from one slow call
    (or a guess's first run) is corrected within a few calls, and later no single call
    moves it by more than EWMA_WEIGHT of its difference."""

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
