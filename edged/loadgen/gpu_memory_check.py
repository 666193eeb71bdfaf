"""The pure parts of the GPU memory checks (bench/gpu_check_memory.py and
bench/gpu_check_weights.py run them on a GPU): their daemon configs, the filler that
takes the card's memory down to a floor, the tables of each model's weights and each
lane's memory, and the verdict on whether the weights are held once. Here so that the
suite can check them without a GPU and without loading a script by path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from edged.config.file import default_repository

MIB = 1024 * 1024


def memory_configs() -> dict[str, str]:
    """The daemon configs of the memory check, by name. A config that names classes
    defines them all, so the cuda_graph one names the three built-in classes."""
    server = f'[server]\nbackend = "onnxruntime-cuda"\nmodel_repository = "{default_repository()}"\n'
    graphs = "[classes.realtime]\ncuda_graph = true\n[classes.standard]\n[classes.bulk]\n"
    return {"default classes": server, "realtime cuda_graph": server + graphs}


def fill(
    alloc: Callable[[int], Any | None],
    free_bytes: Callable[[], int],
    leave_bytes: int,
    largest: int = 256 * MIB,
    smallest: int = MIB,
) -> list[tuple[Any, int]]:
    """Allocate chunks, `largest` first, until less than `leave_bytes` plus one chunk of
    `smallest` is free: a chunk that fails, or would leave less than `leave_bytes`, halves
    the size. `alloc` returns a handle or None; returns [(handle, size)]."""
    chunks: list[tuple[Any, int]] = []
    size, budget = largest, free_bytes()
    while size >= smallest and sum(s for _, s in chunks) < budget:
        handle = alloc(size) if free_bytes() - size >= leave_bytes else None
        if handle is None:
            size //= 2
        else:
            chunks.append((handle, size))
    return chunks


def format_memory_table(lanes: list[dict[str, Any]]) -> str:
    """Planned against measured device memory, per config and lane, in MiB, beside the
    context's one-time share (the process's, measured once before the lanes)."""

    def mib(nbytes: int | None) -> str:
        return "-" if nbytes is None else f"{nbytes / MIB:.1f}"

    lines = ["| config | lane | planned MiB | measured MiB | context MiB |", "|---|---|---|---|---|"]
    lines += [
        f"| {lane['config']} | {lane['lane']} | {mib(lane['planned_bytes'])} | {mib(lane['measured_bytes'])} "
        f"| {mib(lane.get('context_bytes'))} |"
        for lane in lanes
    ]
    return "\n".join(lines)


def weights_config(repository: Path) -> str:
    """The weights check's daemon: the built-in classes (realtime with its inline path: a
    lane of two sessions, then standard and bulk) on onnxruntime-cuda, serving `repository`."""
    return f'[server]\nbackend = "onnxruntime-cuda"\nmodel_repository = "{repository}"\n'


def weights_rows(config: str, stats: dict[str, Any], models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A row per model (its weights, once) and per lane and model (the lane's own memory),
    from the `stats` and `models` replies of a daemon serving `config`."""
    rows: list[dict[str, Any]] = []
    for name, weights in stats["memory"]["weights"].items():
        rows.append({"config": config, "model": name, "lane": None} | weights)
    for model in models:
        file_bytes = stats["memory"]["weights"].get(model["name"], {}).get("file_bytes")
        for lane, plan in model.get("gpu_memory", {}).items():
            rows.append(
                {
                    "config": config,
                    "model": model["name"],
                    "lane": lane,
                    "sessions": plan["sessions"],
                    "file_bytes": file_bytes,
                    "planned_bytes": plan["planned_bytes"],
                    "measured_bytes": plan["lane_measured_bytes"],
                }
            )
    return rows


def weights_once(rows: list[dict[str, Any]]) -> list[str]:
    """Why the figures do not show each model's weights held once on the device ([] when
    they do): its weights took between 0.9 and 1.5 times its file once, and no lane took
    as much as half a copy per session of its own (a session with its own copy takes a whole one)."""
    failures = []
    for row in rows:
        if row["lane"] is None:
            taken, size = row["added_bytes"] or 0, row["file_bytes"]
            if not 0.9 * size <= taken <= 1.5 * size:
                failures.append(
                    f"model {row['model']}: its weights took {taken / MIB:.1f} MiB of the device, "
                    f"not one copy of its {size / MIB:.1f} MiB file"
                )
        elif (row["measured_bytes"] or 0) >= row["sessions"] * row["file_bytes"] / 2:
            failures.append(
                f"lane {row['lane']} took {row['measured_bytes'] / MIB:.1f} MiB for its {row['sessions']} sessions of "
                f"{row['model']} ({row['file_bytes'] / MIB:.1f} MiB of weights): as if they held copies of their own"
            )
    return failures


def format_weights_table(rows: list[dict[str, Any]]) -> str:
    """Each model's weights on the device, once, then each lane's own memory, in MiB."""

    def mib(nbytes: int | None) -> str:
        return "-" if nbytes is None else f"{nbytes / MIB:.1f}"

    lines = [
        "| config | model | lane | sessions | file MiB | planned MiB | measured MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        weights = row["lane"] is None
        lane, sessions = ("(weights, once)", "-") if weights else (row["lane"], row["sessions"])
        measured = row["added_bytes"] if weights else row["measured_bytes"]
        lines.append(
            f"| {row['config']} | {row['model']} | {lane} | {sessions} | {mib(row['file_bytes'])} "
            f"| {mib(row['planned_bytes'])} | {mib(measured)} |"
        )
    return "\n".join(lines)
