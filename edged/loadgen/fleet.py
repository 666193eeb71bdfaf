"""`edged bench` over several daemons: open-loop Poisson calls through the fleet client
(`AsyncClient` given every endpoint), so that what is measured is what a user of the
client gets: retries, set-asides and hedges included.

Each call's latency counts from its intended start, so a client or a fleet that falls
behind shows in the figures (no coordinated omission). Per daemon it reports the
client's counters (edged.client.fleet.EndpointCounters) and, from each daemon still running,
its own `stats` for the class.
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from edged.client import AsyncClient, Client, EdgedError, EndpointCounters, NoReply
from edged.loadgen.sweep import Stream, random_inputs

try:  # the faster loop for zmq.asyncio, where it is installed (the test extra has it)
    import uvloop
except ImportError:
    uvloop = None


@dataclass
class _Outcomes:
    latency_ms: list[float] = field(default_factory=list)  # OK calls, from the intended start
    errors: dict[str, int] = field(default_factory=dict)  # by exception: one entry per call that raised
    over_deadline: int = 0  # results (of any kind) that came after the call's deadline_ms
    calls: int = 0


async def _stream(
    client: AsyncClient, stream: Stream, inputs: dict[str, np.ndarray], duration_s: float, seed: int
) -> _Outcomes:
    outcomes = _Outcomes()
    rng = random.Random(seed)
    # Only the calls in flight are held: tens of thousands of finished tasks kept alive
    # would make each of the collector's full passes a stall of the measuring client.
    pending: set[asyncio.Future[None]] = set()

    async def one(intended: float) -> None:
        try:
            await client.infer(stream.model, inputs, klass=stream.klass, deadline_ms=stream.deadline_ms)
            outcomes.latency_ms.append((time.perf_counter() - intended) * 1000)
        except EdgedError as exc:
            name = type(exc).__name__
            outcomes.errors[name] = outcomes.errors.get(name, 0) + 1
        if stream.deadline_ms is not None and (time.perf_counter() - intended) * 1000 > stream.deadline_ms:
            outcomes.over_deadline += 1

    start = time.perf_counter()
    at = start + rng.expovariate(stream.rate)
    while at < start + duration_s:
        await asyncio.sleep(max(at - time.perf_counter(), 0))
        task = asyncio.ensure_future(one(at))
        pending.add(task)
        task.add_done_callback(pending.discard)
        outcomes.calls += 1
        at += rng.expovariate(stream.rate)
    await asyncio.gather(*pending)
    return outcomes


async def _run(
    endpoints: list[str],
    streams: list[Stream],
    duration_s: float,
    hedge: bool,
    hedge_after_ms: float | None,
    warmup_calls: int,
    on_start: Callable[[], None] | None,
) -> tuple[list[_Outcomes], dict[str, Any]]:
    with Client(endpoints[0]) as probe:
        specs = {model["name"]: model["inputs"] for model in probe.models()}
    inputs = [random_inputs(specs[s.model], s.rows, np.random.default_rng(i)) for i, s in enumerate(streams)]
    async with AsyncClient(endpoints, timeout_ms=5000, hedge=hedge, hedge_after_ms=hedge_after_ms) as client:
        # Connects every socket and, with hedging, gives the client its p95 before the run.
        for i in range(warmup_calls):
            stream = streams[i % len(streams)]
            await client.infer(stream.model, inputs[i % len(streams)], klass=stream.klass)
        before = client.counters()
        if on_start is not None:
            on_start()
        outcomes = await asyncio.gather(
            *(_stream(client, s, inputs[i], duration_s, seed=i) for i, s in enumerate(streams))
        )
        after = client.counters()
    # Per daemon the client knew by the end (a DNS name's addresses, or those given); one
    # that joined during the run counts from zero.
    zero = EndpointCounters()
    counters = {
        endpoint: {key: value - getattr(before.get(endpoint, zero), key) for key, value in asdict(now).items()}
        for endpoint, now in after.items()
    }
    return list(outcomes), counters


def run_fleet(
    endpoints: list[str],
    streams: list[Stream],
    duration_s: float,
    hedge: bool = False,
    hedge_after_ms: float | None = None,
    warmup_calls: int = 200,
    on_start: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Offer `streams` to the fleet for `duration_s`; the figures of the run. `on_start`
    is called as the measured run begins, after the warm-up calls (bench/fleet_targets.py
    starts its kill, flood or stops there)."""
    run = _run(endpoints, streams, duration_s, hedge, hedge_after_ms, warmup_calls, on_start)
    gc.collect()
    gc.freeze()  # as the daemon does after start-up: the collector never walks what exists now
    try:
        outcomes, counters = (uvloop.run if uvloop is not None else asyncio.run)(run)
    finally:
        gc.unfreeze()
    calls = sum(o.calls for o in outcomes)
    daemons = list(counters)
    sent = sum(c["sent"] for c in counters.values())
    return {
        "duration_s": duration_s,
        "hedge": hedge,
        "loop": "uvloop" if uvloop is not None else "asyncio",
        "streams": [_summary(s, o) for s, o in zip(streams, outcomes)],
        "calls": calls,
        "copies_sent": sent,
        "extra_copies_fraction": (sent - calls) / calls if calls else 0.0,
        "daemons": {
            endpoint: {"client": counters[endpoint], "daemon": _daemon_stats(endpoint)} for endpoint in daemons
        },
    }


def _summary(stream: Stream, outcomes: _Outcomes) -> dict[str, Any]:
    latencies = np.array(outcomes.latency_ms or [0.0])
    ok = len(outcomes.latency_ms)
    return {
        "class": stream.klass,
        "model": stream.model,
        "offered_rps": stream.rate,
        "deadline_ms": stream.deadline_ms,
        "calls": outcomes.calls,
        "ok": ok,
        "ok_fraction": ok / outcomes.calls if outcomes.calls else 0.0,
        "errors": outcomes.errors,
        "results": ok + sum(outcomes.errors.values()),  # exactly one per call, or the run is wrong
        "over_deadline": outcomes.over_deadline,
        "latency_ms": {key: float(np.percentile(latencies, q)) for key, q in (("p50", 50), ("p99", 99), ("p999", 99.9))}
        | {"max": float(latencies.max())},
    }


def _daemon_stats(endpoint: str) -> dict[str, Any] | None:
    """The daemon's own figures per class, or None where it no longer answers."""
    try:
        with Client(endpoint, timeout_ms=1000) as client:
            classes = client.stats()["classes"]
    except (NoReply, EdgedError):
        return None
    return {
        name: {
            "completed": figures["completed"],
            "shed": sum(figures["shed"].values()),
            "total_p99_us": figures["latency_us"]["total"]["p99"],
        }
        for name, figures in classes.items()
    }


def format_fleet(result: dict[str, Any]) -> str:
    """A terminal summary: each stream, then each daemon."""
    lines = [
        f"{result['calls']} calls, {result['copies_sent']} copies sent "
        f"({100 * result['extra_copies_fraction']:.2f}% extra), hedging {'on' if result['hedge'] else 'off'}"
    ]
    for row in result["streams"]:
        lat = row["latency_ms"]
        lines.append(
            f"  {row['class']}:{row['model']} {row['offered_rps']:.0f}/s: {row['ok']}/{row['calls']} ok "
            f"({100 * row['ok_fraction']:.2f}%), errors {row['errors'] or 'none'}, "
            f"{row['over_deadline']} past deadline; p50 {lat['p50']:.2f} p99 {lat['p99']:.2f} "
            f"p99.9 {lat['p999']:.2f} max {lat['max']:.2f} ms"
        )
    for endpoint, figures in result["daemons"].items():
        client = " ".join(f"{k} {v}" for k, v in figures["client"].items())
        daemon = figures["daemon"]
        busy = {k: v for k, v in (daemon or {}).items() if v["completed"] or v["shed"]}
        seen = "gone" if daemon is None else "; ".join(f"{k}: {v}" for k, v in busy.items())
        lines.append(f"  {endpoint}: {client}\n    daemon: {seen}")
    return "\n".join(lines)
