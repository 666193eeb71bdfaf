"""Where a light request's time goes inside the daemon: CPU and wall time per request of
each step of its path, beside the naive server's whole process CPU per request.

    python bench/hot_path.py [--requests 5000]

A fresh daemon, started through this script (`--serve`), wraps each step of the
serving path in a timer before it serves: the loop's read of a socket (with the
handling it leads to), receiving a message, looking for the next, decoding, admission and placement (`Lane.offer`,
with the inline run), the inline run, the backend call, the answer (with its send) and
the send. Closed-loop round trips of mlp-light in the default class on the shared
endpoint, as bench/compare.py's `edged` path sends them; then as many to the naive
server (bench/paths.py), whose process CPU per request is the figure to beat, and
its own steps' CPU (recv, decode, run, encode, send).
A step's figure includes the steps inside it; the timers' own cost is about 1 us of
CPU per wrapped call. Then the decisions one by one (DECISIONS: the checks, the inline
cap, the prices, admission, the bytes budget, the job, the backlog, the figures, the
claim), each net of its timer's own cost (a timed empty call, measured in the daemon).
The figures guide where to cut; bench/compare.py measures the result.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from paths import RoundTrips, helper_server, write_whole

STEPS: list[tuple[str, str, str]] = [  # (module, attribute, label), outermost first
    ("edged.serve.transport.loop", "Loop._receive", "read a socket and handle"),
    ("edged.serve.transport.binding", "Bound.read", "receive a message's frames"),
    ("edged.serve.transport.binding", "Bound.waiting", "look for a message behind it"),
    ("edged.serve.dispatch", "Dispatcher.handle", "handle"),
    ("edged.wire.fast", "decode_request", "decode"),
    ("edged.serve.lanes.lane", "Lane.offer", "admit and place (with the run)"),
    ("edged.serve.lanes.lane", "Lane._run_inline", "inline run"),
    ("edged.backends.onnxruntime_cpu", "OnnxRuntimeCpuRunner.run", "backend call"),
    ("edged.serve.answers", "Answers.result", "answer (with the send)"),
    ("edged.serve.transport.binding", "Bound.send", "send"),
]

# The decisions between decode and send, by group: (module, attribute, group). The claim
# gives the request's bytes back inside it.
DECISIONS: list[tuple[str, str, str]] = [
    ("edged.serve.dispatch", "Dispatcher._check_open", "checks: open, model, shapes"),
    ("edged.serve.dispatch", "Dispatcher._model", "checks: open, model, shapes"),
    ("edged.wire.signature", "Signature.check", "checks: open, model, shapes"),
    ("edged.wire.signature", "Signature.measure", "checks: open, model, shapes"),
    ("edged.serve.lanes.inline_cap", "InlineCap.limit_ns", "the inline cap"),
    ("edged.serve.pricing", "ServiceTimes.charge_ns", "the price: charge, measured"),
    ("edged.serve.pricing", "ServiceTimes.measured", "the price: charge, measured"),
    ("edged.serve.lanes.lane", "admit", "admission"),
    ("edged.serve.pending", "PendingBytes.take", "the bytes budget: take"),
    ("edged.serve.lanes.lane", "Job", "the job"),
    ("edged.serve.admission", "Backlog.add", "the backlog: add, finish"),
    ("edged.serve.admission", "Backlog.finish", "the backlog: add, finish"),
    ("edged.serve.stats", "ClassStats.call", "the figures: call, done"),
    ("edged.serve.stats", "ClassStats.done", "the figures: call, done"),
    ("edged.serve.answers", "Answers._claim", "the claim, giving the bytes back"),
    ("edged.serve.pricing", "ServiceTimes.observe", "the price's update (after the send)"),
]
TIMER = "a timed empty call"
NAIVE_STEPS = ("recv", "decode", "run", "encode", "send")  # the naive server's own (bench/paths.py)


def serve(figures: Path, argv: list[str]) -> int:
    """Run the daemon with every step timed, writing the totals to `figures` each second."""
    import importlib

    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # CPU ns, wall ns, calls

    def timed(function: Callable[..., Any], label: str) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
            try:
                return function(*args, **kwargs)
            finally:
                total = totals[label]
                total[0] += time.thread_time_ns() - cpu
                total[1] += time.perf_counter_ns() - wall
                total[2] += 1

        return step

    empty = timed(lambda: None, TIMER)
    for _ in range(10_000):
        empty()
    for module_name, attribute, label in [*STEPS, *DECISIONS]:
        owner: Any = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, name, timed(getattr(owner, name), label))

    def write() -> None:
        while True:
            time.sleep(1)
            write_whole(figures, json.dumps(dict(totals)))

    threading.Thread(target=write, daemon=True).start()
    from edged.cli.commands import main

    return main(argv)


def written_after(path: Path, since_ns: int, timeout_s: float = 60.0) -> dict[str, Any]:
    """The figures a server wrote after `since_ns` (wall clock): with its requests answered
    before then, every one is in them, however late a busy box runs its writer."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if path.exists() and path.stat().st_mtime_ns > since_ns:
            return json.loads(path.read_text())
        time.sleep(0.05)
    raise RuntimeError(f"{path} was not written within {timeout_s} s")


class Side(NamedTuple):
    """One server's run: its sorted round trips (us), process CPU (s), and the step
    figures it wrote before and after them."""

    samples: list[float]
    cpu_s: float
    before: dict[str, Any]
    after: dict[str, Any]


def run_side(endpoint: str, pid: int, figures: Path, requests: int) -> Side:
    """Warm a server, then time `requests` round trips, reading its CPU and its figures around them."""
    from edged.loadgen.launch import cpu_seconds

    trips = RoundTrips(endpoint, None)
    try:
        trips("mlp-light", 200, 50)
        before = written_after(figures, time.time_ns())
        cpu_before = cpu_seconds(pid)
        samples = sorted(trips("mlp-light", requests, 0))
        cpu_s = cpu_seconds(pid) - cpu_before
        return Side(samples, cpu_s, before, written_after(figures, time.time_ns()))
    finally:
        trips.close()


def measure(requests: int) -> dict[str, Any]:
    from edged.loadgen.launch import DaemonProcess

    with tempfile.TemporaryDirectory(prefix="edged-hot-") as folder:
        figures = Path(folder) / "steps.json"
        endpoint, naive_endpoint = f"ipc://{folder}/edged.sock", f"ipc://{folder}/naive.sock"
        program = [sys.executable, __file__, "--serve", str(figures), "--"]
        with DaemonProcess([endpoint], program=program) as daemon:
            daemon.wait_serving()
            samples, cpu_edged, before, after = run_side(endpoint, daemon.process.pid, figures, requests)
        naive_figures = Path(folder) / "naive.json"
        naive = helper_server("naive_server", naive_endpoint, steps=naive_figures)
        try:
            naive_samples, cpu_naive, naive_before, naive_after = run_side(
                naive_endpoint, naive.pid, naive_figures, requests
            )
        finally:
            naive.kill()
    served = naive_after["requests"] - naive_before["requests"]
    naive_steps = {step: round((naive_after[step] - naive_before[step]) / served / 1000, 1) for step in NAIVE_STEPS}

    def during(label: str) -> list[int]:
        """A step's CPU ns, wall ns and calls over the timed round trips."""
        return [a - b for a, b in zip(after.get(label, [0, 0, 0]), before.get(label, [0, 0, 0]))]

    steps = {}
    for _, _, label in STEPS:
        cpu, wall, calls = during(label)
        steps[label] = {
            "calls_per_request": round(calls / requests, 2),
            "cpu_us": round(cpu / requests / 1000, 1),
            "wall_us": round(wall / requests / 1000, 1),
        }
    timer_ns = after[TIMER][0] / after[TIMER][2]
    decisions: dict[str, dict[str, float]] = {}
    for label in dict.fromkeys(label for _, _, label in DECISIONS):
        cpu, _, calls = during(label)
        net_us = (cpu - calls * timer_ns) / requests / 1000
        decisions[label] = {"calls_per_request": round(calls / requests, 2), "cpu_us": round(net_us, 1)}
    return {
        "requests": requests,
        "edged": {"p50_us": round(samples[requests // 2], 1), "process_cpu_us": round(cpu_edged / requests * 1e6, 1)},
        "naive": {
            "p50_us": round(naive_samples[requests // 2], 1),
            "process_cpu_us": round(cpu_naive / requests * 1e6, 1),
            "steps_cpu_us": naive_steps,
        },
        "steps": steps,
        "decisions": decisions,
        "timer_cpu_us": round(timer_ns / 1000, 2),
    }


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        return serve(Path(sys.argv[2]), sys.argv[4:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    result = measure(args.requests)
    for side in ("edged", "naive"):
        row = result[side]
        print(f"{side:6} round trip p50 {row['p50_us']:7.1f} us, process CPU {row['process_cpu_us']:6.1f} us a request")
    print(f"{'step (a request, timed inside the daemon)':44} {'calls':>5} {'CPU us':>7} {'wall us':>7}")
    for label, step in result["steps"].items():
        print(f"{label:44} {step['calls_per_request']:5.2f} {step['cpu_us']:7.1f} {step['wall_us']:7.1f}")
    print(f"the decisions, each net of its timer ({result['timer_cpu_us']} us a call): CPU us a request")
    for label, decision in result["decisions"].items():
        print(f"{label:44} {decision['calls_per_request']:5.2f} {decision['cpu_us']:7.1f}")
    naive = result["naive"]["steps_cpu_us"]
    print("naive server's steps, CPU us a request: " + ", ".join(f"{step} {naive[step]}" for step in NAIVE_STEPS))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
