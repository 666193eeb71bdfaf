"""The isolation benchmark, before and after: this checkout's daemon and another's, in
one interleaved run.

    python bench/isolation_compare.py --baseline DIR [--rounds 3] [--duration 5] [--json FILE]

The hard case of `edged bench --isolation` (realtime and a bulk flood, both on the
heavy model, every mechanism on), run by each daemon in turn, round after round, the
order swapped each round, so a box that slows down mid-run slows both alike. Bulk's
capacity is measured once, on this checkout, and both sides are offered the same
loads. The control is the spread of each side over its own rounds: a difference
between the sides inside it is not a difference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from paths import machine, machine_line

from edged.loadgen.isolation import BEST, FACTORS, run_isolation
from edged.loadgen.launch import checkout_program
from edged.loadgen.sweep import progress_to_stderr

CONFIG = "all on"
STEPS = ("alone", *map(str, FACTORS))


def realtime(result: dict[str, Any], step: str) -> dict[str, Any]:
    """Realtime's figures at one load step of a run (edged.loadgen.sweep's summary)."""
    return result["configs"][CONFIG][step]["classes"]["realtime"]


def table(runs: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "realtime p99 in ms, per round; median [min, max] over the rounds; the median of its p99 inside the "
        "daemon (timing_us); realtime OK share (worst round)",
        f"{'side':<9} {'step':>6} {'rounds':<32} {'median':>7} {'range':>15} {'inside':>7} {'ok':>8}",
    ]
    for side, results in runs.items():
        for step in STEPS:
            p99 = [realtime(r, step)["latency_us"]["p99"] / 1000 for r in results]
            inside = statistics.median(realtime(r, step)["in_daemon_us"]["p99"] / 1000 for r in results)
            ok = min(realtime(r, step)["ok_fraction"] for r in results)
            rounds = " ".join(f"{v:.2f}" for v in p99)
            spread = f"[{min(p99):.2f}, {max(p99):.2f}]"
            median = statistics.median(p99)
            lines.append(f"{side:<9} {step:>6} {rounds:<32} {median:>7.2f} {spread:>15} {inside:>7.2f} {ok:>8.2%}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the other checkout (a worktree of an earlier commit)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per load step")
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    args = parser.parse_args()
    sides = {
        "after": None,
        "before": checkout_program(args.baseline),
    }
    where = machine()
    print(machine_line(where), flush=True)
    capacity = run_isolation(args.duration, progress_to_stderr, configs=(BEST,))["bulk_capacity_rps"]
    print(f"bulk capacity alone ({BEST}, this checkout): {capacity:.1f} req/s", file=sys.stderr)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for round_ in range(args.rounds):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for side in order:
            print(f"round {round_ + 1} of {args.rounds}: {side}", file=sys.stderr)
            result = run_isolation(
                args.duration, progress_to_stderr, configs=(CONFIG,), capacity_rps=capacity, program=sides[side]
            )
            runs[side].append(result)
    text = table(runs)
    print(f"bulk capacity alone: {capacity:.1f} req/s of cnn-heavy; {args.duration:.0f} s a step\n{text}")
    if args.json:
        record = {
            "machine": where,
            "capacity_rps": capacity,
            "duration_s": args.duration,
            "baseline": args.baseline,
            "runs": runs,
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
