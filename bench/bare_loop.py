"""How much of a light request's round trip is edged's loop, and how much its serving
decisions: edged, edged with its decisions taken out, and the naive server, interleaved.

    python bench/bare_loop.py [--rounds 10] [--requests 2000] [--baseline DIR] [--json FILE]

Servers of mlp-light, each given closed-loop round trips in turn, round after round
(the default class, on the shared endpoint, as bench/compare.py's `edged` path sends them):
- edged: a fresh daemon, as shipped;
- edged, bare: a fresh daemon, started through this script (`--serve-bare`), whose
  handler runs each decoded inference request on its class's inline runner and sends
  the reply at once: edged's loop, sockets, decoder and encoder, with no routing checks,
  admission, placement, figures or prices between them. What edged costs with nothing
  to decide: its floor, for this loop;
- the naive server (bench/paths.py): one thread, recv, decode, run, reply;
- the naive server, polled: the same, but waiting as edged's loop waits (zmq_poll on its
  socket and an eventfd, then a receive that does not block): what that wait costs alone;
- given --baseline DIR, "edged, before": the daemon of another checkout (a worktree of
  an earlier commit), as shipped: a change's before and after in one run.
Per round and server: the round trip's p50 and p99, and the CPU that the server's
busiest thread (edged's loop; the naive server's one thread) used per request, read in
ns from /proc/PID/task/TID/schedstat. Reported: the medians over the rounds, and the
medians of each round's ratio to the naive server's in the same round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import msgpack
from paths import RoundTrips, helper_server, machine, machine_line

from edged.loadgen.launch import DaemonProcess, checkout_program, thread_run_seconds

SIDES = ("edged", "edged, bare", "naive", "naive, polled")
BEFORE = "edged, before"
NAIVE = {"naive": "naive_server", "naive, polled": "naive_polled"}  # side: bench/paths.py's helper_server path


def serve_bare(argv: list[str]) -> int:
    """Run the daemon with its handler cut down to decode, run inline, reply."""
    from edged.cli.commands import main
    from edged.serve import dispatch
    from edged.serve.transport import reply
    from edged.wire import fast
    from edged.wire.codec import tensor_views

    whole = dispatch.Dispatcher.handle

    def handle(self: Any, route: Any, frames: list[Any], received_ns: int, more: bool = False) -> None:
        request = fast.decode_request(frames, self.serving.config.limits)
        if request is None or request.op != "infer" or self.loaded is None:
            return whole(self, route, frames, received_ns, more)  # health, at start-up
        model = self._models[request.model]
        runner = self.loaded.lanes[self.klass]._on_loop[model.name]
        names = model.signature.output_names
        outputs = dict(zip(names, runner.run(tensor_views(request), names)))
        reply(route, fast.encode_ok(request.id, 0, 0, 0, outputs))
        return None

    dispatch.Dispatcher.handle = handle  # before the loops bind their handlers
    return main(argv)


def one_round(pid: int, trips: RoundTrips, requests: int, checked: bool) -> dict[str, float]:
    """A round's p50 and p99 (us) and the busiest thread's CPU per request (us)."""
    before = thread_run_seconds(pid)
    rows = trips.with_headers("mlp-light", requests, 0)
    after = thread_run_seconds(pid)
    if checked:  # edged's replies: a bare handler that failed would answer fast, and wrong
        statuses = {msgpack.unpackb(header)["status"] for _, header in rows}
        if statuses != {"OK"}:
            raise RuntimeError(f"replies were {statuses}, not all OK")
    samples = sorted(elapsed_us for elapsed_us, _ in rows)
    cpu_s = max(after[tid] - before.get(tid, 0.0) for tid in after)
    return {
        "p50_us": samples[requests // 2],
        "p99_us": samples[int(requests * 0.99)],
        "thread_cpu_us": cpu_s / requests * 1e6,
    }


def measure(rounds: int, requests: int, baseline: str | None = None) -> dict[str, Any]:
    sides = (*SIDES, BEFORE) if baseline else SIDES
    programs = {"edged": None, "edged, bare": [sys.executable, __file__, "--serve-bare", "--"]}
    if baseline:
        programs[BEFORE] = checkout_program(baseline)
    with tempfile.TemporaryDirectory(prefix="edged-bare-") as folder, contextlib.ExitStack() as stack:
        endpoints = {side: f"ipc://{folder}/{index}.sock" for index, side in enumerate(sides)}
        naive = {side: helper_server(path, endpoints[side]) for side, path in NAIVE.items()}
        for process in naive.values():
            stack.callback(process.kill)
        daemons = {
            side: stack.enter_context(DaemonProcess([endpoints[side]], program=program))
            for side, program in programs.items()
        }
        for daemon in daemons.values():
            daemon.wait_serving()
        pids = {side: daemon.process.pid for side, daemon in daemons.items()}
        pids |= {side: process.pid for side, process in naive.items()}
        trips = {side: RoundTrips(endpoint, None) for side, endpoint in endpoints.items()}
        for side in sides:
            trips[side]("mlp-light", 300, 50)
        runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        for number in range(rounds):
            # Each round in the other order: none is always first after the others ran.
            for side in sides if number % 2 == 0 else reversed(sides):
                runs[side].append(one_round(pids[side], trips[side], requests, side not in NAIVE))
        for client in trips.values():
            client.close()
    summary = {}
    for side in sides:
        summary[side] = {
            figure: {
                "median": round(statistics.median(run[figure] for run in runs[side]), 1),
                "to_naive": round(
                    statistics.median(run[figure] / peer[figure] for run, peer in zip(runs[side], runs["naive"])), 2
                ),
            }
            for figure in ("p50_us", "p99_us", "thread_cpu_us")
        }
    return {"rounds": rounds, "requests": requests, "summary": summary, "runs": runs}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-bare":
        return serve_bare(sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=2000, help="round trips per server per round")
    parser.add_argument("--baseline", help="a checkout (a worktree of an earlier commit) whose daemon runs beside")
    parser.add_argument("--json", type=Path, help="also write every round's figures here")
    args = parser.parse_args()
    where = machine()
    print(machine_line(where), flush=True)
    result = {"machine": where, **measure(args.rounds, args.requests, args.baseline)}
    print(f"{args.rounds} rounds of {args.requests} mlp-light round trips per server; medians (x the naive server's)")
    print(f"{'server':14} {'p50 us':>16} {'p99 us':>16} {'busiest thread CPU us':>24}")
    for side, figures in result["summary"].items():
        cells = [f"{figures[f]['median']:.0f} ({figures[f]['to_naive']:.2f}x)" for f in figures]
        print(f"{side:14} {cells[0]:>16} {cells[1]:>16} {cells[2]:>24}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
