"""A burst from many peers, with realtime beside it and the bare floor, in one run.

    python bench/burst.py [--runs 3] [--peers 500] [--per-peer 20] [--json FILE] [--baseline DIR]
                          [--config FILE] [--shed-only] [--realtime-apart] [--class-socket]
                          [--realtime-s 8]

Each run, in turn:
1. the floor: a bare ZeroMQ ROUTER, in a process of its own, that answers every
   message at once with a header-only reply, takes the same burst, with the same
   realtime peers beside it (their round trip there is what this box gives any server);
2. edged: a fresh daemon, the built-in configuration, on ipc. 500 peers (DEALER
   sockets) each pipeline 20 bulk requests for cnn-heavy (48 KiB each, a 3 s
   deadline), all at once, while 10 realtime peers, in a process of their own, each
   send mlp-light every 20 ms through the client library, for 8 s (--realtime-s) from
   half a second before the burst.
Reported per run: requests lost or answered twice; admitted bulk that then expired;
realtime OK and its round trip (with the daemon's own span beside it); the time to
answer the whole burst against the floor's, and against the floor's plus the admitted
requests' own compute (issue 36's target: the bulk lane's calls and rows from `stats`,
each priced by cnn-heavy run in this process on one thread, at 1 and at 16 rows, before
the first run); the OVERLOADED round trip; the daemon's
CPU seconds by thread during the burst; its RSS before the burst and 1 s after its
last reply. With --baseline DIR, each run also gives the same burst to another
checkout's daemon (a worktree of an earlier commit), the two in an order swapped from
run to run: before and after, interleaved. With --config FILE, this checkout's daemon
runs with that configuration. With --shed-only, each run also gives this checkout's
daemon the burst with a deadline shorter than cnn-heavy's own run, so that every bulk
request is shed and none computes: the time edged's ingest alone takes, apart from the
compute of what it admits. With --realtime-apart, each run also gives this checkout's
daemon the burst while realtime's peers send to a floor server of their own, in a process
of its own: no part of edged on their path, their round trip is what this box, busy with
edged's burst, gives a request that nothing else queues behind. With --class-socket, the
peers send the burst to bulk's own socket, as edged.client sends bulk's requests beside an ipc
endpoint, rather than to the shared endpoint (the floor has one socket: it takes it there).
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
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import msgpack
import zmq
from paths import InProcess, machine, machine_line

from edged.client import Client
from edged.loadgen.burst import realtime_beside, stampede
from edged.loadgen.launch import DaemonProcess, checkout_program, resident_kib, thread_cpu_seconds
from edged.wire.endpoints import class_endpoint

REALTIME_PEERS = 10
REALTIME_PERIOD_MS = 20.0
BULK_DEADLINE_MS = 3000.0
SHED_ONLY_DEADLINE_MS = 1.0  # under cnn-heavy's 2 ms run: admission sheds every request


class OwnCompute(NamedTuple):
    """cnn-heavy's compute with a core to itself: a call's first row and each row after it."""

    first_row_s: float
    extra_row_s: float

    @classmethod
    def measure(cls, runs: int = 15) -> OwnCompute:
        """Time cnn-heavy here (bench/paths.py's in-process floor: one thread) at 1 and 16
        rows, the median of `runs` each."""
        timed = InProcess()
        one, sixteen = (statistics.median(timed("cnn-heavy", runs, 3, rows)) / 1e6 for rows in (1, 16))
        return cls(one, max(sixteen - one, 0.0) / 15)

    def of(self, calls: int, rows: int) -> float:
        """The seconds `calls` calls carrying `rows` rows in all take."""
        return calls * self.first_row_s + (rows - calls) * self.extra_row_s


def floor_server(endpoint: str, ready: Any, stop: Any) -> None:
    """Answer every message at once with a header-only reply: ZeroMQ's own cost."""
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.sndhwm = sock.rcvhwm = 0
    sock.bind(endpoint)
    ready.set()
    while not stop.is_set():
        if not sock.poll(100):
            continue
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            header = msgpack.unpackb(frames[1].buffer)
            sock.send_multipart([frames[0], msgpack.packb({"v": 1, "id": header["id"], "status": "OK"})])
    sock.close(linger=0)
    context.term()


@contextlib.contextmanager
def running_floor(endpoint: str) -> Iterator[Any]:
    """The floor server in a process of its own, answering on `endpoint` until the block ends."""
    spawn = multiprocessing.get_context("spawn")
    ready, stop = spawn.Event(), spawn.Event()
    server = spawn.Process(target=floor_server, args=(endpoint, ready, stop))
    server.start()
    try:
        ready.wait(30)
        yield server
    finally:
        stop.set()
        server.join(10)


def floor_run(folder: str, peers: int, per_peer: int, realtime_s: float) -> dict[str, Any]:
    endpoint = f"ipc://{folder}/floor.sock"
    with running_floor(endpoint):
        burst, beside, _ = beside_burst(endpoint, peers, per_peer, BULK_DEADLINE_MS, None, realtime_s)
    return {"burst": burst, "realtime": beside}


def beside_burst(
    endpoint: str,
    peers: int,
    per_peer: int,
    deadline_ms: float,
    pid: int | None,
    realtime_s: float,
    realtime_endpoint: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, float]]:
    """The burst, with realtime's peers beside it from a process of their own, sending to
    `realtime_endpoint` (None: `endpoint`); and, given the server's `pid`, the CPU seconds
    each of its threads took during the burst."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as other:
        other.submit(time.sleep, 0).result()  # the process is up before the burst starts
        # Realtime's pace runs from before the burst to past its end.
        realtime = other.submit(
            realtime_beside, realtime_endpoint or endpoint, REALTIME_PEERS, REALTIME_PERIOD_MS, realtime_s
        )
        time.sleep(1.0)
        cpu_before = thread_cpu_seconds(pid) if pid else {}
        burst = stampede(endpoint, peers, per_peer, deadline_ms).summary()
        cpu_after = thread_cpu_seconds(pid) if pid else {}
        beside = realtime.result()
    cpu = {name: round(cpu_after[name] - cpu_before.get(name, 0.0), 2) for name in cpu_after}
    return burst, beside, {name: seconds for name, seconds in cpu.items() if seconds}


class Daemon(NamedTuple):
    """One daemon a run gives the burst to: its program (None: this checkout's), its
    configuration (None: the built-in one), the bulk requests' deadline, and whether
    realtime's peers send to a floor server of their own instead (`realtime_apart`)."""

    program: list[str] | None = None
    config: Path | None = None
    deadline_ms: float = BULK_DEADLINE_MS
    realtime_apart: bool = False


def edged_run(
    folder: str, peers: int, per_peer: int, daemon: Daemon, realtime_s: float, class_socket: bool
) -> dict[str, Any]:
    endpoint, apart = f"ipc://{folder}/edged.sock", f"ipc://{folder}/apart.sock"
    burst_endpoint = (class_endpoint(endpoint, "bulk") if class_socket else None) or endpoint
    with (
        DaemonProcess([endpoint], daemon.config, Path(folder) / "daemon.log", program=daemon.program) as process,
        running_floor(apart) if daemon.realtime_apart else contextlib.nullcontext(),
    ):
        process.wait_serving()
        rss_before = resident_kib(process.process.pid)
        burst, beside, cpu = beside_burst(
            burst_endpoint,
            peers,
            per_peer,
            daemon.deadline_ms,
            process.process.pid,
            realtime_s,
            apart if daemon.realtime_apart else endpoint,
        )
        time.sleep(1.0)
        rss_after = resident_kib(process.process.pid)
        with Client(endpoint) as client:
            classes = client.stats()["classes"]
    bulk = classes["bulk"]
    return {
        "burst": {**burst, "endpoint": burst_endpoint},
        "bulk_calls": {"calls": bulk["backend_calls"], "rows": bulk["backend_rows"]},
        # Why realtime's OVERLOADED were shed, by the daemon's own count (a new daemon each run).
        "realtime": {**beside, "shed": classes["realtime"]["shed"]},
        "rss_kib": {"before": rss_before, "after_1s": rss_after},
        "daemon_cpu_s": cpu,
    }


def report(run: str, floor: dict[str, Any], edged: dict[str, Any], own: OwnCompute) -> str:
    burst, rt, rss = edged["burst"], edged["realtime"], edged["rss_kib"]
    ok = rt["statuses"].get("OK", 0) / rt["sent"] if rt["sent"] else 0.0
    trip, inside, floor_trip = rt["round_trip_ms"], rt["daemon_total_ms"], floor["realtime"]["round_trip_ms"]
    took, floor_took = burst["seconds_to_answer_all"], floor["burst"]["seconds_to_answer_all"]
    shed_took = burst["seconds_to_answer_shed"]
    calls = edged["bulk_calls"]
    target = floor_took + own.of(calls["calls"], calls["rows"])
    # A floor's replies carry no timing_us: realtime's peers were sent to one of their own (--realtime-apart).
    span = (
        f"inside the daemon p50 {inside['p50']:.2f} / p99 {inside['p99']:.2f} ms"
        if inside
        else "sent to a floor server of their own, beside this burst"
    )
    return "\n".join(
        [
            f"run {run}: {burst['sent']} bulk requests from the peers; statuses {burst['statuses']}",
            f"  lost {burst['lost']}, duplicated {burst['duplicated']} (floor: lost {floor['burst']['lost']})",
            f"  admitted bulk that expired: {burst['statuses'].get('DEADLINE_EXCEEDED', 0)} of {burst['admitted']} "
            f"({burst['expired_of_admitted']:.1%})",
            f"  realtime OK {ok:.1%} of {rt['sent']} {rt['statuses']} (shed: {rt['shed']}); "
            f"round trip p50 {trip.get('p50', 0):.2f} / p99 "
            f"{trip.get('p99', 0):.2f} / max {trip.get('max', 0):.2f} ms ({span}); beside the floor's burst "
            f"p50 {floor_trip.get('p50', 0):.2f} / p99 {floor_trip.get('p99', 0):.2f} ms",
            *(f"  realtime refused {count}x: {why}" for why, count in rt.get("refusals", {}).items()),
            f"  whole burst answered in {took:.2f} s, the floor's in {floor_took:.2f} s: {took / floor_took:.2f}x; "
            f"its sheds in {shed_took:.2f} s ({shed_took / floor_took:.2f}x), "
            f"the rest being the {burst['admitted']} admitted requests' compute",
            f"  against the floor's time plus the admitted requests' own compute ({calls['calls']} calls, "
            f"{calls['rows']} rows: {floor_took:.2f} + {target - floor_took:.2f} s): {took / target:.2f}x",
            f"  OVERLOADED round trip p50: {burst['overloaded_round_trip_p50_ms'] or 0:.1f} ms",
            f"  the daemon's CPU seconds during the burst, by thread: {edged['daemon_cpu_s']}",
            f"  RSS {rss['before'] / 1024:.0f} MiB before, {rss['after_1s'] / 1024:.0f} MiB 1 s after "
            f"({rss['after_1s'] / rss['before']:.2f}x)",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--peers", type=int, default=500)
    parser.add_argument("--per-peer", type=int, default=20)
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    parser.add_argument("--baseline", help="also run another checkout's daemon, interleaved with this one's")
    parser.add_argument("--config", type=Path, help="this checkout's daemon's configuration file")
    parser.add_argument("--shed-only", action="store_true", help="also run the burst with every request shed")
    parser.add_argument(
        "--realtime-apart", action="store_true", help="also run the burst with realtime sent to a floor of its own"
    )
    parser.add_argument("--class-socket", action="store_true", help="send edged the burst on bulk's own socket")
    parser.add_argument("--realtime-s", type=float, default=8.0, help="how long realtime's peers send, each run")
    args = parser.parse_args()
    daemons = {"this checkout": Daemon(config=args.config)}
    if args.baseline:
        daemons["baseline"] = Daemon(checkout_program(args.baseline))
    if args.shed_only:
        daemons["shed only"] = Daemon(config=args.config, deadline_ms=SHED_ONLY_DEADLINE_MS)
    if args.realtime_apart:
        daemons["realtime apart"] = Daemon(config=args.config, realtime_apart=True)
    where = machine()
    print(machine_line(where), flush=True)
    own = OwnCompute.measure()
    print(
        f"cnn-heavy here, one thread: {own.first_row_s * 1e3:.2f} ms a call's first row, "
        f"{own.extra_row_s * 1e3:.2f} ms each row after it",
        flush=True,
    )
    runs = []
    for run in range(1, args.runs + 1):
        order = list(daemons) if run % 2 else list(reversed(daemons))
        with tempfile.TemporaryDirectory(prefix="edged-burst-") as folder:
            floor = floor_run(folder, args.peers, args.per_peer, args.realtime_s)
            figures = {
                name: edged_run(folder, args.peers, args.per_peer, daemons[name], args.realtime_s, args.class_socket)
                for name in order
            }
        runs.append({"floor": floor, **figures})
        for name in daemons:
            print(report(f"{run} ({name})", floor, figures[name], own), flush=True)
    if args.json:
        document = {"machine": where, "peers": args.peers, "per_peer": args.per_peer, "own_compute": own._asdict()}
        document["runs"] = runs
        args.json.write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
