"""Realtime beside another class's spinning loop: does the spin delay a higher class?

Two fresh daemons in alternating rounds: edged as built in (the spin up to 250 us) and
edged with `spin_max_us = 0`. In each round and daemon, realtime requests go to realtime's
own socket one at a time, one every `--every-ms`, first with nothing else running, then
beside a client process that sends standard requests to the shared endpoint one at a time,
each as the last answer comes (which keeps standard's loop spinning between them). For
realtime: the round trip and its span inside the daemon (`timing_us.total`), p50 and p99.

    python bench/spin_beside.py [--rounds N] [--seconds S] [--every-ms MS] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
from paths import MODELS, RoundTrips, dealer, machine, machine_line
from spin import spins

from edged.loadgen.launch import DaemonProcess
from edged.wire.codec import encode_request
from edged.wire.endpoints import class_endpoint

DAEMONS = ("edged", "edged_no_spin")


def standard_closed_loop(endpoint: str, seconds: float) -> None:
    """Light standard requests one at a time for `seconds` (run in a process of its own)."""
    trips = RoundTrips(endpoint, None)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        trips("mlp-light", 200, 0)
    trips.close()


def realtime_samples(endpoint: str, seconds: float, every_ms: float) -> dict[str, float]:
    """Realtime round trips on its own socket, paced; p50 and p99 of the trip and the daemon's span."""
    name, shape = MODELS["mlp-light"]
    frames = [
        bytes(f)
        for f in encode_request(1, model="mlp-light", klass="realtime", inputs={name: np.zeros(shape, np.float32)})
    ]
    sock = dealer(class_endpoint(endpoint, "realtime") or endpoint)
    trips, inside = [], []
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            start = time.perf_counter_ns()
            sock.send_multipart(frames)
            if not sock.poll(10_000):
                raise RuntimeError("no reply from realtime's socket")
            reply = sock.recv_multipart()
            trips.append((time.perf_counter_ns() - start) / 1000)
            header = msgpack.unpackb(reply[0])
            if header["status"] != "OK":
                raise RuntimeError(f"realtime answered {header['status']}: {header.get('error')}")
            inside.append(header["timing_us"]["total"])
            time.sleep(max(every_ms / 1000 - (time.perf_counter_ns() - start) / 1e9, 0))
    finally:
        sock.close()
    return {
        "trip_p50_us": float(np.percentile(trips, 50)),
        "trip_p99_us": float(np.percentile(trips, 99)),
        "inside_p50_us": float(np.percentile(inside, 50)),
        "inside_p99_us": float(np.percentile(inside, 99)),
        "requests": len(trips),
    }


def beside(endpoint: str, seconds: float, every_ms: float) -> dict[str, float]:
    """Realtime's samples beside standard's closed loop, and how often standard's loop spun meanwhile."""
    load = multiprocessing.Process(target=standard_closed_loop, args=(endpoint, seconds + 0.6))
    load.start()
    time.sleep(0.3)  # the standard client's round trips under way: standard's loop armed
    try:
        before = spins(endpoint)
        samples = realtime_samples(endpoint, seconds, every_ms)
        return {**samples, "standard_spins": spins(endpoint) - before}
    finally:
        load.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds (default 4)")
    parser.add_argument("--seconds", type=float, default=4.0, help="each measurement's length (default 4)")
    parser.add_argument("--every-ms", type=float, default=2.0, help="realtime's pace (default one every 2 ms)")
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    args = parser.parse_args()
    rounds: list[dict[str, dict[str, dict[str, float]]]] = []
    with tempfile.TemporaryDirectory(prefix="edged-beside-") as folder, contextlib.ExitStack() as stack:
        endpoints = {name: f"ipc://{folder}/{name}.sock" for name in DAEMONS}
        no_spin = Path(folder) / "no-spin.toml"
        no_spin.write_text("[server]\nspin_max_us = 0\n")
        configs = {"edged": None, "edged_no_spin": no_spin}
        daemons = [stack.enter_context(DaemonProcess([endpoints[n]], config=configs[n])) for n in DAEMONS]
        for daemon in daemons:
            daemon.wait_serving()
        for r in range(args.rounds):
            row = {}
            for name in DAEMONS if r % 2 == 0 else DAEMONS[::-1]:
                alone = realtime_samples(endpoints[name], args.seconds, args.every_ms)
                row[name] = {"alone": alone, "beside": beside(endpoints[name], args.seconds, args.every_ms)}
            rounds.append(row)
            sys.stderr.write(f"round {r + 1}/{args.rounds}: {_line(row)}\n")
    where = machine()
    print(machine_line(where))
    print(f"realtime, one every {args.every_ms} ms, medians over {args.rounds} rounds, us")
    print(f"{'daemon':<14} {'way':<7} {'trip p50':>9} {'trip p99':>9} {'inside p50':>11} {'inside p99':>11}")
    medians = {}
    for name in DAEMONS:
        for way in ("alone", "beside"):
            m = {k: statistics.median(row[name][way][k] for row in rounds) for k in rounds[0][name][way]}
            medians[f"{name}_{way}"] = m
            print(
                f"{name:<14} {way:<7} {m['trip_p50_us']:>9.1f} {m['trip_p99_us']:>9.1f} "
                f"{m['inside_p50_us']:>11.1f} {m['inside_p99_us']:>11.1f}"
            )
    if args.json:
        args.json.write_text(json.dumps({"machine": where, "rounds": rounds, "medians": medians}, indent=2) + "\n")


def _line(row: dict[str, dict[str, dict[str, float]]]) -> str:
    return "; ".join(
        f"{name} {way} p99 {row[name][way]['trip_p99_us']:.0f} us (inside {row[name][way]['inside_p99_us']:.0f}"
        f"{', standard spun ' + str(row[name][way]['standard_spins']) if way == 'beside' else ''})"
        for name in DAEMONS
        for way in ("alone", "beside")
    )


if __name__ == "__main__":
    main()
