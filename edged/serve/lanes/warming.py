"""Loading a model on a lane's thread and timing its calls: warm-up's, and a re-timing's
(edged.serve.lanes.worker). A price is the median of several calls, never one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edged.backends import Backend, Runner
from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry
from edged.models.warmup import load_failure, tiled, warmup_failure
from edged.serve.pricing import ServiceTimes, price_clock

WARMUP_RUNS = 5


def load_and_warm(backend: Backend, model: ModelEntry, klass: ClassConfig, service: ServiceTimes) -> Runner:
    """Load and warm `model`, seeding `service` with the median of WARMUP_RUNS - 1 timed calls
    per sample and batch size; a failure says which model, on what, and the fix."""
    try:
        runner = backend.load(model, klass)
    except Exception as exc:
        raise load_failure(model.name, model.variant.path, exc) from exc
    for sample in model.samples:
        for inputs, rows in tiled(sample, model.signature, klass.max_batch):
            try:
                runner.run(inputs, model.signature.output_names)
                elapsed = time_calls(runner, model, inputs)
            except Exception as exc:
                runner.close()
                given = bool(model.warmup)
                raise warmup_failure(model.name, model.signature, sample, model.manifest, given, exc) from exc
            service.observe(model.name, elapsed, rows, model.signature.elements(inputs))
    return runner


def time_calls(
    runner: Runner, model: ModelEntry, inputs: dict[str, Any], before: Callable[[], None] = lambda: None
) -> int:
    """Median of WARMUP_RUNS - 1 calls by the price clock, `before` called before each: one call
    would carry any hiccup into the price."""
    clock, times = price_clock(runner), []
    for _ in range(WARMUP_RUNS - 1):
        before()
        start = clock()
        runner.run(inputs, model.signature.output_names)
        times.append(clock() - start)
    return sorted(times)[len(times) // 2]
