"""What the daemon reports of itself: the stats op's figures, the status line systemd
shows, and a model's entry in the models op. Read from any thread (a loop answering an
op, the Prometheus endpoint's, the steering thread): each class's figures from its lane
as its own loop has taken it up, under the class's stats lock."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from edged.backends.host_memory import rss_bytes
from edged.models.repository import ModelEntry

if TYPE_CHECKING:
    from edged.daemon.loading import Loaded
    from edged.serve.dispatch import Serving


def figures(serving: Serving) -> dict[str, Any]:
    """The stats op's figures: each class's from its lane, the daemon's counts summed."""
    dispatchers = serving.dispatchers.values()
    classes = {}
    for name, dispatcher in serving.dispatchers.items():
        loaded = dispatcher.loaded
        if loaded is None:
            continue
        lane = loaded.lanes[name]
        class_figures = lane.stats.snapshot(lane.backlog.depth)
        class_figures["prices"] = lane.service.prices()
        handoff_ns = dispatcher.loop.handoff_ns if dispatcher.loop is not None else 0.0
        class_figures["handoff_us"] = round(handoff_ns / 1000, 1)
        class_figures["pace"] = {"now": round(lane.backlog.pace, 3), "after_idle": round(lane.backlog.starting_pace, 3)}
        shortest_ms = dispatcher.deadlines.shortest_ms
        class_figures["inline_max_us"] = lane.inline_cap.limit_ns(handoff_ns, read_ms=shortest_ms) // 1000
        class_figures["loop_deadline_ms"] = shortest_ms
        if (loop := dispatcher.loop) is not None:
            class_figures["spin_us"] = loop.spin.length_ns(time.monotonic_ns()) // 1000
            class_figures["arrival_gap_us"] = round(loop.spin.gap_ns / 1000, 1)
            class_figures["spins"] = loop.spin.spins
        class_figures["memory_bytes"] = loaded.memory.lane_bytes.get(name)
        if (reservation := loaded.reservations.get(name)) is not None:
            class_figures["gpu"] = reservation.to_wire()
        classes[name] = class_figures
    newest = max(dispatchers, key=lambda d: d.generation).loaded
    weights = newest.memory.weights if newest else {}
    return {
        "state": serving.lifecycle.reported,
        "invalid": sum(d.invalid for d in dispatchers),
        "unroutable": sum(d.loop.unroutable for d in dispatchers if d.loop is not None),
        "memory": {"rss_bytes": rss_bytes(), "weights": {model: w.to_wire() for model, w in weights.items()}},
        "shm": serving.regions.figures(),
        "classes": classes,
    }


def status_line(serving: Serving) -> str:
    """One line for systemd's status: the state, then each class's counts and p99. Not made from
    `figures`: that reads the RSS, which can fail (out of descriptors), and this runs on the steering thread."""
    parts = []
    for name, dispatcher in serving.dispatchers.items():
        if dispatcher.loaded is None:
            continue
        lane = dispatcher.loaded.lanes[name]
        snapshot = lane.stats.snapshot(lane.backlog.depth)
        shed, p99 = sum(snapshot["shed"].values()), snapshot["latency_us"]["total"]["p99"]
        parts.append(f"{name} {snapshot['completed']} ok, {shed} shed, p99 {p99} us")
    return f"{serving.lifecycle.reported}: " + "; ".join(parts)


def model_wire(model: ModelEntry, loaded: Loaded, memory: bool) -> dict[str, Any]:
    wire = model.to_wire()
    # Asked for: the entries stay the five keys docs/protocol.md promises to a plain request.
    weights = loaded.memory.weights.get(model.name) if memory else None
    if weights is not None:
        wire["weights"] = weights.to_wire()
    if loaded.reservations and model.pipeline is None:
        wire["gpu_memory"] = {
            klass: {
                **next(m.to_wire() for m in reservation.models if m.model == model.name),
                "lane_measured_bytes": reservation.measured_bytes,
            }
            for klass, reservation in loaded.reservations.items()
        }
    return wire
