"""A steady stream of short-deadline bulk requests on a busy box: how many of those admitted
expire, and whether every request is answered.

    python bench/busy_stream.py [--rounds 3] [--seconds 6] [--baseline DIR] [--json FILE]

One busy loop per core (plain Python at the default niceness) runs throughout. Each round
starts a fresh daemon with the built-in classes, waits for it to sample the box's load, then
16 peers each send cnn-heavy to bulk back to back for 6 s (--seconds), each with 30 ms to live.
Beside the loops bulk's workers get half a core (a tenth at nice 10, the built-in until
2026-11-29), so a request admitted on the lane's ideal pace expires; the lane's calls in
flight are where admission's estimate is most often wrong. A request with no
reply in 10 s counts as unanswered, and its peer stops. With --baseline DIR (a worktree of an
earlier commit), each round runs that checkout's daemon too, interleaved.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import msgpack
import zmq
from paths import machine, machine_line

from edged.loadgen.burst import IMAGE
from edged.loadgen.launch import busy_loops, checkout_program, loaded_daemon
from edged.wire.codec import encode_request

PEERS, DEADLINE_MS, PATIENCE_MS = 16, 30.0, 10_000


def stream(endpoint: str, seconds: float) -> Counter[str]:
    """Each peer's statuses, summed; "UNANSWERED" for a request with no reply in PATIENCE_MS."""
    statuses: Counter[str] = Counter()
    lock = threading.Lock()
    end = time.monotonic() + seconds
    context = zmq.Context()

    def peer() -> None:
        sock = context.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(endpoint)
        request = 0
        while time.monotonic() < end:
            request += 1
            inputs = {"image": IMAGE}
            sock.send_multipart(
                encode_request(request, model="cnn-heavy", klass="bulk", deadline_ms=DEADLINE_MS, inputs=inputs)
            )
            if not sock.poll(PATIENCE_MS):
                with lock:
                    statuses["UNANSWERED"] += 1
                break
            status = msgpack.unpackb(sock.recv_multipart()[0])["status"]
            with lock:
                statuses[status] += 1
        sock.close()

    threads = [threading.Thread(target=peer) for _ in range(PEERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    context.term()
    return statuses


def one_round(program: list[str] | None, seconds: float) -> Counter[str]:
    with loaded_daemon(program, "edged-stream-") as endpoint:
        return stream(endpoint, seconds)


def line(statuses: Counter[str]) -> str:
    admitted = statuses["OK"] + statuses["DEADLINE_EXCEEDED"]
    return (
        f"admitted {admitted:4d}  expired {statuses['DEADLINE_EXCEEDED']:3d}  "
        f"shed {statuses['OVERLOADED']:6d}  unanswered {statuses['UNANSWERED']}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0, help="how long the peers send, each round")
    parser.add_argument("--baseline", help="also run another checkout's daemon, interleaved with this one's")
    parser.add_argument("--json", type=Path, help="write every round's statuses here")
    args = parser.parse_args()
    sides: dict[str, list[str] | None] = {"edged": None}
    if args.baseline:
        sides["baseline"] = checkout_program(args.baseline)
    rounds: dict[str, list[dict[str, int]]] = {name: [] for name in sides}
    where = machine()
    print(machine_line(where), flush=True)
    with busy_loops():
        for number in range(1, args.rounds + 1):
            order = list(sides.items()) if number % 2 else list(reversed(sides.items()))
            for name, program in order:
                statuses = one_round(program, args.seconds)
                rounds[name].append(dict(statuses))
                print(f"round {number} {name:8} {line(statuses)}", flush=True)
    for name, results in rounds.items():
        total = sum((Counter(result) for result in results), Counter())
        admitted = total["OK"] + total["DEADLINE_EXCEEDED"]
        share = total["DEADLINE_EXCEEDED"] / admitted if admitted else 0.0
        print(f"{name:8} over {len(results)} rounds: {line(total)} ({share:.1%} of the admitted expired)")
    if args.json:
        args.json.write_text(json.dumps({"machine": where, **rounds}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
