"""Priority classes: what each is promised, and the lane reserved for it."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from typing import Any

from edged.config.class_keys import CLASS
from edged.config.settings import ConfigError, expect, no_unknown, read_bool, read_int
from edged.wire.endpoints import CLASS_NAME


@dataclass(frozen=True, slots=True)
class ClassConfig:
    """One priority class and the lane reserved for it."""

    name: str
    # Where the class is listed (stats, health) and its lane started, 0 first. Also its
    # rank, a lower order being a higher class: precedence goes by it (a class that yields
    # waits for the work of lower orders; a derived max_call_ms is a share of the first
    # class's deadline), the first class's loop is the top one, which may run a cheap job
    # inline with requests behind it (edged.serve.dispatch), and the first class gets cores
    # of its own where resolve_cores splits them. Beyond that every class has a lane of its
    # own, and nice, cpu_affinity and stream_priority divide the machine.
    order: int
    queue_capacity: int = 64
    deadline_ms: float = 100.0  # default budget of a request that names none
    workers: int = 1
    max_batch: int = 1  # the most rows one backend call may carry (requests are not split)
    batch_wait_us: int = 0  # how long a worker may wait to fill a batch; 0 for latency classes
    # Run a job priced this cheap on the class's loop, now, when its lane is idle (0:
    # never): a hand-off to a worker and back would cost it more. The loop reads no request
    # meanwhile. None: derived as it serves (edged.serve.lanes.inline_cap).
    inline_max_us: int | None = None
    threads: int = 1  # ONNX Runtime intra-op threads of this lane's sessions
    # With threads other than 1: the pool's threads spin between the pieces of a call (as
    # an in-process session's do), and stop when the call ends; else they sleep there.
    # None: spin where the lane has cores of its own (resolve_spin).
    threads_spin: bool | None = None
    cpu_affinity: tuple[int, ...] = ()  # cores the lane's threads run on; empty: any
    # Linux thread niceness of the lane's workers. 0 for every built-in class: a niced worker
    # the kernel sets aside while it holds the interpreter lock stalls every other thread.
    nice: int = 0
    tcp_port: int | None = None  # a socket of its own beside each tcp endpoint, on this port; None: none
    stream_priority: int = 0  # CUDA stream priority for GPU backends (lower is more urgent)
    sm_count: int = 0  # GPU backends: run the lane's kernels in a green context of this many SMs; 0: all
    # GPU backends: ONNX Runtime's memory arena cap for the lane, split between its
    # sessions (gpu_mem_limit); 0: uncapped. A cap, not a reservation: arenas grow lazily.
    arena_cap_mb: int = 0
    cuda_graph: bool = False  # GPU backends: replay a captured CUDA graph per batch size (fixed shapes only)
    stuck_after_ms: int = 10_000  # a backend call open this long is answered INTERNAL and its worker replaced; 0: never
    # Precedence (edged.serve.lanes.precedence). A class that yields starts no backend call
    # while a higher class has work queued or running; its calls are sized to finish
    # within max_call_ms (None: a quarter of the highest class's deadline; 0: no cap).
    yields: bool = False
    max_call_ms: float | None = None

    @property
    def runs_inline(self) -> bool:
        """Whether its loop may run jobs itself (edged.serve.lanes.lane): inline_max_us set
        above 0, or left out on a class that does not wait to fill batches."""
        return bool(self.inline_max_us) if self.inline_max_us is not None else not self.batch_wait_us

    @property
    def gives_way(self) -> bool:
        """Whether the lane yields to higher classes or runs niced: the lane a burst read
        by a loop starves first, whose pace admission watches as it goes and
        trusts only as far as it has seen it (edged.serve.admission.Backlog.outlook)."""
        return self.yields or self.nice > 0


# Settings of earlier versions, refused by name with what replaced them.
REMOVED = {
    "spin_us": "a loop spins by what it measures, up to server.spin_max_us for the whole daemon",
    "stand_in": "a job too dear for the inline path runs on a worker of its class",
    "preemptible": "a lower class's call is never cancelled; it yields, and its calls are capped by max_call_ms",
}


# As written, before caps are derived (see resolve_caps): the bases a config file's
# [classes.NAME] tables start from.
_BUILT_IN = (
    ClassConfig(
        "realtime",
        order=0,
        queue_capacity=32,
        deadline_ms=20.0,
        max_batch=4,
        stream_priority=-1,
        stuck_after_ms=1_000,
    ),
    ClassConfig("standard", order=1, queue_capacity=128, deadline_ms=200.0, max_batch=8, stuck_after_ms=5_000),
    ClassConfig(
        "bulk",
        order=2,
        queue_capacity=512,
        deadline_ms=5000.0,
        max_batch=16,
        batch_wait_us=500,
        stuck_after_ms=30_000,
        yields=True,
    ),
)
# The cap a yielding class gets by default: a quarter of the highest class's deadline,
# so a request of that class waits behind one capped call and keeps most of its budget.
DERIVED_CAP_SHARE = 0.25


def resolve_caps(classes: list[ClassConfig]) -> tuple[ClassConfig, ...]:
    """The classes in order, each max_call_ms left out made a number: a quarter of the
    highest class's deadline for a class that yields, else 0 (no cap)."""
    ordered = sorted(classes, key=lambda c: c.order)
    derived_ms = DERIVED_CAP_SHARE * ordered[0].deadline_ms
    return tuple(
        replace(c, max_call_ms=derived_ms if c.yields and c is not ordered[0] else 0.0) if c.max_call_ms is None else c
        for c in ordered
    )


# From this many usable cores on, the highest class and the daemon's threads get cores of
# their own by default (see resolve_cores); below it, every lane may run anywhere.
SPLIT_FROM_CORES = 6


def resolve_cores(classes: tuple[ClassConfig, ...], usable: list[int]) -> tuple[ClassConfig, ...]:
    """Where no class names its cores, on a machine with SPLIT_FROM_CORES or more: the
    highest class gets a quarter of them (at least 2), shared with the daemon's threads
    (edged.daemon.daemon pins it there), and every other class the rest, so bulk never
    computes on realtime's cores or starves the loop."""
    if len(usable) < SPLIT_FROM_CORES or any(c.cpu_affinity for c in classes):
        return classes
    split = max(2, len(usable) // 4)
    own, rest = tuple(usable[:split]), tuple(usable[split:])
    return tuple(replace(c, cpu_affinity=own if i == 0 else rest) for i, c in enumerate(classes))


def resolve_spin(classes: tuple[ClassConfig, ...]) -> tuple[ClassConfig, ...]:
    """Each threads_spin left out made true where the lane has cores of its own: its
    cpu_affinity, at least as many cores as its threads, named by no other class (a class
    that names none runs anywhere). A pool spinning on cores another lane computes on
    takes them from it, and on a busy box a spinning thread holds the core that the
    thread it waits for needs (docs/engines.md, "Threads")."""
    resolved = []
    for c in classes:
        if c.threads_spin is None:
            mine = set(c.cpu_affinity)
            others = [o.cpu_affinity for o in classes if o is not c]
            own = bool(mine) and len(mine) >= c.threads and all(o and not mine & set(o) for o in others)
            c = replace(c, threads_spin=own)
        resolved.append(c)
    return tuple(resolved)


def usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def resolved(classes: list[ClassConfig]) -> tuple[ClassConfig, ...]:
    """The classes in order, with every derived setting made a number for this machine."""
    return resolve_spin(resolve_cores(resolve_caps(classes), usable_cores()))


def built_in() -> tuple[ClassConfig, ...]:
    """The built-in classes with their caps derived, before any machine's cores are divided."""
    return resolve_caps(list(_BUILT_IN))


@functools.cache
def default_classes() -> tuple[ClassConfig, ...]:
    """The built-in classes, resolved for this machine."""
    return resolved(list(_BUILT_IN))


def parse_classes(table: Any) -> tuple[ClassConfig, ...]:
    expect(isinstance(table, dict), "classes", table, "a table of [classes.NAME] tables")
    defaults = {c.name: c for c in _BUILT_IN}
    classes = []
    # A file that names classes defines the full set; a file that names none keeps the defaults.
    for name, settings in table.items() if table else ((n, {}) for n in defaults):
        prefix = f"classes.{name}."
        # The name is a part of a socket file's too (edged.wire.endpoints.class_endpoint), and a word in log lines.
        expect(CLASS_NAME.fullmatch(name) is not None, "classes", name, "class names of letters, digits, '_' and '-'")
        expect(isinstance(settings, dict), f"classes.{name}", settings, "a table")
        base = defaults.get(name, ClassConfig(name, order=len(classes)))
        if "reserved_memory_mb" in settings:
            raise ConfigError(
                f"{prefix}reserved_memory_mb is now {prefix}arena_cap_mb: it caps ONNX Runtime's memory arena, "
                "which grows as it needs, and reserves nothing (what each lane takes is measured at start-up "
                "and shown by stats); rename the key"
            )
        for key, why in REMOVED.items():
            if key in settings:
                raise ConfigError(f"{prefix}{key} was removed: {why}; delete the key")
        no_unknown(settings, CLASS.names, prefix)
        values: dict[str, Any] = {}
        for key in CLASS.keys:
            # Left out, tcp_port stays None, as do inline_max_us and threads_spin (derived:
            # edged.serve.lanes.lane, resolve_spin).
            if key.name not in settings and getattr(base, key.name, 0) is None:
                continue
            if key.type == "boolean":
                values[key.name] = read_bool(settings, key, getattr(base, key.name), prefix)
            elif key.type == "integer":
                values[key.name] = read_int(settings, key, getattr(base, key.name), prefix)
        cap = settings.get("max_call_ms", base.max_call_ms)
        expect(
            cap is None or (isinstance(cap, (int, float)) and not isinstance(cap, bool) and 0 <= cap <= 3_600_000),
            prefix + "max_call_ms",
            cap,
            CLASS["max_call_ms"].valid,
        )
        values["max_call_ms"] = None if cap is None else float(cap)
        deadline = settings.get("deadline_ms", base.deadline_ms)
        expect(
            isinstance(deadline, (int, float)) and not isinstance(deadline, bool) and 0 < deadline <= 3_600_000,
            prefix + "deadline_ms",
            deadline,
            CLASS["deadline_ms"].valid,
        )
        values["deadline_ms"] = float(deadline)
        wait_us = values.get("batch_wait_us", base.batch_wait_us)
        expect(
            wait_us < deadline * 1000,
            prefix + "batch_wait_us",
            wait_us,
            f"fewer microseconds than the class's deadline_ms ({deadline} ms, {deadline * 1000:.0f} us): "
            "a worker waits to fill a batch within its requests' budget",
        )
        affinity = settings.get("cpu_affinity", list(base.cpu_affinity))
        usable = usable_cores()
        expect(
            isinstance(affinity, list)
            and all(isinstance(c, int) and not isinstance(c, bool) and c in usable for c in affinity),
            prefix + "cpu_affinity",
            affinity,
            f"a list of the cores this process may use, {usable} (empty: any)",
        )
        values["cpu_affinity"] = tuple(affinity)
        classes.append(replace(base, **values))
    orders = [c.order for c in classes]
    expect(len(set(orders)) == len(orders), "classes.*.order", orders, "a distinct order for each class")
    ports = [c.tcp_port for c in classes if c.tcp_port is not None]
    expect(len(set(ports)) == len(ports), "classes.*.tcp_port", ports, "a distinct port for each class that names one")
    return resolved(classes)
