"""What each lane holds on the GPU: planned before anything is allocated, then measured.

The plan is arithmetic over the config and the model signatures, so it is tested on
any machine. Per lane worker and per model, a GPU backend holds:
- device buffers for every input and output at the class's largest batch;
- as much pinned host memory, to stage them;
- its memory arena, which ONNX Runtime grows as it needs and which holds the
  session's copy of the weights (sessions do not share them). With the lane's
  `arena_cap_mb` split between its sessions (`gpu_mem_limit`), the plan counts the
  cap; uncapped, it counts the weights (the size of the model file) and says that
  the arena grows past them.
Nothing is held back by the plan: it is a check, before loading, that the lanes can
fit. What they really take (arenas grown by warm-up at the largest batch, workspaces,
CUDA graphs, the runtime's handles) is measured afterwards, lane by lane, as the
drop in the device's free memory (`cudaMemGetInfo`), and must leave
`server.gpu_headroom_mb` free (`check_measured`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry
from edged.wire.codec import DTYPES, TensorSpec

MIB = 1024 * 1024
LOWER = "lower classes.*.arena_cap_mb, max_batch or workers, or serve fewer models"


class ReservationError(ValueError):
    """A model or a set of lanes that cannot be given fixed GPU buffers; says why."""


@dataclass(frozen=True, slots=True)
class ModelReservation:
    """What one lane holds for one model, over all its workers."""

    model: str
    sessions: int  # one per worker, and one for the inline path where the class has one
    io_bytes: int  # device buffers per session (the same again is pinned on the host)
    weights_bytes: int  # per session, estimated; inside the arena
    arena_limit_bytes: int  # per session; 0: uncapped

    @property
    def device_bytes(self) -> int:
        # A capped arena holds the weights: the cap is counted, not the weights again.
        return self.sessions * (self.io_bytes + (self.arena_limit_bytes or self.weights_bytes))

    @property
    def pinned_bytes(self) -> int:
        return self.sessions * self.io_bytes

    def to_wire(self) -> dict[str, int]:
        return {
            "planned_bytes": self.device_bytes,
            "pinned_bytes": self.pinned_bytes,
            "io_bytes_per_worker": self.io_bytes,
            "weights_bytes_per_worker": self.weights_bytes,
            "arena_limit_bytes_per_worker": self.arena_limit_bytes,
        }


@dataclass(frozen=True, slots=True)
class LaneReservation:
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
        arena = "" if self.arena_capped else " (arenas uncapped: arena_cap_mb = 0)"
        measured = "" if self.measured_bytes is None else f", measured {mib(self.measured_bytes)}"
        return (
            f"lane {self.klass}: stream priority {self.stream_priority}, planned {mib(self.device_bytes)} on the "
            f"GPU{arena}{measured}, {mib(self.pinned_bytes)} pinned on the host"
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


def lane_reservation(klass: ClassConfig, models: Sequence[ModelEntry], weights: dict[str, int]) -> LaneReservation:
    """What the lane of `klass` reserves for `models`; `weights` gives each model's bytes."""
    # The inline path (inline_max_us) loads sessions of its own, for the socket loop.
    per_model = klass.workers + (1 if klass.inline_max_us else 0)
    sessions = per_model * len(models)
    arena = klass.arena_cap_mb * MIB // sessions if klass.arena_cap_mb else 0
    return LaneReservation(
        klass.name,
        klass.stream_priority,
        tuple(
            ModelReservation(m.name, per_model, io_bytes(m, klass.max_batch), weights[m.name], arena) for m in models
        ),
        arena_capped=arena > 0,
    )


def reserve_lanes(
    models: Sequence[ModelEntry], classes: Sequence[ClassConfig], free_bytes: int, device: str
) -> dict[str, LaneReservation]:
    """Every class's lane reservation, by class; refused whole when they exceed `free_bytes`."""
    weights = {model.name: model.variant.path.stat().st_size for model in models}
    plans = {klass.name: lane_reservation(klass, models, weights) for klass in classes}
    check_fits(list(plans.values()), free_bytes, device)
    return plans


def check_fits(lanes: Sequence[LaneReservation], free_bytes: int, device: str) -> None:
    """Refuse a set of lanes whose plans exceed the GPU's free memory."""
    total = sum(lane.device_bytes for lane in lanes)
    if total > free_bytes:
        each = ", ".join(f"{lane.klass} {mib(lane.device_bytes)}" for lane in lanes)
        raise ReservationError(
            f"the lanes would take {mib(total)} of GPU memory ({each}) but {device} has {mib(free_bytes)} free: {LOWER}"
        )


def check_measured(lanes: Sequence[LaneReservation], free_before: int, headroom_bytes: int, device: str) -> None:
    """Refuse a set of loaded lanes that left less than `headroom_bytes` of the `free_before`
    bytes free: what grows after warm-up (an uncapped arena, a reload's lanes) would not fit."""
    total = sum(lane.measured_bytes or 0 for lane in lanes)
    left = free_before - total
    if left < headroom_bytes:
        each = ", ".join(f"{lane.klass} {mib(lane.measured_bytes or 0)}" for lane in lanes)
        raise ReservationError(
            f"loaded and warmed, the lanes took {mib(total)} of GPU memory ({each}), leaving {mib(left)} of "
            f"the {mib(free_before)} {device} had free, less than server.gpu_headroom_mb = {headroom_bytes // MIB}: "
            f"{LOWER}, or lower server.gpu_headroom_mb"
        )
