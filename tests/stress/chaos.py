"""The daemon's life under chaos: signals at random moments, under load, each schedule checked.

    python tests/stress/chaos.py --schedules 40 [--seed N]

Each schedule starts a daemon of its own on a repository holding mlp-light and the
sleeper, warmed up at a dear n: start-up's and every reload's warm-up take a second or
more. Three peers load it, one per class: realtime sends mlp-light (inline on its loop)
and, one request in eight, a dear sleeper job (on its worker); standard sends
mlp-light; bulk queues sleeper jobs. From the moment the daemon logs `listening on`
(its signal handlers are in place), the schedule sends zero to three SIGHUPs, then
SIGTERM or SIGINT, each at a random moment or aimed just after the loader finishes
new lanes (start-up's or a reload's), while the loops take them up and the old ones
retire. The peers stop sending SETTLE_S before the last signal, so that every request
sent has reached the daemon, whose drain must answer it.

Checked, per schedule: the daemon exits 0; its log holds no traceback; every request
got exactly one reply, each OK or a documented refusal (UNAVAILABLE while starting or
draining, OVERLOADED, DEADLINE_EXCEEDED). The script prints its seed and exits 1 when a
schedule fails; tests/daemon/test_chaos.py runs a few schedules in CI.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import numpy as np
import zmq

if __name__ == "__main__":  # run as a script: tests/ holds the helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import RunningDaemon, bounded, start_daemon, wait_for
from support.models import PATIENT_WATCHDOGS, dear_warmup_repository, sleep_for

from edged.wire.codec import encode_request

WARMUP_N = 1500  # about 0.12 s a call here: five of them a lane per warm-up
CONFIG = '[server]\nmodel_repository = "{repository}"\ndrain_timeout_ms = 30000\n' + PATIENT_WATCHDOGS
DOCUMENTED = {"OK", "UNAVAILABLE", "OVERLOADED", "DEADLINE_EXCEEDED"}
SETTLE_S = 0.1  # between the peers' last request and the stop signal
HORIZON_S = 8.0  # the span over which a schedule's timed signals fall (start-up takes about 2-3 s)
WARMUP_WINDOW_S = 0.4  # how far past the loader's end a signal aimed at it falls
# The log lines that say the loader has built new lanes, which the loops now take up (edged.daemon.daemon).
WARMING = ("edged: loaded ", "edged: reload loaded ")
EXIT_S = 90.0


def warmups_in(log: str) -> int:
    """How many times the loader finished new lanes, by the daemon's log."""
    return sum(log.count(marker) for marker in WARMING)


def next_warmup(running: RunningDaemon, seen: int) -> None:
    """Wait until the loader finishes lanes for time number `seen` + 1 (or the daemon has exited)."""
    wait_for(lambda: warmups_in(running.log()) > seen or not running.alive(), 60, "the next warm-up")


@dataclass
class Peer:
    """One class's load: a DEALER of its own, requests at a fixed pace, replies counted by id."""

    klass: str
    every_s: float
    request: Callable[[int], list[bytes]]
    sent: int = 0
    replies: Counter[int] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)

    def drive(self, endpoint: str, sending: threading.Event, done: threading.Event) -> None:
        context = zmq.Context.instance()
        sock = bounded(context.socket(zmq.DEALER))
        sock.linger = 0
        sock.sndhwm = sock.rcvhwm = 0
        sock.connect(endpoint)
        next_s = time.monotonic()
        try:
            while not done.is_set():
                if sending.is_set() and time.monotonic() >= next_s:
                    sock.send_multipart(self.request(self.sent))
                    self.sent += 1
                    next_s += self.every_s
                if sock.poll(2):
                    header = msgpack.unpackb(sock.recv_multipart()[0])
                    self.replies[header["id"]] += 1
                    self.statuses[header["status"]] += 1
        finally:
            sock.close()

    def problems(self) -> list[str]:
        found = []
        missing = [i for i in range(self.sent) if self.replies[i] == 0]
        twice = [i for i, count in self.replies.items() if count > 1]
        if missing:
            found.append(f"{self.klass}: {len(missing)} of {self.sent} requests unanswered, e.g. {missing[:5]}")
        if twice:
            found.append(f"{self.klass}: {len(twice)} requests answered more than once, e.g. {twice[:5]}")
        undocumented = set(self.statuses) - DOCUMENTED
        if undocumented:
            found.append(f"{self.klass}: statuses {sorted(undocumented)} ({dict(self.statuses)})")
        return found


def peers() -> list[Peer]:
    light = {"x": np.random.default_rng(0).standard_normal((1, 64), dtype=np.float32)}

    def realtime(i: int) -> list[bytes]:
        if i % 8 == 7:  # dear: runs on realtime's worker
            return encode_request(i, model="sleeper", klass="realtime", deadline_ms=60_000, inputs=sleep_for(1000))
        return encode_request(i, model="mlp-light", klass="realtime", deadline_ms=1000, inputs=light)

    def standard(i: int) -> list[bytes]:
        return encode_request(i, model="mlp-light", klass="standard", deadline_ms=5000, inputs=light)

    def bulk(i: int) -> list[bytes]:
        return encode_request(i, model="sleeper", klass="bulk", deadline_ms=60_000, inputs=sleep_for(300))

    return [Peer("realtime", 0.01, realtime), Peer("standard", 0.02, standard), Peer("bulk", 0.05, bulk)]


@dataclass(frozen=True)
class Step:
    """One signal: `delay_s` after the step before it (or after `listening on`), or, with
    `in_warmup`, `delay_s` after the loader next finishes new lanes."""

    signum: signal.Signals
    delay_s: float
    in_warmup: bool

    def __str__(self) -> str:
        when = "after the next lanes are built" if self.in_warmup else "later"
        return f"{self.signum.name} {self.delay_s:.2f} s {when}"


@dataclass
class Schedule:
    """Zero to three SIGHUPs, then SIGTERM or SIGINT; half the steps aim at a warm-up."""

    seed: int
    steps: list[Step]

    @classmethod
    def drawn(cls, seed: int) -> Schedule:
        rng = random.Random(seed)
        signums = [signal.SIGHUP] * rng.randint(0, 3) + [rng.choice([signal.SIGTERM, signal.SIGINT])]
        steps = []
        for signum in signums:
            in_warmup = rng.random() < 0.5
            delay_s = rng.uniform(0, WARMUP_WINDOW_S) if in_warmup else rng.uniform(0, HORIZON_S / len(signums))
            steps.append(Step(signum, delay_s, in_warmup))
        return cls(seed, steps)

    def __str__(self) -> str:
        return f"seed {self.seed}: " + ", then ".join(map(str, self.steps))


@dataclass
class Outcome:
    schedule: Schedule
    exit_code: int | None
    problems: list[str]
    statuses: dict[str, dict[str, int]]

    @property
    def ok(self) -> bool:
        return not self.problems


def run(schedule: Schedule, program: list[str] | None = None) -> Outcome:
    """Start a daemon, load it, signal it as `schedule` says, and check what came back."""
    root = dear_warmup_repository(WARMUP_N)
    running: RunningDaemon = start_daemon(CONFIG.format(repository=root), wait=False, program=program)
    load = peers()
    sending, done = threading.Event(), threading.Event()
    threads = [threading.Thread(target=p.drive, args=(running.ipc, sending, done), daemon=True) for p in load]
    problems: list[str] = []
    code: int | None = None
    try:
        wait_for(lambda: "listening on" in running.log() or not running.alive(), 60, "the daemon to listen")
        sending.set()
        for thread in threads:
            thread.start()
        warmups = 0
        for step in schedule.steps:
            if step.in_warmup:
                try:
                    next_warmup(running, warmups)
                except AssertionError as exc:  # a schedule that fails, not the run: the rest go on
                    problems.append(f"{exc} (the signal goes now)")
            last = step is schedule.steps[-1]
            time.sleep(max(step.delay_s - (SETTLE_S if last else 0), 0))
            if last:  # every request sent must reach the daemon before it may end
                sending.clear()
                time.sleep(SETTLE_S)
            warmups = warmups_in(running.log())
            if running.alive():
                os.kill(running.pid, step.signum)
        try:
            code = running.process.process.wait(EXIT_S)
        except subprocess.TimeoutExpired:
            problems.append(f"the daemon had not exited {EXIT_S:.0f} s after its last signal")
        time.sleep(0.2)  # replies the daemon sent as it went still cross the sockets
    finally:
        done.set()
        for thread in threads:
            thread.join(5)
        log = running.log()
        running.close()
        shutil.rmtree(root, ignore_errors=True)
    if code not in (0, None):
        problems.append(f"exit code {code}")
    if "Traceback" in log:
        problems.append("a traceback in the log:\n" + log[log.index("Traceback") :][-2000:])
    for peer in load:
        problems.extend(peer.problems())
    if problems:
        problems.append("the daemon's log ends:\n" + log[-1500:])
    return Outcome(schedule, code, problems, {p.klass: dict(p.statuses) for p in load})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedules", type=int, default=20)
    parser.add_argument("--seed", type=int, help="the first schedule's seed (default: drawn, and printed)")
    args = parser.parse_args()
    first = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"chaos: {args.schedules} schedules from seed {first}", flush=True)
    failed = 0
    for seed in range(first, first + args.schedules):
        outcome = run(Schedule.drawn(seed))
        verdict = "ok" if outcome.ok else "FAILED"
        print(f"{verdict:6} {outcome.schedule}; exit {outcome.exit_code}; {outcome.statuses}", flush=True)
        for problem in outcome.problems:
            print(f"    {problem}", flush=True)
        failed += not outcome.ok
    print(f"chaos: {args.schedules - failed} of {args.schedules} schedules ok (seeds {first}..{seed})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
