"""What a burst of shed requests costs the daemon's CPU, by thread, beside the bare floor's.

    python bench/shed_cpu.py [--rounds 4] [--bursts 2] [--peers 500] [--per-peer 20]
                             [--baseline DIR] [--json FILE]

In each round, in an order swapped from round to round: the floor (bench/burst.py's bare
ROUTER, in a process of its own), then a fresh edged (the built-in configuration, on
ipc), and, with --baseline DIR, a fresh daemon of another checkout. Each gets `--bursts`
bursts of `--peers` peers each sending `--per-peer` bulk cnn-heavy requests at once with a
1 ms deadline, under the model's own run: every request is shed, none computes. An edged
daemon takes each burst on the shared endpoint (read by the default class's loop and handed
to bulk's) and again on bulk's own socket (read and shed by bulk's loop). Reported: the
medians over the bursts of the time to answer all and of each thread's CPU a request (from
/proc, in ticks of 10 ms: 1 us a request at 10,000 requests), the Python threads summed
apart from ZeroMQ's I/O threads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from burst import running_floor
from paths import machine, machine_line

from edged.loadgen.burst import stampede
from edged.loadgen.launch import DaemonProcess, checkout_program, thread_cpu_seconds
from edged.wire.endpoints import class_endpoint

DEADLINE_MS = 1.0  # under cnn-heavy's own 2 ms run: admission sheds every request


def bursts(endpoint: str, pid: int, args: argparse.Namespace, answer: str = "OVERLOADED") -> list[dict[str, Any]]:
    """`args.bursts` bursts at `endpoint`, each answered `answer` alone (the floor's OK, edged's
    shed); for each, the time to answer all and the CPU us a request by thread."""
    requests = args.peers * args.per_peer
    figures = []
    for _ in range(args.bursts):
        before = thread_cpu_seconds(pid)
        burst = stampede(endpoint, args.peers, args.per_peer, DEADLINE_MS).summary()
        after = thread_cpu_seconds(pid)
        if burst["lost"] or burst["duplicated"] or set(burst["statuses"]) != {answer}:
            raise SystemExit(f"a burst not all answered {answer}, or with requests lost or answered twice: {burst}")
        cpu = {name: (after[name] - before.get(name, 0.0)) * 1e6 / requests for name in after}
        figures.append({"seconds": burst["seconds_to_answer_all"], "cpu_us": {k: v for k, v in cpu.items() if v}})
    return figures


def floor_path(folder: str, args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    endpoint = f"ipc://{folder}/floor.sock"
    with running_floor(endpoint) as server:
        return {"floor": bursts(endpoint, server.pid, args, answer="OK")}


def edged_paths(program: list[str] | None) -> Callable[[str, argparse.Namespace], dict[str, list[dict[str, Any]]]]:
    def run(folder: str, args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
        name = "edged" if program is None else "baseline"
        endpoint = f"ipc://{folder}/{name}.sock"
        with DaemonProcess([endpoint], None, Path(folder) / f"{name}.log", program=program) as daemon:
            daemon.wait_serving()
            pid = daemon.process.pid
            own = class_endpoint(endpoint, "bulk")
            assert own is not None
            return {
                f"{name}, shared endpoint": bursts(endpoint, pid, args),
                f"{name}, bulk's socket": bursts(own, pid, args),
            }

    return run


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the bursts: the seconds, and each thread's CPU us a request."""
    names = sorted({name for run in runs for name in run["cpu_us"]})
    threads = {name: statistics.median(run["cpu_us"].get(name, 0.0) for run in runs) for name in names}
    python = [sum(v for k, v in run["cpu_us"].items() if not k.startswith("ZMQ")) for run in runs]
    return {
        "seconds": statistics.median(run["seconds"] for run in runs),
        "python_us": statistics.median(python),
        "threads_us": threads,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--bursts", type=int, default=2, help="bursts a path takes each round")
    parser.add_argument("--peers", type=int, default=500)
    parser.add_argument("--per-peer", type=int, default=20)
    parser.add_argument("--baseline", help="also a daemon of another checkout (a worktree of an earlier commit)")
    parser.add_argument("--json", type=Path, help="write every burst's figures here")
    args = parser.parse_args()
    where = machine()
    print(machine_line(where), flush=True)
    paths = [floor_path, edged_paths(None)]
    if args.baseline:
        paths.append(edged_paths(checkout_program(args.baseline)))
    runs: dict[str, list[dict[str, Any]]] = {}
    for round_ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="edged-shed-cpu-") as folder:
            for path in paths if round_ % 2 == 0 else reversed(paths):
                for name, figures in path(folder, args).items():
                    runs.setdefault(name, []).extend(figures)
    floor = summary(runs["floor"])
    print(
        f"{args.peers} peers x {args.per_peer} requests, all shed; medians of {args.rounds * args.bursts} bursts a path"
    )
    for name, figures in runs.items():
        figure = summary(figures)
        threads = ", ".join(f"{thread} {us:.0f}" for thread, us in figure["threads_us"].items())
        print(
            f"{name:28s} {figure['seconds']:.3f} s ({figure['seconds'] / floor['seconds']:.2f}x the floor); "
            f"Python threads {figure['python_us']:.0f} us a request; by thread: {threads}",
            flush=True,
        )
    if args.json:
        document = {"machine": where, "peers": args.peers, "per_peer": args.per_peer, "runs": runs}
        args.json.write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
