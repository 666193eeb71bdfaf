"""A burst on a busy box: what admission takes, and how much of it expires.

    python bench/busy_box.py [--runs 5] [--baseline DIR] [--json FILE]

One busy loop per core (plain Python at the default niceness) runs for the whole
benchmark. Each run starts a fresh daemon with the built-in classes, waits for it to
sample the box's load, and sends 1,000 bulk requests for cnn-heavy at once from 100
peers, each with 300 ms to live. Beside the loops bulk's workers get about half a core
(a tenth at nice 10, the built-in until 2026-11-29): a request admitted beyond what they
can finish in time expires in the queue (DEADLINE_EXCEEDED). With --baseline DIR (a worktree of an
earlier commit), each run gives the same burst to that checkout's daemon too,
interleaved. Prints, per daemon and run, the requests admitted and those that expired.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from edged.loadgen.burst import stampede
from edged.loadgen.launch import busy_loops, checkout_program, loaded_daemon

PEERS, PER_PEER, DEADLINE_MS = 100, 10, 300.0


def one_run(program: list[str] | None) -> dict[str, Any]:
    with loaded_daemon(program, "edged-busy-") as endpoint:
        burst = stampede(endpoint, PEERS, PER_PEER, deadline_ms=DEADLINE_MS)
    return {
        "admitted": burst.admitted,
        "expired": burst.statuses.get("DEADLINE_EXCEEDED", 0),
        "ok": burst.statuses.get("OK", 0),
        "lost": burst.lost,
        "duplicated": burst.duplicated,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", help="also run another checkout's daemon, interleaved with this one's")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    args = parser.parse_args()
    sides: dict[str, list[str] | None] = {"edged": None}
    if args.baseline:
        sides["baseline"] = checkout_program(args.baseline)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    with busy_loops():
        for run in range(args.runs):
            for name, program in sides.items():
                figures = one_run(program)
                runs[name].append(figures)
                print(
                    f"run {run + 1} {name:<8} admitted {figures['admitted']:>3}  expired {figures['expired']:>3}  "
                    f"ok {figures['ok']:>3}  lost {figures['lost']}  duplicated {figures['duplicated']}",
                    flush=True,
                )
    for name, figures in runs.items():
        admitted = sum(f["admitted"] for f in figures)
        expired = sum(f["expired"] for f in figures)
        print(f"{name}: {expired} of {admitted} admitted expired over {len(figures)} runs")
    if args.json:
        args.json.write_text(json.dumps({"busy_loops": len(os.sched_getaffinity(0)), "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
