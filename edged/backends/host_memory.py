"""The process's memory on the host, and the plan that keeps it under
`server.memory_limit_mb`: checked before any weights load, then as measured.

The plan counts each model's weights once per copy its lanes need (edged.backends.shared:
one, plus one per CPU lane with a pool of threads), at the size of its file, and only
the copies not already held (a reload that changes nothing loads no weights; a file
replaced loads beside the old until the old lanes drain, and is counted). What a lane
adds beyond the weights (its sessions' arenas grown by warm-up, its buffers) is not
known before it loads: it is measured, lane by lane, as the growth of the RSS, and the
whole must stay under the limit.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Sequence
from pathlib import Path

from edged.backends.gpu_memory import MIB, mib
from edged.backends.shared import Weights
from edged.config.classes import ClassConfig

FIX = "raise server.memory_limit_mb, serve fewer models, or give fewer classes threads > 1"
_PAGE = os.sysconf("SC_PAGE_SIZE")


class MemoryLimitError(RuntimeError):
    """A plan, or loaded lanes, past `server.memory_limit_mb`; says which model and lane."""


def rss_bytes() -> int:
    """The process's resident memory now."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * _PAGE


def _malloc_trim() -> ctypes._CFuncPtr | None:
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return getattr(libc, "malloc_trim", None)  # glibc's; musl has none


_TRIM = _malloc_trim()


def trim() -> int:
    """Give the allocator's free pages back to the system, where it is glibc; returns the RSS
    after. Loading a model parses its file whole and then packs the weights: the parsed
    copy, freed, stays resident otherwise (a 48 MiB model's first session: 81 MiB, 50 after;
    measured on the 2-core VM, 2026-11-25)."""
    if _TRIM is not None:
        _TRIM(0)
    return rss_bytes()


def check_weights(plans: Sequence[Weights], classes: Sequence[ClassConfig], rss_now: int, limit_bytes: int) -> None:
    """Refuse, naming the model and its lanes, weights that would take the process past
    `limit_bytes` from `rss_now`."""
    total = rss_now
    for plan in plans:
        total += plan.planned_bytes
        if total > limit_bytes:
            raise MemoryLimitError(
                f"model {plan.model} would not fit: its weights ({plan.new_copies} x {mib(plan.file_bytes)}) for "
                f"lanes {', '.join(c.name for c in classes)} would take the daemon to {mib(total)}, past "
                f"server.memory_limit_mb = {limit_bytes // MIB} ({mib(rss_now)} in use before): {FIX}"
            )


def check_lane(klass: str, models: Sequence[str], rss_now: int, limit_bytes: int) -> None:
    """Refuse a lane whose loading took the process past `limit_bytes`."""
    if rss_now > limit_bytes:
        raise MemoryLimitError(
            f"lane {klass} took the daemon to {mib(rss_now)} while it loaded {', '.join(models)}, past "
            f"server.memory_limit_mb = {limit_bytes // MIB}: {FIX}, or lower the lane's max_batch or workers"
        )
