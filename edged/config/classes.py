"""Priority classes: what each is promised, and the lane reserved for it."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, fields, replace
from typing import Any

from edged.config import machine
from edged.config.settings import ConfigError, expect, no_unknown, read_int


@dataclass(frozen=True, slots=True)
class ClassConfig:
    """One priority class and the lane reserved for it."""

    name: str
    # Where the class is listed (stats, health) and its lane started, 0 first. Not a
    # scheduling rank: every class has a lane of its own, and nice, cpu_affinity and
    # stream_priority are what divide the machine between them.
    order: int
    queue_capacity: int = 64
    deadline_ms: float = 100.0  # default budget of a request that names none
    workers: int = 1
    max_batch: int = 1  # the most rows one backend call may carry (requests are not split)
    batch_wait_us: int = 0  # how long a worker may wait to fill a batch; 0 for latency classes
    # Run a job estimated this cheap on the socket loop when the lane is idle (0: never).
    # It delays every class's next request by about as long: meant for the most urgent
    # class. None: derived from this machine (see resolve_loop_work).
    inline_max_us: int | None = 0
    # With an inline path: a dearer job on an idle lane runs on the loop's thread as well,
    # while a stand-in thread serves the sockets (edged.serve.lanes.inline); false: on a worker.
    stand_in: bool = True
    # Once done with a request of this class that came within spin_us of it being done with
    # the class's previous one, the socket loop keeps polling (not sleeping) this long while
    # every lane is idle, so that the next request finds the loop, its core and its
    # caches awake. None: derived (see resolve_loop_work).
    spin_us: int | None = None
    threads: int = 1  # ONNX Runtime intra-op threads of this lane's sessions
    cpu_affinity: tuple[int, ...] = ()  # cores the lane's threads run on; empty: any
    nice: int = 0  # Linux thread niceness of the lane's workers: bulk yields the CPU to realtime
    stream_priority: int = 0  # CUDA stream priority for GPU backends (lower is more urgent)
    sm_count: int = 0  # GPU backends: run the lane's kernels in a green context of this many SMs; 0: all
    # GPU backends: ONNX Runtime's memory arena cap for the lane, split between its
    # sessions (gpu_mem_limit); 0: uncapped. A cap, not a reservation: arenas grow lazily.
    arena_cap_mb: int = 0
    cuda_graph: bool = False  # GPU backends: replay a captured CUDA graph per batch size (fixed shapes only)
    stuck_after_ms: int = 10_000  # a backend call open this long is answered INTERNAL and its worker replaced; 0: never
    # Precedence (edged.serve.lanes.precedence). A class that yields starts no backend call
    # while a higher class has work queued or running; its calls are sized to finish
    # within max_call_ms (None: a quarter of the highest class's deadline; 0: no cap);
    # a preemptible class's call in flight is cancelled when a higher request would
    # miss its deadline behind it, and its jobs run again.
    yields: bool = False
    max_call_ms: float | None = None
    preemptible: bool = False

    @property
    def gives_way(self) -> bool:
        """Whether the lane yields to higher classes or runs niced: the lane a burst read
        by the socket loop starves first, whose pace admission watches as it goes and
        trusts only as far as it has seen it (edged.serve.admission.Backlog.outlook)."""
        return self.yields or self.nice > 0


# As written, before caps are derived (see resolve_caps): the bases a config file's
# [classes.NAME] tables start from.
_BUILT_IN = (
    ClassConfig(
        "realtime",
        order=0,
        queue_capacity=32,
        deadline_ms=20.0,
        max_batch=4,
        inline_max_us=None,
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
        nice=10,
        stuck_after_ms=30_000,
        yields=True,
        preemptible=True,
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


# From this many usable cores on, the highest class and the socket loop get cores of
# their own by default (see resolve_cores); below it, every lane may run anywhere.
SPLIT_FROM_CORES = 6


def resolve_cores(classes: tuple[ClassConfig, ...], usable: list[int]) -> tuple[ClassConfig, ...]:
    """Where no class names its cores, on a machine with SPLIT_FROM_CORES or more: the
    highest class gets a quarter of them (at least 2), shared with the socket loop
    (edged.daemon.daemon pins it there), and every other class the rest, so bulk never
    computes on realtime's cores or starves the loop."""
    if len(usable) < SPLIT_FROM_CORES or any(c.cpu_affinity for c in classes):
        return classes
    split = max(2, len(usable) // 4)
    own, rest = tuple(usable[:split]), tuple(usable[split:])
    return tuple(replace(c, cpu_affinity=own if i == 0 else rest) for i, c in enumerate(classes))


def usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


# The loop's own work is sized in thread hand-offs measured on this machine
# (edged.config.machine.handoff_us), so that a slower CPU, whose hand-offs and client
# turn-arounds are slower too, gets a longer inline cap and spin, not the figures tuned
# on the 2-core VM where its hand-off is 11-15 us (docs/benchmarks.md):
# - inline: a job of up to 25 hand-offs runs on the loop, where the hand-off it saves is
#   4% or more of its time (300 us on that VM, where 300 was tuned);
# - spin: the loop polls for 20 hand-offs after a request, long enough to span a
#   closed-loop client's turn-around through ZeroMQ's I/O threads on both sides, a
#   few wake-ups and the client's own work (250 us on that VM, where 250 was tuned).
INLINE_HANDOFFS = 25
SPIN_HANDOFFS = 20
# Bounds on both, whatever the probe measured: a loop busy inline delays every class's
# next request, so never more than 1/INLINE_DEADLINE_SHARE of the highest class's deadline.
LOOP_WORK_MIN_US = 50
LOOP_WORK_MAX_US = 1_000
INLINE_DEADLINE_SHARE = 20


def resolve_loop_work(classes: tuple[ClassConfig, ...], handoff_us: float) -> tuple[ClassConfig, ...]:
    """Each inline_max_us and spin_us left out made a number, from this machine's
    measured hand-off: inline (a number of hand-offs, within LOOP_WORK_MIN_US..MAX_US
    and a share of the highest class's deadline) for a class whose inline_max_us is left
    out, the highest class by default; a spin of SPIN_HANDOFFS hand-offs for the highest
    class when it has an inline path, else 0. The loop spins only while that class's
    requests come within spin_us of its last answer (edged.serve.dispatch), that is while
    it would be woken that often anyway, and never while a lane has work."""

    def bounded(us: float) -> int:
        return int(min(max(us, LOOP_WORK_MIN_US), LOOP_WORK_MAX_US))

    top_share_us = classes[0].deadline_ms * 1000 / INLINE_DEADLINE_SHARE
    inline_us = int(min(bounded(INLINE_HANDOFFS * handoff_us), top_share_us))
    with_inline = tuple(replace(c, inline_max_us=inline_us) if c.inline_max_us is None else c for c in classes)
    return tuple(
        replace(c, spin_us=bounded(SPIN_HANDOFFS * handoff_us) if i == 0 and c.inline_max_us else 0)
        if c.spin_us is None
        else c
        for i, c in enumerate(with_inline)
    )


def loop_work_lines(classes: tuple[ClassConfig, ...]) -> list[str]:
    """What the socket loop runs itself and how long it spins, a line per class that
    has either, with the hand-off the figures left out were derived from."""
    return [
        f"classes.{c.name}: inline_max_us = {c.inline_max_us or 0}, spin_us = {c.spin_us or 0} (left out: "
        f"{INLINE_HANDOFFS} and {SPIN_HANDOFFS} thread hand-offs of {machine.handoff_us():.1f} us on this machine)"
        for c in classes
        if c.inline_max_us or c.spin_us
    ]


def resolved(classes: list[ClassConfig]) -> tuple[ClassConfig, ...]:
    """The classes in order, with every derived setting made a number for this machine
    (measuring its hand-off, once per process, only if a setting needs it)."""
    classes_ = resolve_cores(resolve_caps(classes), usable_cores())
    if all(c.inline_max_us is not None and c.spin_us is not None for c in classes_):
        return classes_
    return resolve_loop_work(classes_, machine.handoff_us())


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
        expect(isinstance(settings, dict), f"classes.{name}", settings, "a table")
        base = defaults.get(name, ClassConfig(name, order=len(classes)))
        known = {f.name for f in fields(ClassConfig)} - {"name"}
        if "reserved_memory_mb" in settings:
            raise ConfigError(
                f"{prefix}reserved_memory_mb is now {prefix}arena_cap_mb: it caps ONNX Runtime's memory arena, "
                "which grows as it needs, and reserves nothing (what each lane takes is measured at start-up "
                "and shown by stats); rename the key"
            )
        no_unknown(settings, known, prefix)
        values: dict[str, Any] = {}
        for key in ("order", "workers", "max_batch", "queue_capacity"):
            minimum = 0 if key == "order" else 1
            values[key] = read_int(settings, key, getattr(base, key), prefix, minimum)
        for key in ("batch_wait_us", "threads", "arena_cap_mb", "stuck_after_ms", "sm_count"):
            values[key] = read_int(settings, key, getattr(base, key), prefix, 0)
        # Left out, realtime's is derived (resolve_loop_work); another class's is 0.
        if "inline_max_us" in settings:
            values["inline_max_us"] = read_int(settings, "inline_max_us", 0, prefix, 0)
        values["nice"] = read_int(settings, "nice", base.nice, prefix, -20, 19)
        values["stream_priority"] = read_int(settings, "stream_priority", base.stream_priority, prefix, -10, 10)
        for key in ("cuda_graph", "yields", "preemptible", "stand_in"):
            flag = settings.get(key, getattr(base, key))
            expect(isinstance(flag, bool), prefix + key, flag, "true or false")
            values[key] = flag
        cap = settings.get("max_call_ms", base.max_call_ms)
        expect(
            cap is None or (isinstance(cap, (int, float)) and not isinstance(cap, bool) and 0 <= cap <= 3_600_000),
            prefix + "max_call_ms",
            cap,
            "a number of milliseconds, 0 for no cap (leave it out: a quarter of the highest class's deadline)",
        )
        values["max_call_ms"] = None if cap is None else float(cap)
        spin = settings.get("spin_us", base.spin_us)
        expect(
            spin is None or (isinstance(spin, int) and not isinstance(spin, bool) and 0 <= spin <= 10_000),
            prefix + "spin_us",
            spin,
            "microseconds from 0 (never) to 10000 (leave it out: derived from this machine for the highest "
            "class when it has an inline path, else 0)",
        )
        values["spin_us"] = spin
        deadline = settings.get("deadline_ms", base.deadline_ms)
        expect(
            isinstance(deadline, (int, float)) and not isinstance(deadline, bool) and 0 < deadline <= 3_600_000,
            prefix + "deadline_ms",
            deadline,
            "a number of milliseconds above 0 and at most 3600000 (an hour)",
        )
        values["deadline_ms"] = float(deadline)
        affinity = settings.get("cpu_affinity", list(base.cpu_affinity))
        usable = usable_cores()
        expect(
            isinstance(affinity, list) and all(isinstance(c, int) and c in usable for c in affinity),
            prefix + "cpu_affinity",
            affinity,
            f"a list of the cores this process may use, {usable} (empty: any)",
        )
        values["cpu_affinity"] = tuple(affinity)
        classes.append(replace(base, **values))
    orders = [c.order for c in classes]
    expect(len(set(orders)) == len(orders), "classes.*.order", orders, "a distinct order for each class")
    return resolved(classes)
