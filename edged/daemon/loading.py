"""The loader: warm lanes built for a configuration, off every serving thread. It runs on
its own thread at start-up and on SIGHUP, and writes nothing a loop reads: it returns what
it built, which the steering thread hands to the loops to take up between requests."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from edged.backends import (
    VARIANTS_OF,
    Backend,
    Describing,
    DeviceMemory,
    OpeningIpc,
    Reserving,
    SharingWeights,
    backend_named,
    fixed_rows,
)
from edged.backends.gpu_memory import MIB, LaneReservation, check_measured, mib
from edged.backends.host_memory import check_lane, check_weights, rss_bytes, trim
from edged.backends.shared import MemoryPlan, Weights, WeightsHold
from edged.config import Config
from edged.models.pipeline import PipelineError
from edged.models.pipeline_manifest import discover_pipelines
from edged.models.repository import ModelEntry, RepositoryError, discover, scan, unreadable_file
from edged.models.warmup import ModelFailure, one_size_warning
from edged.serve.contention import Contention
from edged.serve.lanes.lane import Lane
from edged.serve.lanes.precedence import Precedence
from edged.serve.pending import PendingBytes
from edged.serve.stats import ClassStats

log = logging.getLogger("edged")


@dataclass(frozen=True, slots=True)
class Loaded:
    """What the loader built: one generation of lanes."""

    config: Config
    models: list[ModelEntry]
    lanes: dict[str, Lane]
    reservations: dict[str, LaneReservation]
    memory: MemoryPlan
    fixed_rows: bool  # the backend's buffers hold max_batch rows: larger requests are refused
    seconds: float
    failed: dict[str, str]  # by model: why it failed to load or warm up (server.on_model_failure = "skip")
    # The backend's way to open a client's CUDA IPC region; None on a backend with no GPU.
    open_ipc: Callable[[bytes, int], DeviceMemory] | None = None

    @property
    def served(self) -> str:
        return f"{', '.join(m.name for m in self.models)} with classes {', '.join(self.lanes)}"


def load(
    read_config: Callable[[], Config],
    stats: dict[str, ClassStats],
    pending: PendingBytes,
    contention: Contention,
) -> Loaded:
    """Build warm lanes for the configuration `read_config` gives; raises what stops them.
    A reloaded lane keeps its class's counters (`stats`): figures never jump back to zero."""
    started = time.monotonic()
    config = read_config()
    variants = VARIANTS_OF.get(config.backend, config.backend)
    failed: dict[str, str] = {}

    def fail(exc: ModelFailure) -> None:
        if config.on_model_failure == "stop":
            raise ModelFailure(
                exc.model, f'{exc} (or set server.on_model_failure = "skip" to serve the other models)'
            ) from None
        log.error("not serving %s: %s", exc.model, exc)
        failed[exc.model] = str(exc)

    def drop(exc: ModelFailure) -> None:
        """Serve on without `exc.model` and the pipelines that run it; raises once no model is left."""
        nonlocal models, pipelines
        fail(exc)
        models = [model for model in models if model.name != exc.model]
        pipelines = _without(pipelines, exc.model, fail)
        if not models:
            raise RepositoryError(f"every model failed to load or warm up: {failed}") from None

    folders = scan(config.model_repository)
    for folder, why in folders.unreadable.items():
        fail(ModelFailure(folder, why))
    # A pipeline is named by its folder: server.models may list it as it lists a model.
    pipeline_files = [path for path in folders.pipelines if not config.models or path.parent.name in config.models]
    named = {path.parent.name for path in pipeline_files}
    models = discover(config.model_repository, variants, tuple(n for n in config.models if n not in named), folders)
    for model in models:
        if warning := one_size_warning(model.name, model.signature, model.samples, model.manifest):
            log.warning("%s", warning)
    pipelines = discover_pipelines(pipeline_files, models, fail)
    # A reload reuses an unchanged file's weights without reading it: refuse what a restart would fail on.
    unreadable = {model.name: why for model in models if (why := unreadable_file(model))}
    for name, why in unreadable.items():
        drop(ModelFailure(name, f"model {name!r}: {why}"))
    backend = backend_named(config.backend, config.fallback)
    while True:
        try:
            reservations, memory, lanes = _start_lanes(config, models, pipelines, backend, stats, pending, contention)
            break
        except ModelFailure as exc:
            drop(exc)
    if isinstance(backend, Describing):
        models = [replace(model, served=served) if (served := backend.describe(model)) else model for model in models]
    seconds = time.monotonic() - started
    open_ipc = backend.open_ipc if isinstance(backend, OpeningIpc) else None
    served = [*models, *pipelines]
    return Loaded(config, served, lanes, reservations, memory, fixed_rows(backend), seconds, failed, open_ipc)


def _without(pipelines: list[ModelEntry], failed: str, fail: Callable[[ModelFailure], None]) -> list[ModelEntry]:
    """The pipelines left without `failed` (a model or a pipeline); those that run it fail too."""
    kept = []
    for entry in pipelines:
        if entry.name == failed:
            continue
        if entry.pipeline is not None and failed in entry.pipeline.models:
            fail(PipelineError(entry.name, f"pipeline {entry.name!r} runs model {failed}, which is not served"))
            continue
        kept.append(entry)
    return kept


def _start_lanes(
    config: Config,
    models: list[ModelEntry],
    pipelines: list[ModelEntry],
    backend: Backend,
    stats: dict[str, ClassStats],
    pending: PendingBytes,
    contention: Contention,
) -> tuple[dict[str, LaneReservation], MemoryPlan, dict[str, Lane]]:
    """A warm lane per class, all or none; each model's weights are taken once, before any lane."""
    reserving = isinstance(backend, Reserving)
    context = backend.warm_context(models) if reserving else 0
    if reserving:
        log.info("the GPU context's one-time share: %s, counted in no lane", mib(context))
    free_before = backend.free_bytes() if reserving else 0
    # Checked before any lane allocates: a set of lanes that cannot fit is refused whole.
    reservations = backend.reserve(models, config.classes, free_before) if reserving else {}
    for reservation in reservations.values():
        log.info("%s", reservation.describe())
    sharing = isinstance(backend, SharingWeights)
    limit = config.memory_limit_mb * MIB
    if sharing and limit:
        check_weights([backend.weights_plan(m, config.classes) for m in models], config.classes, rss_bytes(), limit)
    holds: list[WeightsHold] = []
    lane_bytes: dict[str, int] = {}
    lanes: dict[str, Lane] = {}
    # One per generation of lanes: a reload's lanes do not yield to the ones they replace.
    precedence = Precedence()
    try:
        for model in models if sharing else ():
            holds.append(backend.hold_weights(model, config.classes))
            log.info("%s", describe_weights(holds[-1].weights))
        # The weights' share of the device, taken before any lane: no lane's figure counts them.
        free = backend.free_bytes() if reserving else 0
        weights_bytes = free_before - free
        for klass in config.classes:
            lane = Lane(klass, models, backend, stats.get(klass.name), precedence, pending, pipelines, contention)
            lanes[klass.name] = lane
            rss = trim()
            lane.start()
            after = trim()
            lane_bytes[klass.name] = max(0, after - rss)
            if limit:
                check_lane(klass.name, [m.name for m in models], after, limit)
            if reserving:
                # One lane at a time, so the drop in free memory is this lane's (on a reload, old arenas rarely move).
                before, free = free, backend.free_bytes()
                measured = replace(reservations[klass.name], measured_bytes=before - free, context_bytes=context)
                reservations[klass.name] = measured
                log.info("%s", measured.describe())
        if reserving:
            headroom = config.gpu_headroom_mb * MIB
            check_measured(list(reservations.values()), free_before, headroom, backend.device_name, weights_bytes)
    except BaseException:
        for lane in lanes.values():
            lane.crew.stop(timeout_s=1.0)
        raise
    finally:
        for hold in holds:
            hold.release()
    return reservations, MemoryPlan({h.weights.model: h.weights for h in holds}, lane_bytes), lanes


def describe_weights(weights: Weights) -> str:
    if not weights.copies:
        return f"model {weights.model}: no weights held for its lanes (they run it on another backend)"
    copies = f"{weights.copies} copies" if weights.copies > 1 else "1 copy"
    if not weights.new_copies:
        return f"model {weights.model}: weights reused, {copies} the serving lanes hold"
    beside = f", beside {weights.draining} of the replaced file until the old lanes drain" if weights.draining else ""
    return (
        f"model {weights.model}: weights loaded once for every lane, {copies} of {mib(weights.file_bytes)} "
        f"({weights.new_copies} new{beside}), taking {mib(weights.added_bytes or 0)} (RSS, or device memory on a GPU)"
    )
