"""Start a daemon as a child process and wait until it serves: for `edged demo`,
`edged bench` and anything else that needs a daemon of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edged.client import Client, EdgedError

# How long to wait for a daemon to have seen a change in the box's load: its steering
# thread samples it every second (edged.serve.contention), so a sample wholly after the
# change ends within 2 s; 5 s leaves room for a slow box.
LOAD_SEEN_S = 5.0


class DaemonProcess:
    """`edged serve` in a child process; a context manager that stops it on exit."""

    def __init__(
        self,
        endpoints: list[str],
        config: Path | None = None,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
        program: list[str] | None = None,
    ) -> None:
        """`program` replaces `python -m edged` (a script that registers a backend of its own)."""
        self.endpoints = endpoints
        self.log_path = log_path
        args = [*(program or [sys.executable, "-m", "edged"]), "serve"]
        if config is not None:
            args += ["--config", str(config)]
        for endpoint in endpoints:
            args += ["--endpoint", endpoint]
        self._log = open(log_path, "wb") if log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )

    def wait_serving(self, timeout_s: float = 60.0) -> None:
        """Return once health says `serving`; raise if the daemon exits or takes too long."""
        end = time.monotonic() + timeout_s
        with Client(self.endpoints[0], timeout_ms=500) as client:
            while time.monotonic() < end:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the daemon exited with code {self.process.returncode} during start-up")
                try:
                    if client.health()["state"] == "serving":
                        return
                except EdgedError:
                    pass
                time.sleep(0.05)
        raise RuntimeError(f"the daemon was not serving after {timeout_s:.0f} s")

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, wait for the drain, and return the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not subprocess.DEVNULL:
            self._log.close()
        return self.process.returncode

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def checkout_program(checkout: str) -> list[str]:
    """`python -m edged` from another checkout (a worktree of an earlier commit): the
    `program` of a DaemonProcess for a before-and-after in one run. `-P`: without it,
    `-m` puts the working directory first on the path, and a benchmark run from this
    checkout ran this checkout's daemon on both sides."""
    return ["env", f"PYTHONPATH={checkout}", sys.executable, "-P", "-m", "edged"]


def cpu_seconds(pid: int) -> float:
    """The CPU time a process has used, user and system (/proc/PID/stat): what a
    benchmark's figure of the daemon's CPU use is read from."""
    return _stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """The CPU time of each of a process's threads: its main thread (the daemon's steering
    thread) as "main", the others by their kernel name (ZeroMQ's "ZMQbg/IO/0", ...), the
    same names summed."""
    seconds: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = "main" if task.name == str(pid) else (task / "comm").read_text().strip()
            seconds[name] = seconds.get(name, 0.0) + _stat_cpu_seconds(task / "stat")
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return seconds


def thread_run_seconds(pid: int) -> dict[str, float]:
    """The CPU time of each of a process's threads, by thread id, from the scheduler's
    own count in ns (/proc/PID/task/TID/schedstat): thread_cpu_seconds's clock ticks
    (10 ms) are too coarse for a share of a request."""
    seconds: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            seconds[task.name] = int((task / "schedstat").read_text().split()[0]) / 1e9
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return seconds


@contextmanager
def loaded_daemon(program: list[str] | None, prefix: str) -> Iterator[str]:
    """A fresh daemon with the built-in classes on a private ipc endpoint, serving, once it
    has sampled the box's load (LOAD_SEEN_S): its endpoint, for the length of the block."""
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        endpoint = f"ipc://{folder}/edged.sock"
        with DaemonProcess([endpoint], None, Path(folder) / "daemon.log", program=program) as daemon:
            daemon.wait_serving()
            time.sleep(LOAD_SEEN_S)
            yield endpoint


@contextmanager
def busy_loops() -> Iterator[None]:
    """A busy box: one busy loop at the default niceness on each core this process may
    run on, for the length of the block."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def _stat_cpu_seconds(stat: Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def resident_kib(pid: int) -> int:
    """A process's resident memory (VmRSS), in KiB: what the soak, fuzz and leak checks watch."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")
