"""The GPU benchmark's summary: the medians over repetitions, the "bulk saturates"
verdict and the Markdown table, from edged.loadgen.gpu_scenarios' results."""

from __future__ import annotations

import statistics
from typing import Any

from edged.loadgen.gpu_scenarios import BULK_ALONE, BULK_ALONE_2X

SATURATED_WITHIN = 0.10  # bulk saturates: twice the offered rate adds at most this share of rows/s
BUSY_PCT = 90.0  # bulk alone keeps the GPU busy: NVML's utilisation median at least this


def medians(repetitions: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per scenario and class, the median over the repetitions of each figure in the table;
    a scenario whose every run failed keeps its first error."""
    table = []
    for index in range(max(map(len, repetitions), default=0)):
        every = [runs[index] for runs in repetitions if index < len(runs)]  # a repetition cut short has fewer
        runs = [run for run in every if "classes" in run]
        failed = len(every) - len(runs)
        if not runs:
            table.append(
                {"scenario": every[0]["scenario"], "classes": [], "failed": failed, "error": every[0]["error"]}
            )
            continue
        rows = []
        for per_class in zip(*(run["classes"] for run in runs)):
            row = {"class": per_class[0]["class"], "offered_rps": per_class[0]["offered_rps"]}
            for key in ("sent_rps", "ok", "overloaded", "goodput_rps", "ok_rows_per_s"):
                row[key] = statistics.median(r[key] for r in per_class)
            latency = [r.get("latency_us", {}) for r in per_class]
            row["latency_us"] = {k: _median([lat.get(k) for lat in latency]) for k in ("p50", "p99", "p999")}
            rows.append(row)
        median_util = _median([run.get("gpu_util_pct") for run in runs])
        # A model the backend did not say (None) is not known to be all on the GPU either.
        cpu_nodes = sorted(
            {name for run in runs for name, on in (run.get("cpu_nodes") or {}).items() if on is not False}
        )
        table.append(
            {
                "scenario": runs[0]["scenario"],
                "classes": rows,
                "gpu_util_pct": median_util,
                "failed": failed,
                "cpu_nodes": cpu_nodes,
            }
        )
    return table


def _median(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def busy(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Does bulk alone keep the GPU busy (NVML's utilisation, sampled by nvidia-smi, at
    least BUSY_PCT)? The premise of every isolation verdict: beside a GPU with idle time,
    realtime's figures say nothing about contention. None without a bulk-alone run."""
    alone = next((r for r in results if r["scenario"] == BULK_ALONE and r["classes"]), None)
    if alone is None:
        return None
    util = alone.get("gpu_util_pct")
    if util is None:
        return {"busy": None, "verdict": "bulk keeps the GPU busy: UNKNOWN: no utilisation sample (nvidia-smi)"}
    ok = util >= BUSY_PCT
    verdict = (
        f"bulk keeps the GPU busy: {'yes' if ok else 'NO'}: median utilisation {util:.0f}% alone (>= {BUSY_PCT:.0f}%)"
    )
    return {"busy": ok, "util_pct": util, "verdict": verdict}


def gpu_figures(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether these are GPU figures: refused where a served model had a node on the CPU."""
    if not any(r["classes"] for r in results):
        return {"gpu": None, "verdict": "GPU figures: UNKNOWN: no run finished"}
    on_cpu = sorted({name for r in results for name in r.get("cpu_nodes", [])})
    if on_cpu:
        return {
            "gpu": False,
            "verdict": f"NOT a GPU figure: {', '.join(on_cpu)}: nodes on the CPU, or unknown (cpu_nodes)",
        }
    return {"gpu": True, "verdict": "GPU figures: every served model's nodes on the CUDA provider"}


def saturation(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Does bulk saturate the GPU? Its achieved rows/s alone at twice the offered rate
    against alone at the rate: within SATURATED_WITHIN, more load buys nothing. When the
    generator could not send much more at twice the rate, the comparison says nothing."""
    by_name = {result["scenario"]: result for result in results}
    if BULK_ALONE not in by_name or BULK_ALONE_2X not in by_name:
        return None
    if not by_name[BULK_ALONE]["classes"] or not by_name[BULK_ALONE_2X]["classes"]:
        return {"saturated": None, "verdict": "bulk saturates: UNKNOWN: a bulk-alone run failed"}
    once, twice = (next(r for r in by_name[n]["classes"] if r["class"] == "bulk") for n in (BULK_ALONE, BULK_ALONE_2X))
    rise = twice["ok_rows_per_s"] / once["ok_rows_per_s"] - 1 if once["ok_rows_per_s"] else float("inf")
    sent_rise = twice["sent_rps"] / once["sent_rps"] - 1 if once["sent_rps"] else 0.0
    figures = (
        f"{once['ok_rows_per_s']:.0f} rows/s at the rate, {twice['ok_rows_per_s']:.0f} at twice it ({rise:+.0%}; "
        f"sent {once['sent_rps']:.0f}/s and {twice['sent_rps']:.0f}/s)"
    )
    if sent_rise < 0.5:
        verdict = f"bulk saturates: UNKNOWN: the generator sent only {sent_rise:+.0%} more at twice the rate: {figures}"
        return {"saturated": None, "rise": rise, "sent_rise": sent_rise, "verdict": verdict}
    saturated = rise <= SATURATED_WITHIN
    verdict = f"bulk saturates: {'yes' if saturated else 'NO'} (within {SATURATED_WITHIN:.0%}): {figures}"
    return {"saturated": saturated, "rise": rise, "sent_rise": sent_rise, "verdict": verdict}


def format_table(device: str, repeats: int, results: list[dict[str, Any]], floor_us: dict[str, float] | None) -> str:
    """The medians as a Markdown table, one row per scenario and class."""
    lines = [
        f"device: {device}; median of {repeats} interleaved repetitions",
        "| scenario | class | offered/s | sent/s | ok | shed | good/s | ok rows/s | p50 ms | p99 ms | p99.9 ms "
        "| GPU util % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        if not result["classes"]:
            lines.append(f"| {result['scenario']} | FAILED ({result['failed']} of {repeats}): {result['error']} |")
            continue
        util = result.get("gpu_util_pct")
        util_text = "-" if util is None else f"{util:.0f}"
        failed = f" ({result['failed']} of {repeats} runs failed)" if result.get("failed") else ""
        for row in result["classes"]:
            lat = {k: (v if v is not None else float("nan")) for k, v in row["latency_us"].items()}
            lines.append(
                f"| {result['scenario']}{failed} | {row['class']} | {row['offered_rps']:.0f} | {row['sent_rps']:.0f} | "
                f"{row['ok']:.0f} | {row['overloaded']:.0f} | {row['goodput_rps']:.1f} | {row['ok_rows_per_s']:.0f} | "
                + " | ".join(f"{lat[k] / 1000:.3f}" for k in ("p50", "p99", "p999"))
                + f" | {util_text} |"
            )
    if floor_us is not None:
        lines.append(
            "| floor (in-process runner) | realtime | - | - | - | - | - | - | "
            + " | ".join(f"{floor_us[k] / 1000:.3f}" for k in ("p50", "p99", "p999"))
            + " | - |"
        )
    return "\n".join(lines)
