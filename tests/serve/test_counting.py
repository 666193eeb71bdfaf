"""Counting across threads, one rule everywhere: a field that one thread alone writes
needs nothing; a field that several threads write is written under its structure's
lock, and read under it where a reader needs several fields of one moment. ClassStats
(outcomes from the loop and the workers), Backlog (added by the loop, taken away by
whoever answers) and ServiceTimes (averaged into by workers and the loop's thread)
follow it. Threads hammer each here, with the GIL handed over as often as CPython
allows. (A lost sample of an average shows in no figure, so the test of ServiceTimes
checks what its readers rely on, not the lost update itself.)"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from edged.serve.admission import Backlog
from edged.serve.pricing import ServiceTimes
from edged.serve.stats import ClassStats

ROUNDS = 20_000


@pytest.fixture(autouse=True)
def switch_often() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def together(*work: Callable[[], None]) -> None:
    threads = [threading.Thread(target=w) for w in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_a_backlog_read_beside_its_writers_is_never_torn() -> None:
    """The loop adds each job before anyone finishes it, and finishes half of them itself
    (the inline ones) while a worker finishes the rest: a reading of the depth is never
    negative and never above the jobs added, and nothing is left at the end."""
    backlog = Backlog()
    handed: list[int] = []
    lowest = highest = 0
    done = threading.Event()

    def loop() -> None:
        for i in range(ROUNDS):
            backlog.add(10)
            if i % 2:
                backlog.finish(10)
            else:
                handed.append(10)  # list.append is atomic: the worker's queue
        done.set()

    def worker() -> None:
        finished = 0
        while finished < ROUNDS // 2:
            if handed:
                backlog.finish(handed.pop())
                finished += 1

    def reader() -> None:
        nonlocal lowest, highest
        while not done.is_set() or backlog.depth:
            depth, work = backlog.depth, backlog.work_ns
            lowest, highest = min(lowest, depth), max(highest, depth, work // 10)

    together(loop, worker, reader)
    assert lowest >= 0 and highest <= ROUNDS, (lowest, highest)
    assert (backlog.depth, backlog.work_ns) == (0, 0)


def test_service_times_stay_whole_under_four_writers() -> None:
    """Four writers (workers and the loop) observe one model at two batch sizes."""
    times = ServiceTimes()

    def writer(call_ns: int, rows: int) -> Callable[[], None]:
        def observe() -> None:
            for _ in range(ROUNDS // 4):
                times.observe("m", call_ns, rows, elements=rows * 100)

        return observe

    together(writer(1000, 1), writer(1000, 1), writer(4000, 4), writer(4000, 4))
    assert times.estimate_ns("m") == 1000 and times.extra_row_ns("m") == pytest.approx(1000)
    assert times.charge_ns("m", 1, 100) == pytest.approx(1000, rel=0.1)


def test_class_stats_from_four_writers_lose_nothing_and_a_reader_sees_whole_moments() -> None:
    """Workers and the loop count outcomes at once; a reader on another thread (the
    stats op, Prometheus) must never see an answer counted without its latency."""
    stats = ClassStats()
    torn: list[dict[str, Any]] = []
    done = threading.Event()

    def writer() -> None:
        for _ in range(ROUNDS // 4):
            stats.call(2)
            stats.done(True, 1, 2, 3)

    def reader() -> None:
        while not done.is_set():
            figures = stats.snapshot(0)
            if figures["completed"] != figures["latency_us"]["total"]["count"]:
                torn.append(figures)

    watcher = threading.Thread(target=reader)
    watcher.start()
    together(writer, writer, writer, writer)
    done.set()
    watcher.join()
    assert not torn, f"{len(torn)} torn readings, the first: {torn[0]}"
    assert (stats.backend_calls, stats.backend_rows, stats.completed) == (ROUNDS, 2 * ROUNDS, ROUNDS)
    assert stats.total_us.total == ROUNDS
