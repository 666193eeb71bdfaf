"""The first requests a fresh daemon answers: does anything it does as it opens delay them?

    python bench/first_requests.py [--rounds 5] [--answers 300] [--baseline DIR] [--json FILE]

Each round starts a fresh daemon (and, given --baseline DIR, another checkout's, the two
in an order swapped from round to round), and one client sends mlp-light on the shared
endpoint, one request at a time, from before the daemon listens, retrying each
UNAVAILABLE after 1 ms (as a fleet's client keeps calling through a rolling restart),
until `--answers` requests have been answered OK. Reported per daemon: when the first OK
came (from the start), the first OK's round trip, and the p50, p99 and max of the OK
round trips after it. A pause just after the daemon opens (a collection of start-up
garbage holding the interpreter lock, say) lands on the first OK; one just before it
opens, on an UNAVAILABLE or, where the daemon opens meanwhile, on the first OK too. A
client that waits for `health` to say ready sees neither: the health reply waits instead.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq
from paths import dealer

from edged.loadgen.burst import percentiles
from edged.loadgen.launch import DaemonProcess, checkout_program
from edged.wire.codec import encode_request

LIGHT = np.random.default_rng(1).standard_normal((1, 64), dtype=np.float32)


def first_answers(endpoint: str, answers: int, program: list[str] | None, folder: Path) -> dict[str, Any]:
    """Start a daemon on `endpoint` and send to it until `answers` OK replies came back."""
    sock = dealer(endpoint)  # connected before the daemon binds: the first request waits for it
    statuses: Counter[str] = Counter()
    ok_ms: list[float] = []
    start = time.perf_counter()
    first_ok_s = 0.0
    try:
        with DaemonProcess([endpoint], log_path=folder / "daemon.log", program=program):
            for request_id in itertools.count():
                sent = time.perf_counter()
                header = ask(sock, encode_request(request_id, model="mlp-light", inputs={"x": LIGHT}))
                statuses[header["status"]] += 1
                if header["status"] == "UNAVAILABLE":
                    time.sleep(0.001)
                    continue
                if header["status"] != "OK":
                    raise RuntimeError(f"the daemon answered {header}")
                first_ok_s = first_ok_s or sent - start
                ok_ms.append((time.perf_counter() - sent) * 1000)
                if len(ok_ms) == answers:
                    break
    finally:
        sock.close()
    return {
        "statuses": dict(statuses),
        "first_ok_s": round(first_ok_s, 3),
        "first_ok_ms": ok_ms[0],
        "after_ms": percentiles(ok_ms[1:]),
    }


def ask(sock: zmq.Socket, frames: list[Any]) -> dict[str, Any]:
    """Send one request and return its reply's header (the socket gives up after STUCK_MS)."""
    sock.send_multipart(frames, copy=False)
    header: dict[str, Any] = msgpack.unpackb(sock.recv_multipart()[0])
    return header


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--answers", type=int, default=300)
    parser.add_argument("--baseline", help="also start another checkout's daemon, interleaved with this one's")
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    args = parser.parse_args()
    daemons: dict[str, list[str] | None] = {"edged": None}
    if args.baseline:
        daemons["edged, before"] = checkout_program(args.baseline)
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in daemons}
    for number in range(args.rounds):
        order = list(daemons) if number % 2 == 0 else list(reversed(daemons))
        for name in order:
            with tempfile.TemporaryDirectory(prefix="edged-first-") as folder:
                figures = first_answers(f"ipc://{folder}/edged.sock", args.answers, daemons[name], Path(folder))
            rounds[name].append(figures)
            after = figures["after_ms"]
            print(
                f"round {number + 1} {name}: {figures['statuses']}; the first OK after {figures['first_ok_s']:.2f} s, "
                f"its round trip {figures['first_ok_ms']:.2f} ms; the {args.answers - 1} after it: "
                f"p50 {after['p50']:.2f} / p99 {after['p99']:.2f} / max {after['max']:.2f} ms",
                flush=True,
            )
    for name, figures in rounds.items():
        first = [f["first_ok_ms"] for f in figures]
        worst = [f["after_ms"]["max"] for f in figures]
        print(
            f"{name}: the first OK's round trip, median over rounds {statistics.median(first):.2f} ms "
            f"({', '.join(f'{w:.1f}' for w in first)}); the max after it {statistics.median(worst):.2f} ms "
            f"({', '.join(f'{w:.1f}' for w in worst)})"
        )
    if args.json:
        args.json.write_text(json.dumps({"answers": args.answers, "rounds": rounds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
