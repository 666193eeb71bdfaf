"""`edged bench --isolation`: realtime against a bulk flood of the same heavy model.

The hard case for a priority daemon: both classes send `cnn-heavy`, so every bulk
batch competes with realtime for the same cores. For each configuration (every
mechanism on, then yield and cap each turned off in turn, then both off), one
freshly started daemon serves:
- realtime alone, at 50 requests/s (a quarter of bulk's capacity, if lower);
- the same realtime stream beside bulk at 0.5x, 1x, 2x and 3x its capacity, bulk
  offered by a process and a socket of its own.
Bulk's capacity is its goodput alone, offered far more than it can take, on the
configuration with every mechanism off (its best: the largest batches).
"""

from __future__ import annotations

import multiprocessing
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from edged.client import Client
from edged.loadgen.launch import DaemonProcess
from edged.loadgen.sweep import Stream, run_load

MODEL = "cnn-heavy"
REALTIME_RPS = 50.0
FACTORS = (0.5, 1.0, 2.0, 3.0)
# Each configuration's [classes.bulk] lines; the other two classes keep their defaults.
ABLATIONS: dict[str, str] = {
    "all on": "",
    "no yield": "yields = false\n",
    "no cap": "max_call_ms = 0\n",
    "all off": "yields = false\nmax_call_ms = 0\n",
}
BEST = "all off"


def _config(bulk_lines: str) -> str:
    return f"[classes.realtime]\n[classes.standard]\n[classes.bulk]\n{bulk_lines}"


def _bulk_figures(client: Client) -> dict[str, int]:
    bulk = client.stats()["classes"]["bulk"]
    return {"expired": bulk["expired"]}


def _step(client: Client, endpoint: str, streams: list[Stream], duration_s: float) -> dict[str, Any]:
    """One load step: each stream's figures, and what the daemon's own counters moved by.

    Each stream after the first is offered by a process and a socket of its own: sent
    from one socket, a realtime request would queue behind bulk's frames in the client
    and its pipe before the daemon ever saw it.
    """
    inputs = {m["name"]: m["inputs"] for m in client.models()}
    before = _bulk_figures(client)
    with ProcessPoolExecutor(max(len(streams) - 1, 1), mp_context=multiprocessing.get_context("spawn")) as pool:
        others = [pool.submit(run_load, endpoint, [stream], inputs, duration_s) for stream in streams[1:]]
        rows = run_load(endpoint, streams[:1], inputs, duration_s)
        rows += [future.result()[0] for future in others]  # a child's error is raised here
    after = _bulk_figures(client)
    return {
        "classes": {row["class"]: row for row in rows},
        "bulk_stats": {key: after[key] - before[key] for key in after},
    }


def run_isolation(
    duration_s: float,
    progress: Callable[[str], None] | None = None,
    *,
    configs: Sequence[str] = tuple(ABLATIONS),
    capacity_rps: float | None = None,
    program: list[str] | None = None,
) -> dict[str, Any]:
    """The figures of each of `configs` (every one by default), and bulk's capacity they
    are scaled by: `capacity_rps` if given, else measured first, on BEST. `program`
    replaces `python -m edged` (another checkout's daemon, for a before and after)."""
    results: dict[str, Any] = {"model": MODEL, "duration_s": duration_s, "configs": {}}
    if capacity_rps is not None:
        results["bulk_capacity_rps"] = capacity_rps
    elif BEST not in configs:
        configs = (BEST, *configs)
    with tempfile.TemporaryDirectory(prefix="edged-iso-") as folder:
        config = Path(folder) / "edged.toml"
        endpoint = f"ipc://{folder}/edged.sock"
        log_path = Path(folder) / "daemon.log"
        for name in sorted(configs, key=lambda n: n != BEST):
            config.write_text(_config(ABLATIONS[name]))
            with (
                DaemonProcess([endpoint], config=config, log_path=log_path, program=program) as daemon,
                Client(endpoint) as client,
            ):
                daemon.wait_serving()
                if "bulk_capacity_rps" not in results:
                    alone = _step(client, endpoint, [Stream("bulk", MODEL, 2000.0)], duration_s)
                    results["bulk_capacity_rps"] = alone["classes"]["bulk"]["goodput_rps"]
                capacity = results["bulk_capacity_rps"]
                realtime = Stream("realtime", MODEL, min(REALTIME_RPS, capacity / 4))
                steps = {"alone": _step(client, endpoint, [realtime], duration_s)}
                for factor in FACTORS:
                    if progress is not None:
                        progress(f"{name}: bulk at {factor}x capacity\n")
                    bulk = Stream("bulk", MODEL, factor * capacity)
                    steps[str(factor)] = _step(client, endpoint, [realtime, bulk], duration_s)
                results["configs"][name] = steps
    return results


def format_isolation(results: dict[str, Any]) -> str:
    """One line per configuration and load: realtime's percentiles and OK share, bulk's goodput."""
    capacity = results["bulk_capacity_rps"]
    alone_p99 = alone_p99_us(results)
    lines = [
        f"bulk capacity alone ({BEST}): {capacity:.1f} req/s of {results['model']}; "
        f"realtime p99 alone (median over the configurations): {alone_p99 / 1000:.2f} ms",
        f"{'config':<14} {'bulk load':>9} {'rt ok':>7} {'p50':>7} {'p99':>7} {'p99.9':>7} {'p99/alone':>9} "
        f"{'bulk good':>9} {'expired':>7}",
    ]
    for name, steps in results["configs"].items():
        for step, figures in steps.items():
            rt = figures["classes"]["realtime"]
            bulk = figures["classes"].get("bulk")
            lat = rt["latency_us"]
            good = f"{bulk['goodput_rps'] / capacity:>8.0%}" if bulk else f"{'-':>9}"
            lines.append(
                f"{name:<14} {step:>9} {rt['ok_fraction']:>7.2%} "
                + " ".join(f"{lat[k] / 1000:>7.2f}" for k in ("p50", "p99", "p999"))
                + f" {lat['p99'] / alone_p99:>9.2f} {good} {figures['bulk_stats']['expired']:>7}"
            )
    lines.append(
        "(realtime latency of OK replies in ms, from the intended send time; p99/alone against the median alone;"
        " bulk goodput as a share of its capacity alone)"
    )
    return "\n".join(lines)


def alone_p99_us(results: dict[str, Any]) -> float:
    """Realtime's p99 alone, the median over every configuration's alone step: with no
    bulk, no rule acts, so each is a sample of the same thing, and one alone is noisy."""
    return float(
        np.median([steps["alone"]["classes"]["realtime"]["latency_us"]["p99"] for steps in results["configs"].values()])
    )


def plot_isolation(results: dict[str, Any], path: str) -> None:
    """Realtime p99 against bulk load, one line per configuration."""
    from edged.loadgen.sweep import pyplot

    plt = pyplot()
    figure, ax = plt.subplots(figsize=(6, 4))
    for name, steps in results["configs"].items():
        factors = [0.0, *FACTORS]
        p99 = [steps[key]["classes"]["realtime"]["latency_us"]["p99"] / 1000 for key in ("alone", *map(str, FACTORS))]
        ax.plot(factors, p99, marker="o", label=name)
    ax.set_xlabel(f"bulk load ({results['model']}, multiples of its capacity alone)")
    ax.set_ylabel(f"realtime p99 (ms), {results['model']}")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
