"""Overload, soak and many clients against a daemon of its own; prints the figures.

    python tests/stress/soak.py overload --seconds 60     # (a) three times capacity
    python tests/stress/soak.py soak --seconds 3600        # (b) 80% of capacity, per-window figures
    python tests/stress/soak.py clients --clients 1000     # (c) a thousand DEALER sockets at once
    python tests/stress/soak.py all --seconds 20 --soak-seconds 120 --window-s 30

Load is the heavy model (cnn-heavy) in the standard class, with a trickle of realtime
requests to the light model beside it: the heavy model's capacity is low enough that
one Python generator can offer three times it on time (the light model's is not: the
generator, not the daemon, would be measured). Capacity is measured first (the goodput
of a few seconds at a rate far past it) unless --capacity gives it. Each scenario checks
what it promises and the script exits 1 when any check fails:
  overload  every request answered OK, OVERLOADED or DEADLINE_EXCEEDED (none lost,
            none other); realtime's p99 within its class deadline
  soak      per window: latency percentiles and the daemon's resident memory; p99
            of the last window within 2x the first's (+1 ms); memory within a bound
  clients   every request of every socket answered
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

from edged.client import Client
from edged.loadgen.launch import DaemonProcess, resident_kib
from edged.loadgen.sweep import Stream, run_load
from edged.wire.codec import encode_request

REALTIME_DEADLINE_MS = 20.0  # the built-in realtime class's deadline
REALTIME_RPS = 100.0  # a steady trickle of realtime traffic beside each flood


def measure_capacity(endpoint: str, inputs: dict[str, Any]) -> float:
    """Goodput of the heavy model in the standard class, offered far more than it can do."""
    rows = run_load(endpoint, [Stream("standard", "cnn-heavy", 5_000.0)], inputs, 3.0)
    return rows[0]["goodput_rps"]


def with_realtime(stream: Stream) -> list[Stream]:
    return [stream, Stream("realtime", "mlp-light", REALTIME_RPS, REALTIME_DEADLINE_MS)]


def overload(endpoint: str, inputs: dict[str, Any], capacity: float, seconds: float) -> dict[str, Any]:
    rows = run_load(endpoint, with_realtime(Stream("standard", "cnn-heavy", 3 * capacity)), inputs, seconds)
    problems = []
    for row in rows:
        answered = row["ok"] + row["overloaded"] + row["deadline_exceeded"]
        if row["lost"] or row["other"] or answered != row["sent"]:
            problems.append(f"{row['class']}: {row['lost']} lost, {row['other']} other of {row['sent']}")
    realtime = rows[1]
    if realtime["latency_us"]["p99"] > REALTIME_DEADLINE_MS * 1000:
        problems.append(f"realtime p99 {realtime['latency_us']['p99'] / 1000:.1f} ms over {REALTIME_DEADLINE_MS} ms")
    return {"scenario": "overload", "seconds": seconds, "classes": rows, "problems": problems}


def soak(
    endpoint: str, pid: int, inputs: dict[str, Any], capacity: float, seconds: float, window_s: float, rss_bound: float
) -> dict[str, Any]:
    """Back-to-back windows at 80% of capacity; one row of figures per window and class."""
    windows = []
    for index in range(max(1, round(seconds / window_s))):
        streams = with_realtime(Stream("standard", "cnn-heavy", 0.8 * capacity))
        rows = run_load(endpoint, streams, inputs, window_s, seed=index)
        window: dict[str, Any] = {"window": index, "rss_mib": round(resident_kib(pid) / 1024, 1)}
        for row in rows:
            window[row["class"]] = {
                **{key: row[key] for key in ("sent", "ok", "overloaded", "deadline_exceeded", "lost")},
                **{key: round(value / 1000, 3) for key, value in row["latency_us"].items()},  # ms
            }
        windows.append(window)
        print(json.dumps(window), file=sys.stderr)
    problems = []
    first, last = windows[0], windows[-1]
    for name in ("standard", "realtime"):
        if last[name]["p99"] > 2 * first[name]["p99"] + 1:
            problems.append(f"{name} p99 drifted from {first[name]['p99']} ms to {last[name]['p99']} ms")
        if any(w[name]["lost"] for w in windows):
            problems.append(f"{name}: requests lost")
    if last["rss_mib"] - first["rss_mib"] > rss_bound:
        problems.append(f"resident memory grew from {first['rss_mib']} to {last['rss_mib']} MiB")
    return {"scenario": "soak", "seconds": seconds, "window_s": window_s, "windows": windows, "problems": problems}


def many_clients(endpoint: str, clients: int, requests_each: int, timeout_s: float = 60.0) -> dict[str, Any]:
    """`clients` DEALER sockets connect at once, each sends `requests_each` requests; all must be answered."""
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, clients + 64)
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
    statuses: dict[str, int] = {}
    started = time.monotonic()
    try:
        sockets = []
        for _ in range(clients):
            sock = context.socket(zmq.DEALER)
            sock.linger = 0
            # A daemon that stops reading fails the run (zmq.Again) instead of hanging it.
            sock.sndtimeo = sock.rcvtimeo = int(timeout_s * 1000)
            sock.connect(endpoint)
            sockets.append(sock)
        for sock in sockets:
            for i in range(requests_each):
                sock.send_multipart(encode_request(i, model="mlp-light", klass="standard", inputs={"x": x}))
        waiting = {sock: requests_each for sock in sockets}
        poller = zmq.Poller()
        for sock in sockets:
            poller.register(sock, zmq.POLLIN)
        end = started + timeout_s
        while waiting and time.monotonic() < end:
            for sock, _ in poller.poll(100):
                while sock in waiting and sock.get(zmq.EVENTS) & zmq.POLLIN:
                    status = msgpack.unpackb(sock.recv_multipart()[0])["status"]
                    statuses[status] = statuses.get(status, 0) + 1
                    waiting[sock] -= 1
                    if waiting[sock] == 0:
                        del waiting[sock]
                        poller.unregister(sock)
    finally:
        context.destroy(linger=0)
    unanswered = sum(waiting.values())
    problems = [f"{unanswered} requests on {len(waiting)} sockets unanswered"] if unanswered else []
    return {
        "scenario": "clients",
        "clients": clients,
        "requests": clients * requests_each,
        "statuses": statuses,
        "seconds_to_all_answered": round(time.monotonic() - started, 2),
        "problems": problems,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=["overload", "soak", "clients", "all"])
    parser.add_argument("--seconds", type=float, default=60.0, help="overload run (and soak, without --soak-seconds)")
    parser.add_argument("--soak-seconds", type=float, help="soak run; default --seconds")
    parser.add_argument("--window-s", type=float, default=60.0, help="soak: figures per window of this length")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--requests-each", type=int, default=3)
    parser.add_argument("--capacity", type=float, help="requests per second; default: measured")
    parser.add_argument("--rss-bound-mib", type=float, default=32.0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    # A thousand sockets need two thousand descriptors or so, here and in the daemon, which inherits the limit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8 * args.clients + 1024)), hard))

    folder = Path(tempfile.mkdtemp(prefix="ed-soak-", dir="/tmp"))
    endpoint = f"ipc://{folder}/edged.sock"
    results: list[dict[str, Any]] = []
    with DaemonProcess([endpoint], log_path=folder / "daemon.log") as daemon:
        daemon.wait_serving()
        pid = daemon.process.pid
        with Client(endpoint) as client:
            inputs = {model["name"]: model["inputs"] for model in client.models()}
        capacity = args.capacity
        if args.scenario in ("overload", "soak", "all") and capacity is None:
            capacity = measure_capacity(endpoint, inputs)
            print(f"capacity: {capacity:.0f} requests/s (cnn-heavy, standard)", file=sys.stderr)
        if args.scenario in ("overload", "all"):
            results.append(overload(endpoint, inputs, capacity, args.seconds))
        if args.scenario in ("soak", "all"):
            seconds = args.soak_seconds or args.seconds
            results.append(soak(endpoint, pid, inputs, capacity, seconds, args.window_s, args.rss_bound_mib))
        if args.scenario in ("clients", "all"):
            results.append(many_clients(endpoint, args.clients, args.requests_each))
        final_rss = resident_kib(pid) / 1024
    output = {"capacity_rps": capacity, "daemon_rss_mib_at_end": round(final_rss, 1), "results": results}
    print(json.dumps(output, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(output, indent=2) + "\n")
    problems = [f"{r['scenario']}: {p}" for r in results for p in r["problems"]]
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
