"""The daemon's threads as the kernel shows them (top -H, ps -L, /proc): by their jobs."""

from __future__ import annotations

import collections
from pathlib import Path

from support import RunningDaemon

from edged.client import Client


def kernel_names(pid: int) -> collections.Counter[str]:
    """How many of the process's threads carry each name in /proc."""
    names: collections.Counter[str] = collections.Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names[(task / "comm").read_text().strip()] += 1
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return names


def test_each_loop_and_worker_is_named_for_the_kernel(daemon: RunningDaemon) -> None:
    with Client(daemon.ipc) as client:
        classes = list(client.stats()["classes"])
    names = kernel_names(daemon.pid)
    for klass in classes:
        assert names[f"serve-{klass}"] == 1, f"no thread named serve-{klass}: {dict(names)}"
        # The worker, and the runtime's threads it started, which inherit its name.
        assert names[f"lane-{klass}-0"] >= 1, f"no thread named lane-{klass}-0: {dict(names)}"
    assert names["trimmer"] == 1, dict(names)
