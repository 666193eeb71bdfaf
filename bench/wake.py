"""How a worker hands a reply to the loop that owns a socket: an eventfd beside a deque
(edged.serve.transport.loop, as it is), or an inproc PAIR socket, measured side by side.

    python bench/wake.py [--round-trips 20000] [--rounds 5]

Two threads play ping-pong, each sleeping in zmq_poll as a loop does: one hands the
other a small object, which hands it back the same way. Half a round trip is one
hand-off: the wake-up of a sleeping thread, plus the hand-over itself. The two ways
run in alternating rounds, so a box that slows down mid-run slows both alike.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import deque

import numpy as np
import zmq


class EventfdPipe:
    """One direction of a hand-off: a deque, and an eventfd the receiver polls."""

    def __init__(self) -> None:
        self.items: deque[object] = deque()
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def put(self, item: object) -> None:
        self.items.append(item)
        os.eventfd_write(self.fd, 1)

    def poller(self) -> zmq.Poller:
        poller = zmq.Poller()
        poller.register(self.fd, zmq.POLLIN)
        return poller

    def take(self, poller: zmq.Poller) -> object:
        while not self.items:
            poller.poll(1000)
        os.eventfd_read(self.fd)
        return self.items.popleft()

    def close(self) -> None:
        os.close(self.fd)


class InprocPipe:
    """One direction of a hand-off: an inproc PAIR, the object passed by reference."""

    def __init__(self, context: zmq.Context, name: str) -> None:
        self.receiver = context.socket(zmq.PAIR)
        self.receiver.bind(f"inproc://{name}")
        self.sender = context.socket(zmq.PAIR)
        self.sender.connect(f"inproc://{name}")
        self.items: dict[int, object] = {}

    def put(self, item: object) -> None:
        self.items[id(item)] = item
        self.sender.send(id(item).to_bytes(8, "little"), copy=True)

    def poller(self) -> zmq.Poller:
        poller = zmq.Poller()
        poller.register(self.receiver, zmq.POLLIN)
        return poller

    def take(self, poller: zmq.Poller) -> object:
        poller.poll(1000)
        return self.items.pop(int.from_bytes(self.receiver.recv(), "little"))

    def close(self) -> None:
        self.receiver.close(0)
        self.sender.close(0)


def ping_pong(to_loop: EventfdPipe | InprocPipe, to_worker: EventfdPipe | InprocPipe, count: int) -> list[float]:
    """Half round trips, in us."""

    def loop() -> None:
        poller = to_loop.poller()
        for _ in range(count):
            to_worker.put(to_loop.take(poller))

    thread = threading.Thread(target=loop)
    thread.start()
    poller, halves = to_worker.poller(), []
    for i in range(count):
        start = time.perf_counter_ns()
        to_loop.put(i)
        to_worker.take(poller)
        halves.append((time.perf_counter_ns() - start) / 2000)
    thread.join()
    return halves


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-trips", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    context = zmq.Context()
    samples: dict[str, list[float]] = {"eventfd + deque": [], "inproc PAIR": []}
    each = args.round_trips // args.rounds
    for r in range(args.rounds):
        for way in sorted(samples, reverse=r % 2 == 1):
            if way == "eventfd + deque":
                pipes = (EventfdPipe(), EventfdPipe())
            else:
                pipes = (InprocPipe(context, f"a{r}"), InprocPipe(context, f"b{r}"))
            ping_pong(*pipes, 200)  # warm
            samples[way].extend(ping_pong(*pipes, each))
            for pipe in pipes:
                pipe.close()
    context.term()
    print(f"one hand-off between two threads sleeping in zmq_poll, us ({args.round_trips} round trips each):")
    for way, values in samples.items():
        p50, p99 = np.percentile(values, 50), np.percentile(values, 99)
        print(f"  {way:<16} p50 {p50:6.1f}   p99 {p99:6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
