"""Where the worker path's round trip goes: edged beside the naive server, heavy model.

    python bench/heavy_breakdown.py [--rounds N] [--runs N] [--class NAME]

Closed-loop round trips of `cnn-heavy` (one raw DEALER per server, on edged's shared
endpoint; the requests name the realtime class, or NAME; `--class none`: none, so the
default class serves them, as compare.py's `edged` path),
interleaved in alternating rounds, timed in the client. Both servers time themselves
and say so in each reply (`timing_us`): queue (receipt to the backend call: decode,
admission and, in edged, the hand-off to the lane's worker), compute (the call) and
total (receipt to the result). What the client saw beyond `total` is `outside`: the
transport both ways, the wake-ups, the reply's encoding and send. The naive server is
compare.py's (bench/paths.py), timing itself as edged does.
"""

from __future__ import annotations

import argparse
import tempfile

import msgpack
import numpy as np
from paths import RoundTrips, helper_server

from edged.loadgen.launch import DaemonProcess

PARTS = ("round_trip", "queue", "compute", "total", "outside")
WARMUP = 30


def parts(round_trips: list[tuple[float, bytes]]) -> dict[str, list[float]]:
    """Each part's samples, from the round trips' times and their replies' timing_us."""
    measured: dict[str, list[float]] = {part: [] for part in PARTS}
    for elapsed_us, header in round_trips:
        timing = msgpack.unpackb(header)["timing_us"]
        measured["round_trip"].append(elapsed_us)
        for part in ("queue", "compute", "total"):
            measured[part].append(timing[part])
        measured["outside"].append(elapsed_us - timing["total"])
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runs", type=int, default=400, help="round trips per server and round")
    parser.add_argument("--class", dest="klass", default="realtime", help="the class requests name; none: no class")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edged-parts-") as folder:
        endpoints = {"naive_server": f"ipc://{folder}/naive.sock", "edged": f"ipc://{folder}/edged.sock"}
        naive = helper_server("naive_timed", endpoints["naive_server"])
        clients: dict[str, RoundTrips] = {}
        try:
            with DaemonProcess([endpoints["edged"]]) as daemon:
                daemon.wait_serving()
                klass = None if args.klass == "none" else args.klass
                clients = {path: RoundTrips(endpoint, klass) for path, endpoint in endpoints.items()}
                measured: dict[str, dict[str, list[float]]] = {path: {p: [] for p in PARTS} for path in endpoints}
                for r in range(args.rounds):
                    for path in list(endpoints)[::-1] if r % 2 else endpoints:
                        round_trips = clients[path].with_headers("cnn-heavy", args.runs, WARMUP)
                        for part, values in parts(round_trips).items():
                            measured[path][part].extend(values)
        finally:
            for client in clients.values():
                client.close()
            naive.kill()
    print(f"{'server':<13} {'part':<11} {'p50 us':>8} {'p90 us':>8} {'p99 us':>8}")
    for path, by_part in measured.items():
        for part, values in by_part.items():
            p50, p90, p99 = np.percentile(values, [50, 90, 99])
            print(f"{path:<13} {part:<11} {p50:>8.1f} {p90:>8.1f} {p99:>8.1f}")


if __name__ == "__main__":
    main()
