"""The fleet targets of issue 14, measured: three daemons on ipc, the fleet client
(`edged.loadgen.fleet.run_fleet`) offering open-loop Poisson calls of mlp-light in the
realtime class, deadline 50 ms, while one daemon is harmed:

- kill: `kill -9` of one daemon halfway through a run at RATE_KILL calls/s, against
  the same run with no kill;
- flood: one daemon flooded by another client (`edged bench` on that daemon alone,
  cnn-heavy in the same class), against the same run unflooded;
- stop: one daemon stopped (SIGSTOP) for 50 ms every second, hedging off, then on.

    .venv/bin/python bench/fleet_targets.py [--duration 30] [--json out.json] [--only kill,flood,stop]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from edged.loadgen.fleet import format_fleet, run_fleet
from edged.loadgen.launch import DaemonProcess
from edged.loadgen.sweep import Stream

RATE_KILL = 2500.0  # half of what this client and three daemons sustained here (see docs/benchmarks.md)
RATE = 1000.0
DEADLINE_MS = 50.0
FLOOD = "realtime:cnn-heavy:600:50"
EDGED = [sys.executable, "-m", "edged"]


@contextmanager
def three_daemons(cores: list[str] | None = None) -> Iterator[list[DaemonProcess]]:
    """Three daemons, each pinned to its entry of `cores` (a taskset list) if given."""
    pins = [["taskset", "-c", core] for core in cores] if cores else [[], [], []]
    with tempfile.TemporaryDirectory(prefix="edged-fleet-") as folder, ExitStack() as stack:
        daemons = [
            stack.enter_context(DaemonProcess([f"ipc://{folder}/d{i}.sock"], program=[*pins[i], *EDGED]))
            for i in range(3)
        ]
        for daemon in daemons:
            daemon.wait_serving()
        yield daemons


def endpoints(daemons: list[DaemonProcess]) -> list[str]:
    return [daemon.endpoints[0] for daemon in daemons]


def later(delay_s: float, action: Callable[[], None]) -> Callable[[], None]:
    """An on_start hook: `action` on a thread of its own, `delay_s` after the run starts."""
    return lambda: threading.Timer(delay_s, action).start()


def kill(duration_s: float) -> dict[str, Any]:
    stream = Stream("realtime", "mlp-light", RATE_KILL, DEADLINE_MS)
    with three_daemons() as daemons:
        calm = run_fleet(endpoints(daemons), [stream], duration_s)
    with three_daemons() as daemons:
        victim = daemons[0].process.pid
        hook = later(duration_s / 2, lambda: os.kill(victim, signal.SIGKILL))
        killed = run_fleet(endpoints(daemons), [stream], duration_s, on_start=hook)
    return {"calm": calm, "killed": killed}


def flood(duration_s: float) -> dict[str, Any]:
    """On two cores the flood would take the whole machine, and measure that instead of
    the client: the flooded daemon and its flooder share core 0, as on a box of their
    own; the other two daemons and this client keep to the other cores. Both runs alike."""
    stream = Stream("realtime", "mlp-light", RATE, DEADLINE_MS)
    others = os.sched_getaffinity(0) - {0}
    rest = ",".join(str(core) for core in sorted(others))
    runs = {}
    for label in ("calm", "flooded"):
        with three_daemons(cores=["0", rest, rest]) as daemons:
            flooder = None
            if label == "flooded":
                command = ["taskset", "-c", "0", *EDGED, "bench", "--endpoint", daemons[0].endpoints[0]]
                command += ["--mix", FLOOD, "--duration", str(duration_s + 6)]
                flooder = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                time.sleep(3)  # the flood under way before the measured run, and until after it
            mine = os.sched_getaffinity(0)
            os.sched_setaffinity(0, others)
            try:
                runs[label] = run_fleet(endpoints(daemons), [stream], duration_s)
            finally:
                os.sched_setaffinity(0, mine)
            if flooder is not None:
                runs["flood_report"] = flooder.communicate()[0]
    return {**runs, "flood": FLOOD}


def stop(duration_s: float) -> dict[str, Any]:
    stream = Stream("realtime", "mlp-light", RATE, DEADLINE_MS)
    results = {}
    for hedge in (False, True):
        with three_daemons() as daemons:
            victim = daemons[0].process.pid
            done = threading.Event()

            def stutter(pid: int = victim, done: threading.Event = done) -> None:
                while not done.wait(0.95):
                    os.kill(pid, signal.SIGSTOP)
                    time.sleep(0.05)
                    os.kill(pid, signal.SIGCONT)

            try:
                results["hedge" if hedge else "no_hedge"] = run_fleet(
                    endpoints(daemons), [stream], duration_s, hedge=hedge, on_start=later(0, stutter)
                )
            finally:
                done.set()
                time.sleep(0.1)
                os.kill(victim, signal.SIGCONT)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per measured run (default 30)")
    parser.add_argument("--only", default="kill,flood,stop", help="which targets, comma separated")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    targets = {"kill": kill, "flood": flood, "stop": stop}
    figures = {}
    for name in args.only.split(","):
        figures[name] = targets[name](args.duration)
        for label, run in figures[name].items():
            if isinstance(run, dict) and "streams" in run:
                print(f"\n== {name}: {label}\n{format_fleet(run)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
