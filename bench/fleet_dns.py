"""The fleet client behind a DNS name, measured while the records change: daemons on
127.0.0.2 onwards (one port, as a headless Service's pods), a DNS server on 127.0.0.1
(edged.loadgen.dns) whose records go from three daemons to five and back to three, once
per cycle, and the async client of the name offering open-loop Poisson calls of
mlp-light throughout.

A daemon joins as a ready pod does: serving first, then its record. One leaves as a
terminating pod does, the harder way round: its record goes and it is stopped (SIGTERM,
a drain) at the same moment, with no head start for clients.

Figures: per join, the seconds from the record change to the first call the new daemon
served; per leave, the seconds until the client stopped sending there and until it
closed the socket; and every call's outcome (target: none failed), with the time of each
failure, beside a calm run of the same length on three daemons and unchanged records.

    .venv/bin/python bench/fleet_dns.py [--period 5] [--rate 300] [--cycles 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from paths import machine

from edged.client import AsyncClient, Client, EdgedError
from edged.loadgen.dns import Records, shared_port
from edged.loadgen.launch import DaemonProcess
from edged.loadgen.sweep import random_inputs

NAME = "edged.edged.svc.cluster.local"
BASE = [f"127.0.0.{n}" for n in range(2, 5)]  # the three daemons that stay


def joiners(cycle: int) -> list[str]:
    """The two daemons a cycle adds and takes away: fresh ones each cycle, all started
    before the run, so that no daemon's start-up shares the box with the measured calls."""
    return [f"127.0.0.{5 + 2 * cycle}", f"127.0.0.{6 + 2 * cycle}"]


DEADLINE_MS = 200.0
SETTLE_S = 3.0  # calls at three daemons between changes, and after the last
# One class: five daemons start in seconds, not a minute, on a small box.
CONFIG = "[classes.standard]\ndeadline_ms = 1000\n"


class Load:
    """Open-loop Poisson calls of mlp-light at `rate` per second, each call's outcome kept."""

    def __init__(self, client: AsyncClient, rate: float, inputs: dict[str, np.ndarray]) -> None:
        self.client, self.rate = client, rate
        self.latency_ms: list[float] = []
        self.errors: dict[str, int] = {}
        self.failed_at: list[tuple[float, str]] = []  # (seconds since the start, exception) per failed call
        self.calls = 0
        self.started = time.perf_counter()
        self._inputs = inputs

    async def run(self, stop: asyncio.Event) -> None:
        rng = random.Random(1)
        pending: set[asyncio.Future[None]] = set()
        at = time.perf_counter()
        while not stop.is_set():
            at += rng.expovariate(self.rate)
            await asyncio.sleep(max(at - time.perf_counter(), 0))
            task = asyncio.ensure_future(self._one(at))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)

    async def _one(self, intended: float) -> None:
        self.calls += 1
        try:
            await self.client.infer("mlp-light", self._inputs, deadline_ms=DEADLINE_MS)
            self.latency_ms.append((time.perf_counter() - intended) * 1000)
        except EdgedError as exc:
            self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1
            self.failed_at.append((round(intended - self.started, 3), type(exc).__name__))

    def summary(self) -> dict[str, Any]:
        latencies = np.array(self.latency_ms or [0.0])
        percentiles = (("p50", 50), ("p99", 99), ("p999", 99.9))
        return {
            "calls": self.calls,
            "ok": len(self.latency_ms),
            "failed": sum(self.errors.values()),
            "errors": self.errors,
            "latency_ms": {key: float(np.percentile(latencies, q)) for key, q in percentiles},
            "failed_at_s": self.failed_at,
        }


async def until(predicate: Any, within_s: float) -> float | None:
    """Seconds until `predicate()` holds, looked at every millisecond; None if it never did."""
    start = time.perf_counter()
    while time.perf_counter() - start < within_s:
        if predicate():
            return time.perf_counter() - start
        await asyncio.sleep(0.001)
    return None


async def scenario(
    records: Records, daemons: dict[str, DaemonProcess], port: int, args: argparse.Namespace
) -> dict[str, Any]:
    endpoint = {address: f"tcp://{address}:{port}" for address in daemons}
    with Client(endpoint[BASE[0]]) as probe:
        specs = {model["name"]: model["inputs"] for model in probe.models()}
    inputs = random_inputs(specs["mlp-light"], 1, np.random.default_rng(0))
    records.set(NAME, BASE)
    name = f"tcp://{NAME}:{port}"
    joins: list[dict[str, Any]] = []
    leaves: list[dict[str, Any]] = []
    async with AsyncClient(name, resolve_every_s=args.period, resolve=records.resolver()) as client:
        load, stop = Load(client, args.rate, inputs), asyncio.Event()
        running = asyncio.ensure_future(load.run(stop))
        await asyncio.sleep(SETTLE_S)
        for cycle in range(args.cycles):
            for address in joiners(cycle):  # 3 -> 4 -> 5
                joined = endpoint[address]
                records.set(NAME, [*records.addresses(NAME), address])
                at = round(time.perf_counter() - load.started, 3)
                took = await until(lambda e=joined: (c := client.counters().get(e)) is not None and c.ok > 0, 60)
                joins.append({"cycle": cycle, "daemon": joined, "at_s": at, "first_call_served_s": took})
                await asyncio.sleep(SETTLE_S)
            for address in reversed(joiners(cycle)):  # 5 -> 4 -> 3
                left = endpoint[address]
                records.set(NAME, [a for a in records.addresses(NAME) if a != address])
                at = round(time.perf_counter() - load.started, 3)
                stopping = asyncio.ensure_future(asyncio.to_thread(daemons[address].stop))  # the drain, at once
                unused = await until(lambda e=left: e not in client.endpoints, 60)
                closed = await until(lambda e=left: e not in client.counters(), 60)
                leaves.append(
                    {
                        "cycle": cycle,
                        "daemon": left,
                        "at_s": at,
                        "no_new_calls_after_s": unused,
                        "socket_closed_after_s": None if closed is None else closed + (unused or 0.0),
                    }
                )
                await stopping
                await asyncio.sleep(SETTLE_S)
        stop.set()
        await running
    return {
        **load.summary(),
        "duration_s": round(time.perf_counter() - load.started, 1),
        "joins": joins,
        "leaves": leaves,
    }


async def calm(records: Records, port: int, args: argparse.Namespace, duration_s: float) -> dict[str, Any]:
    """The same load on the three daemons, the records unchanged: what this box gives without a change."""
    with Client(f"tcp://{BASE[0]}:{port}") as probe:
        specs = {model["name"]: model["inputs"] for model in probe.models()}
    records.set(NAME, BASE)
    client = AsyncClient(f"tcp://{NAME}:{port}", resolve_every_s=args.period, resolve=records.resolver())
    async with client:
        load, stop = (
            Load(client, args.rate, random_inputs(specs["mlp-light"], 1, np.random.default_rng(0))),
            asyncio.Event(),
        )
        running = asyncio.ensure_future(load.run(stop))
        await asyncio.sleep(duration_s)
        stop.set()
        await running
    return {**load.summary(), "duration_s": duration_s}


def start(address: str, port: int, folder: Path) -> DaemonProcess:
    """A daemon on tcp://ADDRESS:PORT (loopback: plain tcp is allowed), with an ipc socket to wait on."""
    config = folder / "edged.toml"
    config.write_text(CONFIG)
    return DaemonProcess([f"ipc://{folder}/{address}.sock", f"tcp://{address}:{port}"], config=config)


def described(command: list[str]) -> dict[str, Any]:
    """The machine (bench/paths.py), the commit and the command line of this run."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {**machine(), "commit": commit, "command": shlex.join(command)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--period", type=float, default=5.0, help="the client's resolve_every_s (default 5, its default)"
    )
    parser.add_argument("--rate", type=float, default=300.0, help="calls per second offered (default 300)")
    parser.add_argument("--cycles", type=int, default=3, help="scales from 3 to 5 daemons and back (default 3)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    addresses = BASE + [address for cycle in range(args.cycles) for address in joiners(cycle)]
    port = shared_port(addresses)
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="edged-dns-") as folder, Records() as records:
        args.folder = Path(folder)
        daemons = {address: start(address, port, args.folder) for address in addresses}
        try:
            for daemon in daemons.values():
                daemon.wait_serving(300)
            figures = asyncio.run(scenario(records, daemons, port, args))
            baseline = asyncio.run(calm(records, port, args, figures["duration_s"]))
        finally:
            for daemon in daemons.values():
                daemon.stop()
    result = {
        "machine": {**described([sys.executable, *sys.argv]), "load_average_at_start": load_at_start},
        "period_s": args.period,
        "offered_rps": args.rate,
        "deadline_ms": DEADLINE_MS,
        "scaling": figures,
        "calm": baseline,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
