"""edged with its serving path compiled by mypyc, beside the same checkout run as Python and
the naive server, interleaved: the CPU a light request costs the serving process, and its
round trip. An experiment, not a build edged ships: it measures how much of the light
request's gap to the naive server is the interpreter running edged's own Python.

Each round starts each server afresh (a daemon's round trip depends on where its threads
land), warms it with 500 requests, then times `--requests` light requests one at a time
on the default class, in bench/paths.py's raw client (every reply must be OK). Needs mypy
(for mypyc) and a C compiler: `pip install mypy`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import msgpack
from paths import RoundTrips, helper_server, machine, machine_line

from edged.loadgen.launch import DaemonProcess, checkout_program, cpu_seconds

REPO = Path(__file__).resolve().parents[1]
# The modules a light request runs through. Left out: wire/fast.py (msgspec's Structs are
# not mypyc's to compile) and transport/binding.py (its exception subclasses a builtin).
SERVING = (
    "serve/dispatch.py",
    "serve/transport/loop.py",
    "serve/lanes/lane.py",
    "serve/lanes/batching.py",
    "serve/answers.py",
    "serve/admission.py",
    "serve/pricing.py",
    "serve/pending.py",
    "serve/stats.py",
    "metrics/histogram.py",
)
WARM = 500


def compiled_copy(modules: tuple[str, ...]) -> Path:
    """A copy of this checkout's package with `modules` compiled in place (its .so files
    are imported before the .py beside them); the demo models are linked, not copied."""
    root = Path(tempfile.mkdtemp(prefix="edged-compiled-"))
    shutil.copytree(REPO / "edged", root / "edged", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "engines").symlink_to(REPO / "engines")
    command = [sys.executable, "-m", "mypyc", *(f"edged/{module}" for module in modules)]
    built = subprocess.run(command, cwd=root, capture_output=True, text=True)
    if built.returncode != 0:
        sys.exit(f"mypyc failed (is mypy installed, and a C compiler?):\n{(built.stdout + built.stderr)[-3000:]}")
    return root


def timed(endpoint: str, pid: int, requests: int) -> dict[str, float]:
    """CPU us the server's process spent per request, and the round trip's p50 and p99 in us;
    exits unless every reply is OK (a server that failed would answer fast, and wrong)."""
    trips = RoundTrips(endpoint, None)
    try:
        trips("mlp-light", 0, WARM)
        cpu_before = cpu_seconds(pid)
        rows = trips.with_headers("mlp-light", requests, 0)
        cpu_us = (cpu_seconds(pid) - cpu_before) / requests * 1e6
    finally:
        trips.close()
    statuses = {msgpack.unpackb(header)["status"] for _, header in rows}
    if statuses != {"OK"}:
        sys.exit(f"replies from {endpoint} were {statuses}, not all OK")
    samples = sorted(elapsed_us for elapsed_us, _ in rows)
    return {
        "cpu_us": round(cpu_us, 1),
        "p50_us": round(samples[requests // 2], 1),
        "p99_us": round(samples[int(requests * 0.99)], 1),
    }


def serve_once(server: str, checkouts: dict[str, Path], requests: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="edged-compiled-") as folder:
        endpoint = f"ipc://{folder}/d.sock"
        if server == "naive":
            process = helper_server("naive_server", endpoint)
            try:
                return timed(endpoint, process.pid, requests)
            finally:
                process.terminate()
                process.wait()
        with DaemonProcess([endpoint], program=checkout_program(str(checkouts[server]))) as daemon:
            daemon.wait_serving()
            loaded = _compiled_loaded(daemon.process.pid, checkouts["compiled"])
            if loaded != (server == "compiled"):
                verb = "did not load" if server == "compiled" else "loaded"
                sys.exit(f"the {server} daemon {verb} the compiled modules")
            return {**timed(endpoint, daemon.process.pid, requests), "compiled_loaded": loaded}


def _compiled_loaded(pid: int, root: Path) -> bool:
    """Whether the process mapped the copy's compiled modules: else it ran Python after all."""
    return any(str(root) in line and line.rstrip().endswith(".so") for line in Path(f"/proc/{pid}/maps").open())


def measure(rounds: int, requests: int, modules: tuple[str, ...]) -> dict[str, Any]:
    checkouts = {"compiled": compiled_copy(modules), "python": REPO}
    servers = ["compiled", "python", "naive"]
    runs: dict[str, list[dict[str, float]]] = {server: [] for server in servers}
    try:
        for index in range(rounds):
            for server in servers if index % 2 == 0 else servers[::-1]:
                runs[server].append(serve_once(server, checkouts, requests))
                print(f"round {index + 1}/{rounds} {server}: {runs[server][-1]}", flush=True)
    finally:
        shutil.rmtree(checkouts["compiled"], ignore_errors=True)
    summary = {}
    for server, rows in runs.items():
        ratios = [row["p50_us"] / naive["p50_us"] for row, naive in zip(rows, runs["naive"])]
        summary[server] = {
            "cpu_us": statistics.median(row["cpu_us"] for row in rows),
            "p50_us": statistics.median(row["p50_us"] for row in rows),
            "p99_us": statistics.median(row["p99_us"] for row in rows),
            "rounds_p50_vs_naive": {
                "min": round(min(ratios), 3),
                "median": round(statistics.median(ratios), 3),
                "max": round(max(ratios), 3),
            },
        }
    return {"modules": list(modules), "rounds": rounds, "requests": requests, "summary": summary, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=4000, help="timed light requests per server per round")
    parser.add_argument("--modules", nargs="+", default=list(SERVING), help="modules under edged/ to compile")
    parser.add_argument("--json", type=Path, help="also write every round's figures here")
    args = parser.parse_args()
    where = machine()
    print(machine_line(where), flush=True)
    result = {"machine": where, **measure(args.rounds, args.requests, tuple(args.modules))}
    print(f"{'server':10} {'CPU us':>8} {'p50 us':>8} {'p99 us':>8}  p50 / naive's, by round (min, median, max)")
    for server, row in result["summary"].items():
        spread = row["rounds_p50_vs_naive"]
        print(
            f"{server:10} {row['cpu_us']:8.1f} {row['p50_us']:8.1f} {row['p99_us']:8.1f}"
            f"  {spread['min']:.3f}, {spread['median']:.3f}, {spread['max']:.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
