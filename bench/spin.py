"""What the loops' spin buys and what it costs (docs/benchmarks.md, "The spin").

Three servers in the same interleaved rounds: edged as configured by default (the spin up to
250 us), edged with `spin_max_us = 0` (it never spins: the control), and the naive server.
Each round, each server in turn (the order rotating): light round trips one at a time, the
client sending each request as the last answer comes (where the spin arms), then Poisson
arrivals at `--rate` requests a second (at 1,000 a second the gaps are past the spin: it
should not arm, and cost nothing). Beside each latency, the server process's CPU: for round
trips in us a request, for the Poisson load in percent of one core. Both edged daemons are
fresh, on ipc sockets, the default class; the generator runs on the same box.

    python bench/spin.py [--rounds N] [--requests N] [--rate R] [--seconds S] [--spin-max-us N] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
from paths import MODEL_INPUTS, WARMUP, RoundTrips, helper_server, machine, machine_line

from edged.client import Client
from edged.loadgen.launch import DaemonProcess, cpu_seconds
from edged.loadgen.sweep import Stream, run_load

SERVERS = ("edged", "edged_no_spin", "naive_server")


def spins(endpoint: str) -> int:
    """How many times edged's default class's loop has spun (the stats request's own turn included)."""
    with Client(endpoint) as client:
        return client.stats()["classes"]["standard"]["spins"]


def measure(
    endpoint: str, pid: int, edged: bool, requests: int, rate: float, seconds: float, seed: int
) -> dict[str, float]:
    """One server's round trips and Poisson load, each with the CPU its process used, and
    for edged the spins of each."""
    trips = RoundTrips(endpoint, None)
    counted = [spins(endpoint) if edged else 0]
    try:
        before = cpu_seconds(pid)
        samples = trips("mlp-light", requests, WARMUP)
        closed_cpu_us = (cpu_seconds(pid) - before) * 1e6 / (requests + WARMUP)
    finally:
        trips.close()
    counted.append(spins(endpoint) if edged else 0)
    before = cpu_seconds(pid)
    (summary,) = run_load(endpoint, [Stream("standard", "mlp-light", rate)], MODEL_INPUTS, seconds, seed=seed)
    open_cpu = 100 * (cpu_seconds(pid) - before) / seconds
    counted.append(spins(endpoint) if edged else 0)
    latency = summary["latency_us"]
    return {
        "closed_spins": counted[1] - counted[0],
        "open_spins": counted[2] - counted[1],
        "open_requests": summary["sent"],
        "closed_p50_us": float(np.percentile(samples, 50)),
        "closed_p99_us": float(np.percentile(samples, 99)),
        "closed_cpu_us_per_request": closed_cpu_us,
        "open_p50_us": latency["p50"],
        "open_p99_us": latency["p99"],
        "open_ok_fraction": summary["ok_fraction"],
        "open_cpu_percent": open_cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds (default 6)")
    parser.add_argument("--requests", type=int, default=3000, help="round trips per server a round (default 3000)")
    parser.add_argument("--rate", type=float, default=1000.0, help="Poisson arrivals a second (default 1000)")
    parser.add_argument("--seconds", type=float, default=4.0, help="each Poisson run's length (default 4)")
    parser.add_argument(
        "--spin-max-us",
        type=int,
        help="the first daemon's server.spin_max_us (default: the built-in); 0 makes the run an A/A check",
    )
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    args = parser.parse_args()
    rounds: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="edged-spin-") as folder, contextlib.ExitStack() as stack:
        endpoints = {server: f"ipc://{folder}/{server}.sock" for server in SERVERS}
        no_spin = Path(folder) / "no-spin.toml"
        no_spin.write_text("[server]\nspin_max_us = 0\n")
        own: Path | None = None
        if args.spin_max_us is not None:
            own = Path(folder) / "edged.toml"
            own.write_text(f"[server]\nspin_max_us = {args.spin_max_us}\n")
        daemons = {
            "edged": stack.enter_context(DaemonProcess([endpoints["edged"]], config=own)),
            "edged_no_spin": stack.enter_context(DaemonProcess([endpoints["edged_no_spin"]], config=no_spin)),
        }
        naive = helper_server("naive_server", endpoints["naive_server"])
        stack.callback(naive.kill)
        for daemon in daemons.values():
            daemon.wait_serving()
        pids = {**{name: daemon.process.pid for name, daemon in daemons.items()}, "naive_server": naive.pid}
        for r in range(args.rounds):
            order = SERVERS[r % 3 :] + SERVERS[: r % 3]
            row = {
                s: measure(endpoints[s], pids[s], s != "naive_server", args.requests, args.rate, args.seconds, r)
                for s in order
            }
            rounds.append(row)
            sys.stderr.write(f"round {r + 1}/{args.rounds}: " + _line(row) + "\n")
        with Client(endpoints["edged"]) as client:
            spin = {k: client.stats()["classes"]["standard"][k] for k in ("spin_us", "arrival_gap_us", "spins")}
        spun = {k: sum(row["edged"][k] for row in rounds) for k in ("closed_spins", "open_spins", "open_requests")}
    where = machine()
    print(machine_line(where))
    medians = {s: {k: statistics.median(row[s][k] for row in rounds) for k in rounds[0][s]} for s in SERVERS}
    ratios = {
        s: {
            k: statistics.median(row[s][k] / row["naive_server"][k] for row in rounds)
            for k in ("closed_p50_us", "closed_p99_us", "open_p50_us", "open_p99_us")
        }
        for s in SERVERS[:2]
    }
    print(f"medians over {args.rounds} rounds; in brackets, the median of each round's ratio to the naive server")
    heads = [
        ("closed p50", 16),
        ("closed p99", 16),
        ("CPU us/req", 10),
        ("open p50", 16),
        ("open p99", 16),
        ("CPU %", 6),
    ]
    print(f"{'server':<14} " + " ".join(f"{head:>{width}}" for head, width in heads))
    for s in SERVERS:
        m = medians[s]
        cells = [_cell(m, ratios.get(s), k) for k in ("closed_p50_us", "closed_p99_us")]
        cells2 = [_cell(m, ratios.get(s), k) for k in ("open_p50_us", "open_p99_us")]
        print(
            f"{s:<14} {cells[0]:>16} {cells[1]:>16} {m['closed_cpu_us_per_request']:>10.1f} "
            f"{cells2[0]:>16} {cells2[1]:>16} {m['open_cpu_percent']:>6.1f}"
        )
    print(f"edged's standard loop at the end: {spin}; its spins in all rounds: {spun}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": where,
                    "args": vars(args) | {"json": str(args.json)},
                    "rounds": rounds,
                    "medians": medians,
                    "ratios": ratios,
                    "spin": spin,
                    "spun": spun,
                },
                indent=2,
            )
            + "\n"
        )


def _cell(medians: dict[str, float], ratios: dict[str, float] | None, key: str) -> str:
    return f"{medians[key]:.1f}" + (f" ({ratios[key]:.2f}x)" if ratios else "")


def _line(row: dict[str, dict[str, float]]) -> str:
    return "; ".join(
        f"{s} {row[s]['closed_p50_us']:.0f} us {row[s]['closed_cpu_us_per_request']:.0f} us CPU, "
        f"open {row[s]['open_p50_us']:.0f} us {row[s]['open_cpu_percent']:.0f}%"
        for s in SERVERS
    )


if __name__ == "__main__":
    main()
