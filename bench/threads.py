"""What `[classes.NAME] threads = N` buys: the daemon's call beside an in-process session
with N threads, and what a spinning pool in one class costs another class.

    python bench/threads.py [--rounds 12] [--calls 8] [--seconds 3] [--out docs/threads.json]

Part 1, one run, interleaved (round after round, each way `--calls` calls in turn, so a
box that slows down mid-run slows every way alike), cnn-heavy at batch 1:
- in-process sessions of 1 and 2 threads: ONNX Runtime's default pool (it spins, and
  keeps spinning a while after a call), one that never spins (what edged did before),
  and one that spins and stops when the call ends (what edged's lanes do now);
- the daemon's call in classes of `threads` = 1 and 2, with `threads_spin` true and
  false: `timing_us.compute` (the backend call, inside the daemon) beside the round trip.
Ratios are each way's p50 over the in-process session of as many threads, spinning as
ONNX Runtime defaults.

Part 2: realtime mlp-light calls, one after another, while a client keeps two cnn-heavy
calls in flight in a bulk class of `threads = 2` (nice 10, yielding to realtime), its
pool spinning or not, and with no bulk at all; phases alternate. The realtime figure is
the round trip and `timing_us.total` (receipt to result, inside the daemon).

Prints lscpu's model and flags and the cores this process may use, and the load average at
the start and the end: on a shared box, say so beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from paths import machine, machine_line

from edged.client import Client, EdgedError
from edged.loadgen.launch import DaemonProcess

REPO_ROOT = Path(__file__).resolve().parents[1]
ENGINES = REPO_ROOT / "engines"
HEAVY = ENGINES / "cnn-heavy" / "model.onnx"
IMAGE = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
ROW = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
DEADLINE_MS = 5000.0  # nothing here is about shedding: every call must run

# name: (order, threads, threads_spin, nice, yields)
CLASSES = {
    "realtime": (0, 1, True, 0, False),
    "t2spin": (1, 2, True, 0, False),
    "t2sleep": (2, 2, False, 0, False),
    "bulkspin": (3, 2, True, 10, True),
    "bulksleep": (4, 2, False, 10, True),
}


def config_text(repository: Path) -> str:
    lines = [f'[server]\nmodel_repository = "{repository}"\ndefault_class = "realtime"\n']
    for name, (order, threads, spin, nice, yields) in CLASSES.items():
        lines.append(
            f"[classes.{name}]\norder = {order}\nthreads = {threads}\nthreads_spin = {str(spin).lower()}\n"
            f"nice = {nice}\nyields = {str(yields).lower()}\ndeadline_ms = {DEADLINE_MS}\nmax_batch = 1\n"
            f"queue_capacity = 64\nmax_call_ms = 0\n"
        )
    return "\n".join(lines)


def in_process(threads: int, allow: str | None, stop: bool) -> Callable[[], float]:
    """One call's seconds on a session of `threads`; `allow` None leaves spinning at ONNX Runtime's default."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if allow is not None:
        options.add_session_config_entry("session.intra_op.allow_spinning", allow)
    if stop:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    session = ort.InferenceSession(str(HEAVY), options, providers=["CPUExecutionProvider"])
    session.run(None, {"image": IMAGE})

    def call() -> float:
        start = time.perf_counter_ns()
        session.run(None, {"image": IMAGE})
        return (time.perf_counter_ns() - start) / 1e6

    return call


def daemon_call(client: Client, klass: str, computes: list[float]) -> Callable[[], float]:
    def call() -> float:
        start = time.perf_counter_ns()
        reply = client.infer_reply("cnn-heavy", {"image": IMAGE}, klass=klass, deadline_ms=DEADLINE_MS)
        trip = (time.perf_counter_ns() - start) / 1e6
        computes.append(reply.header["timing_us"]["compute"] / 1e3)
        return trip

    return call


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": round(float(np.percentile(values, 50)), 3),
        "p99_ms": round(float(np.percentile(values, 99)), 3),
    }


def part_threads(client: Client, rounds: int, calls: int) -> dict[str, Any]:
    computes: dict[str, list[float]] = {"daemon t1": [], "daemon t2 spin": [], "daemon t2 sleep": []}
    ways: dict[str, Callable[[], float]] = {
        "in-process t1": in_process(1, None, False),
        "in-process t2 spin (ORT default)": in_process(2, None, False),
        "in-process t2 spin, stopped after each call": in_process(2, "1", True),
        "in-process t2 no spin": in_process(2, "0", False),
        "in-process default threads (ORT default)": in_process(0, None, False),
        "daemon t1": daemon_call(client, "realtime", computes["daemon t1"]),
        "daemon t2 spin": daemon_call(client, "t2spin", computes["daemon t2 spin"]),
        "daemon t2 sleep": daemon_call(client, "t2sleep", computes["daemon t2 sleep"]),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, call in ways.items():
            times[name].extend(call() for _ in range(calls))
    rows: dict[str, Any] = {}
    for name, values in times.items():
        rows[name] = summary(values) | ({"compute": summary(computes[name])} if name in computes else {})
    floors = {1: rows["in-process t1"]["p50_ms"], 2: rows["in-process t2 spin (ORT default)"]["p50_ms"]}
    for name, row in rows.items():
        if "default threads" in name:
            continue
        floor = floors[1 if "t1" in name else 2]
        row["p50_over_in_process"] = round(row["p50_ms"] / floor, 2)
        if "compute" in row:
            row["compute"]["p50_over_in_process"] = round(row["compute"]["p50_ms"] / floor, 2)
    return rows


def bulk_flood(endpoint: str, klass: str, stop: threading.Event, done: list[int]) -> None:
    """Two cnn-heavy calls in flight in `klass`, from two threads, until `stop`."""

    def one() -> None:
        with Client(endpoint, timeout_ms=30_000) as client:
            while not stop.is_set():
                try:
                    client.infer("cnn-heavy", {"image": IMAGE}, klass=klass, deadline_ms=DEADLINE_MS)
                    done.append(1)
                except EdgedError:
                    time.sleep(0.001)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    stop.wait()
    for thread in threads:
        thread.join()


def part_neighbours(endpoint: str, client: Client, seconds: float, repeats: int) -> dict[str, Any]:
    phases = ("no bulk", "bulkspin", "bulksleep")
    trips: dict[str, list[float]] = {phase: [] for phase in phases}
    totals: dict[str, list[float]] = {phase: [] for phase in phases}
    bulk_calls: dict[str, int] = dict.fromkeys(phases, 0)
    for _ in range(repeats):
        for phase in phases:
            stop, done = threading.Event(), []
            flood = None
            if phase != "no bulk":
                flood = threading.Thread(target=bulk_flood, args=(endpoint, phase, stop, done))
                flood.start()
                time.sleep(0.2)  # the flood under way
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                start = time.perf_counter_ns()
                reply = client.infer_reply("mlp-light", {"x": ROW}, klass="realtime", deadline_ms=DEADLINE_MS)
                trips[phase].append((time.perf_counter_ns() - start) / 1e6)
                totals[phase].append(reply.header["timing_us"]["total"] / 1e3)
                time.sleep(0.002)  # a steady stream, not a flood of its own
            stop.set()
            if flood is not None:
                flood.join()
            bulk_calls[phase] += len(done)
    return {
        phase: {
            "realtime_round_trip": summary(trips[phase]),
            "realtime_inside_daemon": summary(totals[phase]),
            "bulk_calls_per_s": round(bulk_calls[phase] / (seconds * repeats), 1),
        }
        for phase in phases
    }


def show(result: dict[str, Any]) -> None:
    where = result["machine"]
    print(f"{machine_line(where)} at the start, {where['load_average_end']} at the end")
    print("\ncnn-heavy, batch 1: p50 / p99 ms (x the in-process session of as many threads, ORT's default spin)")
    for name, row in result["threads"].items():
        ratio = f"  x{row['p50_over_in_process']}" if "p50_over_in_process" in row else ""
        line = f"  {name:46} {row['p50_ms']:8.3f} / {row['p99_ms']:8.3f}{ratio}"
        if "compute" in row:
            compute = row["compute"]
            line += f"   compute {compute['p50_ms']:.3f} / {compute['p99_ms']:.3f}  x{compute['p50_over_in_process']}"
        print(line)
    print("\nrealtime mlp-light beside bulk cnn-heavy (threads = 2): round trip / inside the daemon, p50 / p99 ms")
    for phase, row in result["neighbours"].items():
        trip, inside = row["realtime_round_trip"], row["realtime_inside_daemon"]
        print(
            f"  {phase:10} {trip['p50_ms']:7.3f} / {trip['p99_ms']:7.3f}   {inside['p50_ms']:7.3f} / "
            f"{inside['p99_ms']:7.3f}   bulk {row['bulk_calls_per_s']} calls/s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0, help="each phase of part 2")
    parser.add_argument("--repeats", type=int, default=2, help="times each phase of part 2 runs")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "threads.json")
    args = parser.parse_args()
    result: dict[str, Any] = {"machine": machine(), "model": "cnn-heavy", "rounds": args.rounds, "calls": args.calls}
    folder = Path(tempfile.mkdtemp(prefix="ed-threads-", dir="/tmp"))
    try:
        repository = folder / "repo"
        for model in ("cnn-heavy", "mlp-light"):
            shutil.copytree(ENGINES / model, repository / model)
        config = folder / "edged.toml"
        config.write_text(config_text(repository))
        endpoint = f"ipc://{folder}/t.sock"
        with DaemonProcess([endpoint], config=config, log_path=folder / "daemon.log") as daemon:
            daemon.wait_serving(timeout_s=120)
            with Client(endpoint, timeout_ms=30_000) as client:
                result["threads"] = part_threads(client, args.rounds, args.calls)
                result["neighbours"] = part_neighbours(endpoint, client, args.seconds, args.repeats)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result["machine"]["load_average_end"] = os.getloadavg()
    show(result)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
