"""Put edged beside its floors and a naive server, on the same models, in one run.

    python bench/compare.py [--quick] [--rounds N] [--skip-overload] [--write-docs] [--baseline DIR] [--tcp]
                            [--shared-apart]

Unloaded round trips, interleaved: every server is started first, then each round
measures every path on every model, in an order rotated from round to round, so a
box that slows down mid-run slows every path alike. The paths (the floors, the naive
server and the client in bench/paths.py):
  in-process    the model run by onnxruntime in this process (the compute floor)
  zmq echo      a bare DEALER/ROUTER round trip of a request-sized message (the transport floor)
  naive server  one thread: recv, decode, run, reply (what edged must not be worse than)
  naive again   a second naive server, the same code in its own process: the control.
                Its ratios to the first are what two identical servers differ by in this
                run, on this box; a ratio of edged's inside that band is not a difference
  edged         the daemon, same requests, same raw DEALER client, default configuration;
                the requests name no class (the default class, on the shared endpoint)
  edged_realtime the same daemon, realtime on its own socket (as the client library sends it;
                with --tcp, the socket of realtime's tcp_port)
  edged_realtime_shared the same daemon, realtime named on the shared endpoint (what a client
                that opens no class socket sends): handed to realtime's loop and its reply
                back, two hand-offs between threads. With --shared-apart, a daemon of its
                own: on `edged`'s, these requests keep the default class's inline cap at a
                tenth of realtime's deadline while they come, and for 10-20 s after
  edged_baseline given --baseline DIR: the daemon of another checkout (a worktree of an
                earlier commit, say), default configuration, default class: before and
                after, one run
  pytriton      a Triton server through PyTriton, given --triton-python: an interpreter
                with nvidia-pytriton installed (see compare_triton.py)
Round trips are closed-loop (one request at a time), timed in the client, in many
rounds (20 by default, 300 round trips per path and model in each), short enough that
a burst of noise from the host lands on every path alike rather than on whichever ran
during it, long enough that each server runs warm. A round's p50 is compared; p99 and
p99.9 come from all the rounds pooled, beside the control's (a round's p99, from 300
samples, is its third-slowest).
With --tcp every server listens on a port of 127.0.0.1 rather than an ipc socket.
Then an open-loop load at the naive server's own capacity, offered to the naive
server and to edged in turn; then the overload scenario: bulk floods the heavy model
at 3x its capacity while realtime sends to the light model.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from paths import (
    MODEL_INPUTS,
    MODELS,
    ROOT,
    WARMUP,
    InProcess,
    RoundTrips,
    dealer,
    helper_server,
    machine,
    machine_line,
)

from edged.loadgen.launch import DaemonProcess, checkout_program, cpu_seconds
from edged.loadgen.sweep import Stream, format_table, progress_to_stderr, run_load
from edged.wire.codec import encode_request
from edged.wire.endpoints import class_endpoint

PATHS = ("in_process", "zmq_echo", "naive_server", "naive_again", "edged", "edged_realtime", "edged_realtime_shared")
# Each set beside the naive server, round by round and pooled; naive_again is the control.
COMPARED = ("edged", "edged_realtime", "edged_realtime_shared", "naive_again")
# The class each edged path's requests name: edged takes the default class on the shared
# endpoint (what a client that names none gets); edged_realtime is realtime on its own
# socket (what the client library does when it names the class); edged_realtime_shared,
# realtime on the shared endpoint.
PATH_CLASS = {"edged": None, "edged_realtime": "realtime", "edged_realtime_shared": "realtime", "edged_baseline": None}
WARMUP_BETWEEN = 20  # before each later round's: a path idles while the others run


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def percentiles(samples_us: list[float]) -> dict[str, float]:
    values = np.array(samples_us)
    return {k: round(float(np.percentile(values, q)), 1) for k, q in (("p50", 50), ("p99", 99), ("p999", 99.9))}


def interleaved(paths: dict[str, Any], runs: dict[str, int], rounds: int, compared: tuple[str, ...]) -> dict[str, Any]:
    """Every path on every model, `rounds` times in rotated order; pooled percentiles
    per path, and the `compared` paths' p50 ratios to the naive server in each round."""
    samples: dict[str, dict[str, list[float]]] = {m: {p: [] for p in paths} for m in MODELS}
    per_round: dict[str, list[dict[str, float]]] = {m: [] for m in MODELS}
    names = list(paths)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for model in MODELS:
            this_round = {}
            for path in order:
                measured = paths[path](model, runs[model] // rounds, WARMUP_BETWEEN if r else WARMUP)
                samples[model][path].extend(measured)
                this_round[path] = float(np.median(measured))
            naive = this_round["naive_server"]
            per_round[model].append({f"{path}_p50_vs_naive": round(this_round[path] / naive, 3) for path in compared})
            if (r + 1) % 10 == 0 or r + 1 == rounds:
                sys.stderr.write(f"round {r + 1}/{rounds} {model}: {per_round[model][-1]}\n")
    return {
        model: {"pooled": {p: percentiles(s) for p, s in by_path.items()}, "rounds": per_round[model]}
        for model, by_path in samples.items()
    }


def idle_cpu_percent(pid: int, seconds: float = 10.0) -> float:
    """The share of one core a process uses while nobody sends it anything."""
    before, start = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return round(100 * (cpu_seconds(pid) - before) / (time.monotonic() - start), 2)


def saturation_rps(endpoint: str, model: str, seconds: float = 3.0, window: int = 8) -> float:
    """What a server completes per second with `window` requests always outstanding."""
    name, shape = MODELS[model]
    x = np.zeros(shape, np.float32)
    frames = [bytes(f) for f in encode_request(1, model=model, klass="realtime", inputs={name: x})]
    sock = dealer(endpoint)
    try:
        for _ in range(window):
            sock.send_multipart(frames)
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            if not sock.poll(10_000):
                raise RuntimeError(f"no reply from {endpoint}")
            sock.recv_multipart()
            done += 1
            sock.send_multipart(frames)
        rate = done / (time.perf_counter() - start)
        for _ in range(window):  # drain, so the next measurement starts from an idle server
            if not sock.poll(10_000):
                raise RuntimeError(f"no reply from {endpoint} while draining")
            sock.recv_multipart()
        return rate
    finally:
        sock.close()


def at_naive_capacity(endpoints: dict[str, str], duration: float, rounds: int) -> dict[str, Any]:
    """Open-loop Poisson load at the naive server's own saturation rate, offered to the
    naive server and to edged in turn (edged's default class, its deadline). The heavy model
    only: the naive server completes about 20,000 light requests a second, more than
    one Python generator can offer on time (its send lag is in the figures)."""
    results: dict[str, Any] = {}
    for model in ("cnn-heavy",):
        capacity = saturation_rps(endpoints["naive_server"], model)
        row: dict[str, Any] = {"naive_capacity_rps": round(capacity, 1)}
        for r in range(rounds):
            for path in ("naive_server", "edged") if r % 2 == 0 else ("edged", "naive_server"):
                stream = Stream("standard", model, capacity, None)
                (summary,) = run_load(endpoints[path], [stream], MODEL_INPUTS, duration, seed=r)
                row.setdefault(path, []).append(summary)
                lat = summary["latency_us"]
                sys.stderr.write(
                    f"{model} at {capacity:.0f}/s, {path}: ok {summary['ok_fraction']:.4f} "
                    f"p50 {lat['p50']:.0f} p99 {lat['p99']:.0f} p99.9 {lat['p999']:.0f} us\n"
                )
        results[model] = row
    return results


def triton(python: str, runs: int, duration: float) -> dict[str, Any]:
    import sysconfig

    env = {**os.environ, "LD_LIBRARY_PATH": str(sysconfig.get_config_var("LIBDIR"))}
    script = str(ROOT / "bench" / "compare_triton.py")
    done = subprocess.run(
        [python, script, "--runs", str(runs), "--duration", str(duration)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def overload(endpoint: str, duration: float, heavy_ms: float) -> dict[str, Any]:
    """Realtime alone, bulk alone at saturation, then both with bulk at 3x capacity."""
    capacity = 1000 / heavy_ms
    realtime = Stream("realtime", "mlp-light", 50, 20.0)
    scenarios = {
        "realtime_alone": [realtime],
        "bulk_saturated": [Stream("bulk", "cnn-heavy", 1.5 * capacity, 5000.0)],
        "flood": [realtime, Stream("bulk", "cnn-heavy", 3 * capacity, 5000.0)],
    }
    results: dict[str, Any] = {"heavy_capacity_rps": round(capacity, 1)}
    for name, streams in scenarios.items():
        rows = run_load(endpoint, streams, MODEL_INPUTS, duration, progress=progress_to_stderr)
        sys.stderr.write("\n")
        print(f"\n{name}:\n{format_table(rows)}")
        results[name] = rows
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests, shorter load runs")
    parser.add_argument("--rounds", type=int, help="interleaved rounds of the unloaded paths (default 20; 5 --quick)")
    parser.add_argument("--skip-overload", action="store_true", help="leave out the bulk-flood scenario")
    parser.add_argument("--write-docs", action="store_true", help="write docs/benchmarks.json")
    parser.add_argument("--triton-python", help="a Python with nvidia-pytriton, to add Triton to the comparison")
    parser.add_argument("--baseline", help="a checkout whose daemon runs beside this one's, as edged_baseline")
    parser.add_argument("--tcp", action="store_true", help="every path on a port of 127.0.0.1, not an ipc socket")
    parser.add_argument("--config", type=Path, help="this checkout's daemon's configuration file (ipc only)")
    parser.add_argument(
        "--shared-apart",
        action="store_true",
        help="edged_realtime_shared on a daemon of its own: realtime's deadline read on the shared endpoint "
        "keeps the default class's inline cap at a tenth of it for 10-20 s (docs/operations.md); ipc only, and "
        "not with a --config that sets a tcp_port, which both daemons would bind",
    )
    args = parser.parse_args()
    if args.config and args.tcp:
        parser.error("--config and --tcp: --tcp writes a configuration of its own")
    if args.shared_apart and args.tcp:
        parser.error("--shared-apart and --tcp: both daemons would bind realtime's tcp_port")
    runs = {"mlp-light": 600 if args.quick else 6000, "cnn-heavy": 150 if args.quick else 6000}
    args.rounds = args.rounds or (5 if args.quick else 20)
    duration = 5.0 if args.quick else 20.0
    names = PATHS + (("edged_baseline",) if args.baseline else ())
    compared = COMPARED + (("edged_baseline",) if args.baseline else ())
    results: dict[str, Any] = {"machine": machine(), "runs": runs, "rounds": args.rounds, "load_duration_s": duration}
    results["compared"] = compared
    with tempfile.TemporaryDirectory(prefix="edged-cmp-") as folder, contextlib.ExitStack() as stack:
        if args.tcp:
            endpoints = {mode: f"tcp://127.0.0.1:{free_port()}" for mode in names[1:]}
            realtime_port = free_port()
            config: Path | None = Path(folder) / "edged.toml"
            config.write_text(f"[classes.realtime]\ntcp_port = {realtime_port}\n[classes.standard]\n[classes.bulk]\n")
        else:
            endpoints = {mode: f"ipc://{folder}/{mode}.sock" for mode in names[1:]}
            realtime_port, config = None, args.config
        endpoints["edged_realtime"] = class_endpoint(endpoints["edged"], "realtime", realtime_port) or ""
        if not args.shared_apart:
            endpoints["edged_realtime_shared"] = endpoints["edged"]
        results["transport"] = "tcp" if args.tcp else "ipc"
        helpers = [helper_server(mode, endpoints[mode]) for mode in ("zmq_echo", "naive_server", "naive_again")]
        clients: list[RoundTrips] = []
        try:
            daemon = stack.enter_context(DaemonProcess([endpoints["edged"]], config=config))
            started = [daemon]
            if args.shared_apart:
                shared = DaemonProcess([endpoints["edged_realtime_shared"]], config=config)
                started.append(stack.enter_context(shared))
            if args.baseline:
                baseline = checkout_program(args.baseline)
                started.append(stack.enter_context(DaemonProcess([endpoints["edged_baseline"]], program=baseline)))
            for each in started:
                each.wait_serving()
            idle_s = 3.0 if args.quick else 10.0
            results["edged_idle_cpu_percent"] = idle_cpu_percent(daemon.process.pid, idle_s)
            clients = [RoundTrips(endpoints[path], PATH_CLASS.get(path)) for path in names[1:]]
            paths = {"in_process": InProcess(), **dict(zip(names[1:], clients))}
            results["unloaded"] = interleaved(paths, runs, args.rounds, compared)
            results["at_naive_capacity"] = at_naive_capacity(endpoints, duration / 2, 2)
            if not args.skip_overload:
                heavy_ms = results["unloaded"]["cnn-heavy"]["pooled"]["in_process"]["p50"] / 1000
                results["overload"] = overload(endpoints["edged"], duration, heavy_ms)
        finally:
            for client in clients:
                client.close()
            for helper in helpers:
                helper.kill()
    if args.triton_python:
        results["triton"] = triton(args.triton_python, runs["mlp-light"], duration)
        for model, figures in results["triton"]["latency_us"].items():
            results["unloaded"][model]["pooled"]["pytriton"] = figures
    print(f"{machine_line(results['machine'])}; {results['transport']}")
    print(_unloaded_table(results["unloaded"]))
    print(f"edged at idle: {results['edged_idle_cpu_percent']}% of one core")
    print(json.dumps(_verdicts(results), indent=2))
    if args.write_docs:
        results["verdicts"] = _verdicts(results)
        (ROOT / "docs" / "benchmarks.json").write_text(json.dumps(results, indent=2) + "\n")


def _unloaded_table(unloaded: dict[str, Any]) -> str:
    lines = ["", f"{'model':<10} {'path':<21} {'p50 us':>8} {'p99 us':>8} {'p99.9 us':>9}"]
    for model, row in unloaded.items():
        for path, figures in row["pooled"].items():
            lines.append(f"{model:<10} {path:<21} {figures['p50']:>8} {figures['p99']:>8} {figures['p999']:>9}")
    return "\n".join(lines)


def _verdicts(results: dict[str, Any]) -> dict[str, Any]:
    verdicts: dict[str, Any] = {}
    for model, row in results["unloaded"].items():
        pooled = row["pooled"]
        floor = pooled["in_process"]["p50"] + pooled["zmq_echo"]["p50"]
        verdicts[model] = {"naive_p50_beyond_floors_us": round(pooled["naive_server"]["p50"] - floor, 1)}
        for path in results["compared"]:
            verdicts[model] |= {
                f"{path}_p50_vs_naive": round(pooled[path]["p50"] / pooled["naive_server"]["p50"], 3),
                f"{path}_p99_vs_naive": round(pooled[path]["p99"] / pooled["naive_server"]["p99"], 3),
                f"{path}_p50_minus_naive_us": round(pooled[path]["p50"] - pooled["naive_server"]["p50"], 1),
                f"{path}_p50_beyond_floors_us": round(pooled[path]["p50"] - floor, 1),
                f"{path}_rounds_p50_vs_naive": _spread([r[f"{path}_p50_vs_naive"] for r in row["rounds"]]),
            }
    for model, row in results["at_naive_capacity"].items():
        worst_p99 = {path: max(s["latency_us"]["p99"] for s in row[path]) for path in ("naive_server", "edged")}
        verdicts[model]["at_naive_capacity_p99_vs_naive"] = round(worst_p99["edged"] / worst_p99["naive_server"], 3)
        verdicts[model]["at_naive_capacity_edged_ok_fraction"] = min(s["ok_fraction"] for s in row["edged"])
    if "overload" in results:
        over = results["overload"]
        alone = over["realtime_alone"][0]
        flood_rt, flood_bulk = over["flood"]
        best_bulk = over["bulk_saturated"][0]["goodput_rps"]
        verdicts["flood"] = {
            "realtime_ok_fraction": round(flood_rt["ok_fraction"], 4),
            "realtime_p99_vs_alone": round(flood_rt["latency_us"]["p99"] / alone["latency_us"]["p99"], 2),
            "lost_requests": flood_rt["lost"] + flood_bulk["lost"],
            "shed_in_daemon_max_us": flood_bulk["shed_in_daemon_us_max"],
            "bulk_goodput_vs_best": round(flood_bulk["goodput_rps"] / best_bulk, 3) if best_bulk else None,
        }
    if "triton" in results:
        for model in MODELS:
            pooled = results["unloaded"][model]["pooled"]
            verdicts[model]["p99_triton_over_edged"] = round(pooled["pytriton"]["p99"] / pooled["edged"]["p99"], 1)
    return verdicts


def _spread(ratios: list[float]) -> dict[str, float]:
    """Per-round ratios as the reader needs them: the best, the median round, the worst."""
    return {"min": min(ratios), "median": round(float(np.median(ratios)), 3), "max": max(ratios)}


if __name__ == "__main__":
    main()
