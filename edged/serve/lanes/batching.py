"""Jobs, and how several share one backend call: their inputs stack along the first dimension,
and each job gets its own rows of the outputs back as views, never copies.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edged.models.repository import ModelEntry
from edged.wire.codec import RequestId

if TYPE_CHECKING:
    from edged.serve.lanes.priced import Priced


@dataclass(slots=True)
class Job:
    """An admitted request as a lane sees it (built by Lane.offer); immutable but for `answered`."""

    route: Any  # opaque to the lane: where the transport sends the reply
    request_id: RequestId
    model: ModelEntry
    inputs: dict[str, np.ndarray]
    output_names: tuple[str, ...]
    received_ns: int
    deadline_ns: int
    cost_ns: int  # estimated service time, charged to the backlog until answered
    rows: int = 1  # its size along the batch dimension (Signature.rows)
    elements: int = 0  # its size, for a model priced by size (Signature.elements); else 0
    peer: bytes = b""  # who sent it, and the bytes its inputs hold, counted until it is answered
    nbytes: int = 0
    # Outputs to write into the client's shared memory (edged.shm.maps.Slot), by name.
    into: dict[str, Any] = field(default_factory=dict)
    # An input is in a client's device memory (edged.backends.DeviceTensor): never stacked.
    device: bool = False
    # A pipeline's step prices at admission, which its worker checks the time left against.
    priced: Priced | None = None
    # Admitted while a worker of its lane was idle: that worker's wake-up is part of its time.
    wakes: bool = False
    answered: bool = False  # written only by the lane's Answers, under its claim

    def fits_with(self, other: Job) -> bool:
        """Whether the two can share one batched backend call."""
        return (
            self.model is other.model
            and not (self.device or other.device)
            and all(array.shape[1:] == other.inputs[name].shape[1:] for name, array in self.inputs.items())
        )


def stack(jobs: list[Job]) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """The inputs and output names of one backend call for `jobs` (one job: its own, uncopied)."""
    if len(jobs) == 1:
        return jobs[0].inputs, jobs[0].output_names
    inputs = {name: np.concatenate([job.inputs[name] for job in jobs]) for name in jobs[0].inputs}
    return inputs, jobs[0].model.signature.output_names


def named(names: Sequence[str], outputs: Sequence[Any]) -> dict[str, Any]:
    """A call's outputs by name. A runner that returns another count has a bug: raised, so the
    request is answered INTERNAL, not OK with an output missing."""
    if len(outputs) != len(names):
        raise ValueError(f"it returned {len(outputs)} outputs for the {len(names)} asked ({', '.join(names)})")
    return dict(zip(names, outputs))


def unstack(jobs: list[Job], names: tuple[str, ...], outputs: list[np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Each job's own outputs, in order, as views of the call's outputs; raises where a batched
    call's outputs do not hold one row per row asked (each job would get another's rows)."""
    produced = named(names, outputs)
    if len(jobs) == 1:
        return [produced]
    asked = sum(job.rows for job in jobs)
    if wrong := {name: len(array) for name, array in produced.items() if len(array) != asked}:
        raise ValueError(f"it returned {wrong} rows for a batch of {asked}")
    results, row = [], 0
    for job in jobs:
        rows = job.rows
        results.append({name: produced[name][row : row + rows] for name in job.output_names})
        row += rows
    return results


def fill(batch: list[Job], jobs: queue.SimpleQueue[Any], max_batch: int, wait_us: int, max_rows: int) -> Any:
    """Add compatible queued jobs to `batch`, up to `max_batch` jobs and `max_rows` rows; with
    `wait_us`, once more after waiting that long for others to come, or less: half the slack
    of the job in hand with the least (the other half covers waking, and the run's spread).
    Returns the item that did not fit, if any."""
    held = _take_queued(batch, jobs, max_batch, max_rows)
    if held is None and wait_us and len(batch) < max_batch:
        slack_ns = min(job.deadline_ns - job.cost_ns for job in batch) - time.monotonic_ns()
        wait_ns = min(wait_us * 1000, slack_ns // 2)
        if wait_ns > 0:
            # A sleep, not SimpleQueue.get(timeout=...): in CPython 3.11 that blocks until the next
            # put when its deadline passes inside the call, and a lane that looks stopped gets none.
            time.sleep(wait_ns / 1e9)
            held = _take_queued(batch, jobs, max_batch, max_rows)
    return held


def _take_queued(batch: list[Job], jobs: queue.SimpleQueue[Any], max_batch: int, max_rows: int) -> Any:
    rows = sum(job.rows for job in batch)
    while len(batch) < max_batch and not jobs.empty():  # a latency class's common case: no raised Empty
        try:
            item = jobs.get_nowait()  # Empty still, where another worker of the lane took it first
        except queue.Empty:
            return None
        if not isinstance(item, Job) or not item.fits_with(batch[0]) or rows + item.rows > max_rows:
            return item
        batch.append(item)
        rows += item.rows
    return None
