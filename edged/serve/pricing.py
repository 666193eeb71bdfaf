"""Prices: how long a backend call of each model takes on one lane, learned live,
for admission (edged.serve.admission) to weigh a request against its deadline."""

from __future__ import annotations

import threading
from bisect import bisect_left
from dataclasses import dataclass
from typing import TypeVar

# Weight of the newest observation in the service-time average: heavy enough to
# follow a change of load within a few dozen requests, light enough to ignore one outlier.
EWMA_WEIGHT = 0.1

# Input sizes remembered per size-priced model, the least recently seen dropped first:
# enough for a few image or chunk sizes in rotation, few enough to republish per call.
SIZES_KEPT = 8

Key = TypeVar("Key", str, int)


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
