"""The pure parts of the GPU memory check (bench/gpu_check_memory.py runs it on a GPU):
its daemon configs, the filler that takes the card's memory down to a floor, and the
table of planned against measured memory per lane. Here so that the suite can check
them without a GPU and without loading a script by path."""

from __future__ import annotations

from collections.abc import Callable
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
