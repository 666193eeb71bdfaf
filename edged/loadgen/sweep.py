"""`edged bench`: an open-loop load generator with a mix of classes.

Arrivals are Poisson per stream and latency is counted from each request's
*intended* send time, so a generator or daemon that falls behind shows up in
the figures instead of hiding (no coordinated omission). One thread sends and
receives on one poller: at the rates one Python process can offer, that keeps
the generator's own jitter far below a thread handoff.
"""

from __future__ import annotations

import random
import select
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import zmq

from edged.wire.codec import DTYPES, encode_request

STATUSES = ("OK", "OVERLOADED", "DEADLINE_EXCEEDED", "other")


@dataclass(frozen=True, slots=True)
class Stream:
    """One class's share of the load: CLASS:MODEL:RATE[:DEADLINE_MS[:ROWS]]."""

    klass: str
    model: str
    rate: float
    deadline_ms: float | None = None
    rows: int = 1

    @classmethod
    def parse(cls, text: str) -> Stream:
        parts = text.split(":")
        if not 3 <= len(parts) <= 5:
            raise ValueError(f"--mix takes CLASS:MODEL:RATE[:DEADLINE_MS[:ROWS]], got {text!r}")
        deadline = float(parts[3]) if len(parts) > 3 and parts[3] else None
        rows = int(parts[4]) if len(parts) > 4 else 1
        return cls(parts[0], parts[1], float(parts[2]), deadline, rows)

    def scaled(self, factor: float) -> Stream:
        return Stream(self.klass, self.model, self.rate * factor, self.deadline_ms, self.rows)


@dataclass
class StreamResult:
    stream: Stream
    sent: int = 0
    statuses: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    lost: int = 0
    duplicated: int = 0  # replies to a request already answered
    ok_latency_us: list[float] = field(default_factory=list)
    ok_in_daemon_us: list[int] = field(default_factory=list)  # the same replies' timing_us.total
    shed_in_daemon_us: list[int] = field(default_factory=list)
    send_lag_us: list[float] = field(default_factory=list)  # the generator's own lateness

    def summary(self, duration_s: float) -> dict[str, Any]:
        latencies = np.array(self.ok_latency_us) if self.ok_latency_us else np.zeros(1)
        shed = np.array(self.shed_in_daemon_us) if self.shed_in_daemon_us else np.zeros(1)
        inside = np.array(self.ok_in_daemon_us) if self.ok_in_daemon_us else np.zeros(1)
        return {
            "class": self.stream.klass,
            "model": self.stream.model,
            "offered_rps": self.stream.rate,
            "sent": self.sent,
            **{k.lower(): v for k, v in self.statuses.items()},
            "lost": self.lost,
            "duplicated": self.duplicated,
            "ok_fraction": self.statuses["OK"] / self.sent if self.sent else 0.0,
            "goodput_rps": self.statuses["OK"] / duration_s,
            "latency_us": {
                "p50": float(np.percentile(latencies, 50)),
                "p90": float(np.percentile(latencies, 90)),
                "p99": float(np.percentile(latencies, 99)),
                "p999": float(np.percentile(latencies, 99.9)),
                "max": float(latencies.max()),
            },
            # What the daemon's own span was of the OK replies: beside every round trip.
            "in_daemon_us": {"p50": float(np.percentile(inside, 50)), "p99": float(np.percentile(inside, 99))},
            "shed_in_daemon_us_p999": float(np.percentile(shed, 99.9)),
            "shed_in_daemon_us_max": int(shed.max()),
            "send_lag_us_p99": float(np.percentile(self.send_lag_us, 99)) if self.send_lag_us else 0.0,
        }


def run_load(
    endpoint: str,
    streams: list[Stream],
    model_inputs: dict[str, list[dict[str, Any]]],
    duration_s: float,
    lost_after_ms: float = 2000.0,
    progress: Callable[[str], None] | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Offer `streams` for `duration_s`; returns one summary per stream."""
    rng = random.Random(seed)
    payloads = [
        random_inputs(model_inputs[s.model], s.rows, np.random.default_rng(seed + i)) for i, s in enumerate(streams)
    ]
    results = [StreamResult(s) for s in streams]
    context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.linger = 0
    sock.connect(endpoint)
    fd = sock.getsockopt(zmq.FD)
    pending: dict[int, tuple[int, int]] = {}  # id -> (stream index, intended send ns)
    stream_of: list[int] = []  # by id - 1: the stream of every request sent
    start = time.perf_counter_ns()
    end = start + int(duration_s * 1e9)
    next_at = [start + int(rng.expovariate(s.rate) * 1e9) if s.rate > 0 else end for s in streams]
    next_id, next_progress = 1, start + 1_000_000_000
    try:
        while True:
            now = time.perf_counter_ns()
            for i, stream in enumerate(streams):
                while next_at[i] <= now and next_at[i] < end:
                    frames = encode_request(
                        next_id,
                        model=stream.model,
                        klass=stream.klass,
                        deadline_ms=stream.deadline_ms,
                        inputs=payloads[i],
                    )
                    sock.send_multipart(frames, copy=False)
                    pending[next_id] = (i, next_at[i])
                    stream_of.append(i)
                    results[i].sent += 1
                    results[i].send_lag_us.append((now - next_at[i]) / 1000)
                    next_id += 1
                    next_at[i] += int(rng.expovariate(stream.rate) * 1e9)
            if now >= end and (not pending or now - end > lost_after_ms * 1e6):
                break
            if sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                _receive(sock, pending, stream_of, results)
            else:
                # zmq.Poller counts in whole milliseconds, too coarse to send on time;
                # select on the socket's (edge-triggered) fd wakes within microseconds. Past the
                # last send, wake at the end, when the run may be over (every reply in, nothing
                # then wakes it), and after it when the replies still out count as lost.
                last_ns = end if now < end else end + int(lost_after_ms * 1e6)
                wait_ns = min([t for t in next_at if t < end], default=last_ns) - now
                select.select([fd], [], [], max(wait_ns, 0) / 1e9)
            if progress is not None and now >= next_progress:
                progress(_progress_line(now - start, results, len(pending)))
                next_progress += 1_000_000_000
    finally:
        sock.close(linger=0)
    for stream_index, _ in pending.values():
        results[stream_index].lost += 1
    return [result.summary(duration_s) for result in results]


def _receive(
    sock: zmq.Socket, pending: dict[int, tuple[int, int]], stream_of: list[int], results: list[StreamResult]
) -> None:
    while True:
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return
        done = time.perf_counter_ns()
        header = msgpack.unpackb(frames[0].buffer)
        request_id = header.get("id")
        entry = pending.pop(request_id, None)
        if entry is None:
            if isinstance(request_id, int) and 0 < request_id <= len(stream_of):
                results[stream_of[request_id - 1]].duplicated += 1
            continue
        index, intended = entry
        status = header.get("status")
        result = results[index]
        result.statuses[status if status in result.statuses else "other"] += 1
        if status == "OK":
            result.ok_latency_us.append((done - intended) / 1000)
            if "timing_us" in header:
                result.ok_in_daemon_us.append(header["timing_us"]["total"])
        elif status == "OVERLOADED" and "timing_us" in header:
            result.shed_in_daemon_us.append(header["timing_us"]["total"])


def random_inputs(specs: list[dict[str, Any]], rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Seeded inputs for a model's input specs, `rows` in every dynamic first dimension."""
    return {
        spec["name"]: rng.standard_normal(
            [rows if i == 0 and d == -1 else max(d, 1) for i, d in enumerate(spec["shape"])]
        ).astype(DTYPES[spec["dtype"]])
        for spec in specs
    }


def _progress_line(elapsed_ns: int, results: list[StreamResult], in_flight: int) -> str:
    parts = [f"{r.stream.klass}: {r.sent} sent, {r.statuses['OK']} ok" for r in results]
    return f"\r{elapsed_ns / 1e9:5.1f} s  {'; '.join(parts)}; {in_flight} in flight"


def format_table(rows: list[dict[str, Any]]) -> str:
    """A terminal table of run_load summaries: latencies of OK replies in ms, and beside
    them the daemon's own span of the same replies (`timing_us.total`)."""
    header = (
        f"{'class':<10} {'model':<11} {'offered/s':>9} {'sent':>7} {'ok':>7} {'shed':>6} {'expired':>7} "
        f"{'other':>5} {'lost':>4} {'twice':>5} {'good/s':>8} {'p50':>7} {'p90':>7} {'p99':>7} {'p99.9':>7} "
        f"{'in p50':>7} {'in p99':>7}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        lat, inside = row["latency_us"], row["in_daemon_us"]
        lines.append(
            f"{row['class']:<10} {row['model']:<11} {row['offered_rps']:>9.0f} {row['sent']:>7} {row['ok']:>7} "
            f"{row['overloaded']:>6} {row['deadline_exceeded']:>7} {row['other']:>5} {row['lost']:>4} "
            f"{row['duplicated']:>5} {row['goodput_rps']:>8.1f} "
            + " ".join(f"{lat[k] / 1000:>7.2f}" for k in ("p50", "p90", "p99", "p999"))
            + "".join(f" {inside[k] / 1000:>7.2f}" for k in ("p50", "p99"))
        )
    return (
        "\n".join(lines) + "\n(latency percentiles of OK replies in ms, from the intended send time; "
        "'in': the same replies' time inside the daemon, timing_us.total; 'twice': second replies to a request)"
    )


def progress_to_stderr(line: str) -> None:
    """A terminal redraws one line in place (a carriage return starts each); a file or a
    pipe, where carriage returns would run every line into one, gets each on its own."""
    if not sys.stderr.isatty():
        line = line.lstrip("\r")
        if not line.strip():
            return  # the newline that ends a step's redrawn line
        line = line if line.endswith("\n") else line + "\n"
    sys.stderr.write(line)
    sys.stderr.flush()


def run_sweep(
    endpoint: str,
    streams: list[Stream],
    factors: list[float],
    duration_s: float,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """run_load once per factor, each stream's rate scaled by it; one entry per step."""
    from edged.client import Client

    with Client(endpoint) as client:
        model_inputs = {model["name"]: model["inputs"] for model in client.models()}
    if unknown := sorted({stream.model for stream in streams} - set(model_inputs)):
        raise ValueError(f"--mix names {unknown}, which the daemon does not serve: it serves {sorted(model_inputs)}")
    steps = []
    for factor in factors:
        scaled = [stream.scaled(factor) for stream in streams]
        rows = run_load(endpoint, scaled, model_inputs, duration_s, progress=progress)
        if progress is not None:
            progress("\n")
        steps.append({"factor": factor, "offered_rps": sum(s.rate for s in scaled), "classes": rows})
    return steps


def pyplot() -> Any:
    """matplotlib.pyplot, drawing to files only; a clear exit where it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("edged bench --png needs matplotlib: pip install -e '.[bench]'") from None
    return plt


def plot(steps: list[dict[str, Any]], path: str) -> None:
    """Latency percentiles of OK replies against offered load, one panel per class."""
    plt = pyplot()
    classes = [row["class"] for row in steps[0]["classes"]]
    figure, axes = plt.subplots(1, len(classes), figsize=(5 * len(classes), 4), squeeze=False)
    for ax, name in zip(axes[0], classes):
        loads = [step["offered_rps"] for step in steps]
        for key in ("p50", "p99", "p999"):
            values = [next(r for r in s["classes"] if r["class"] == name)["latency_us"][key] / 1000 for s in steps]
            ax.plot(loads, values, marker="o", label=key)
        ax.set_title(f"class {name}")
        ax.set_xlabel("offered load, all classes (req/s)")
        ax.set_ylabel("latency of OK replies (ms)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
