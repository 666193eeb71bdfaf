"""What each lane holds on the GPU: planned before anything is allocated, then measured.

The plan is arithmetic over the config and the model signatures, so it is tested on
any machine. Each model's weights are held once on the device, whatever the number of
its lanes (edged.backends.shared), and planned with the model (edged.backends.shared.
Weights: only the copies not held already, so a reload that changes nothing plans none
and a replaced file plans one beside the old). Per lane worker and per model, a GPU
backend holds beyond them:
- device buffers for every input and output at the class's largest batch;
- as much pinned host memory, to stage them;
- its activation memory: ONNX Runtime's arena, which it grows as it needs. With the
  lane's `arena_cap_mb` split between its sessions (`gpu_mem_limit`), the plan counts
  the cap; uncapped, nothing, and it says that the arena grows at warm-up.
Nothing is held back by the plan: it is a check, before loading, that the weights and
the lanes can fit. What they really take is measured afterwards, the weights first and
alone, then lane by lane, as the drop in the device's free memory (`cudaMemGetInfo`),
and must leave `server.gpu_headroom_mb` free (`check_measured`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edged.backends.shared import Weights
from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry
from edged.wire.codec import DTYPES, TensorSpec

MIB = 1024 * 1024
LOWER = "lower classes.*.arena_cap_mb, max_batch or workers, or serve fewer models"


class ReservationError(ValueError):
    """A model or a set of lanes that cannot be given fixed GPU buffers; says why."""


@dataclass(frozen=True, slots=True)
class ModelReservation:
    """What one lane holds for one model, over all its workers, beside the model's weights."""

    model: str
    sessions: int  # one per worker, and one for the inline path where the class has one
    io_bytes: int  # device buffers per session (the same again is pinned on the host)
    arena_limit_bytes: int  # per session: its activation memory's cap; 0: uncapped

    @property
    def device_bytes(self) -> int:
        return self.sessions * (self.io_bytes + self.arena_limit_bytes)

    @property
    def pinned_bytes(self) -> int:
        return self.sessions * self.io_bytes

    def to_wire(self) -> dict[str, int]:
        return {
            "sessions": self.sessions,
            "planned_bytes": self.device_bytes,
            "pinned_bytes": self.pinned_bytes,
            "io_bytes_per_worker": self.io_bytes,
            "arena_limit_bytes_per_worker": self.arena_limit_bytes,
        }


@dataclass(frozen=True, slots=True)
class LaneReservation:
    """A lane's own device memory: its buffers and arenas, never its models' weights."""

    klass: str
    stream_priority: int
    models: tuple[ModelReservation, ...]
    arena_capped: bool
    measured_bytes: int | None = None  # the drop in free device memory while the lane loaded and warmed
    # The process's one-time share, measured once before any lane with a throwaway session
    # (the same figure on every lane, counted in none of their measured_bytes).
    context_bytes: int | None = None

    @property
    def device_bytes(self) -> int:
        return sum(m.device_bytes for m in self.models)

    @property
    def pinned_bytes(self) -> int:
        return sum(m.pinned_bytes for m in self.models)

    def describe(self) -> str:
        arena = "" if self.arena_capped else " (arenas uncapped: arena_cap_mb = 0, they grow at warm-up)"
        measured = "" if self.measured_bytes is None else f", measured {mib(self.measured_bytes)}"
        return (
            f"lane {self.klass}: stream priority {self.stream_priority}, planned {mib(self.device_bytes)} on the "
            f"GPU beside the weights{arena}{measured}, {mib(self.pinned_bytes)} pinned on the host"
        )

    def to_wire(self) -> dict[str, int | bool | None]:
        return {
            "stream_priority": self.stream_priority,
            "planned_bytes": self.device_bytes,
            "measured_bytes": self.measured_bytes,
            "context_bytes": self.context_bytes,
            "pinned_bytes": self.pinned_bytes,
            "arena_capped": self.arena_capped,
        }


def mib(nbytes: int) -> str:
    return f"{nbytes / MIB:.1f} MiB"


def fixed_shape(model: ModelEntry, spec: TensorSpec, rows: int) -> tuple[int, ...]:
    """The tensor's shape at `rows` rows; a dynamic dimension other than the batch is refused,
    since its buffer could not be sized before the first request."""
    dims = model.signature.shape_at(spec, rows)
    if any(d < 0 for d in dims):
        raise ReservationError(
            f"model {model.name}: {spec.name} has shape {list(spec.shape)}, with a dynamic dimension besides "
            "the batch; the CUDA backend preallocates every buffer, so it serves only models whose other "
            "dimensions are fixed"
        )
    return dims


def io_bytes(model: ModelEntry, rows: int) -> int:
    """Bytes of every input and output of `model` at `rows` rows."""
    signature = model.signature
    return sum(
        math.prod(fixed_shape(model, spec, rows)) * np.dtype(DTYPES[spec.dtype]).itemsize
        for spec in signature.inputs + signature.outputs
    )


def lane_reservation(klass: ClassConfig, models: Sequence[ModelEntry]) -> LaneReservation:
    """What the lane of `klass` reserves for `models`, beyond their weights."""
    # The inline path (inline_max_us) loads sessions of its own, for the class's loop.
    per_model = klass.workers + (1 if klass.runs_inline else 0)
    sessions = per_model * len(models)
    arena = klass.arena_cap_mb * MIB // sessions if klass.arena_cap_mb else 0
    return LaneReservation(
        klass.name,
        klass.stream_priority,
        tuple(ModelReservation(m.name, per_model, io_bytes(m, klass.max_batch), arena) for m in models),
        arena_capped=arena > 0,
    )


def reserve_lanes(
    models: Sequence[ModelEntry],
    classes: Sequence[ClassConfig],
    free_bytes: int,
    device: str,
    weights: Sequence[Weights] = (),
) -> dict[str, LaneReservation]:
    """Every class's lane reservation, by class; refused whole when they and the models'
    new `weights` exceed `free_bytes`."""
    plans = {klass.name: lane_reservation(klass, models) for klass in classes}
    check_fits(list(plans.values()), free_bytes, device, weights)
    return plans


def check_fits(lanes: Sequence[LaneReservation], free_bytes: int, device: str, weights: Sequence[Weights] = ()) -> None:
    """Refuse a set of lanes whose plans, with the weights they need loaded, exceed the GPU's free memory."""
    new = [w for w in weights if w.planned_bytes]
    total = sum(lane.device_bytes for lane in lanes) + sum(w.planned_bytes for w in new)
    if total > free_bytes:
        each = ", ".join(f"{lane.klass} {mib(lane.device_bytes)}" for lane in lanes)
        loaded = "".join(f", model {w.model}'s weights {mib(w.planned_bytes)}" for w in new)
        raise ReservationError(
            f"the lanes would take {mib(total)} of GPU memory (lane {each}{loaded}) but {device} has "
            f"{mib(free_bytes)} free: {LOWER}"
        )


def check_measured(
    lanes: Sequence[LaneReservation], free_before: int, headroom_bytes: int, device: str, weights_bytes: int = 0
) -> None:
    """Refuse a set of loaded lanes that, with the `weights_bytes` their models' weights took,
    left less than `headroom_bytes` of the `free_before` bytes free: what grows after warm-up
    (an uncapped arena, a reload's lanes) would not fit."""
    total = sum(lane.measured_bytes or 0 for lane in lanes) + weights_bytes
    left = free_before - total
    if left < headroom_bytes:
        each = ", ".join(f"{lane.klass} {mib(lane.measured_bytes or 0)}" for lane in lanes)
        raise ReservationError(
            f"loaded and warmed, the lanes took {mib(total)} of GPU memory (lane {each}, the weights "
            f"{mib(weights_bytes)}), leaving {mib(left)} of the {mib(free_before)} {device} had free, less than "
            f"server.gpu_headroom_mb = {headroom_bytes // MIB}: {LOWER}, or lower server.gpu_headroom_mb"
        )
