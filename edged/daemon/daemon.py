"""The daemon's life: bind, load and warm every lane, serve, reload, drain, stop.

The main thread steers: signals, loading and reloads, the drain and the stop, systemd's
watchdog, stuck workers. It never runs a backend call and never touches a socket, so a
signal is acted on at once, whatever a call is doing. Sockets are bound first (a client
asking during start-up hears `starting`); inference opens, and systemd hears READY, once
every loop has taken up its warm lane. It asks a loop by handing it a callable; a loop
answers by waking it (edged.daemon.loops).
"""

from __future__ import annotations

import gc
import logging
import math
import os
import select
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from edged.config import Config
from edged.config.reload import reloaded
from edged.daemon.lifecycle import Lifecycle, State
from edged.daemon.loading import Loaded, load
from edged.daemon.loops import Loops
from edged.daemon.stopping import stop_lanes
from edged.daemon.systemd import Notifier
from edged.daemon.trimmer import Trimmer
from edged.serve.contention import Contention
from edged.serve.figures import status_line
from edged.serve.lanes.lane import Lane
from edged.threads import NamedThread

log = logging.getLogger("edged")

# Python hands the GIL over every 5 ms by default: a reply ready on a worker could wait that
# long behind a loop reading a burst; 0.5 ms bounds it.
GIL_SWITCH_INTERVAL_S = 0.0005
# How long the steering thread sleeps unwoken: briefly while a drain or a switch waits on
# the loops, a while as lanes retire, else until its next timer (an idle daemon: ~1/s).
STEER_WAITING_S = 0.002
STEER_EVERY_S = 0.05
STEER_IDLE_S = 1.0
STATUS_EVERY_NS = 5_000_000_000
SWEEP_EVERY_NS = 1_000_000_000


class Daemon:
    """The daemon's life, steered by the thread that calls `run`, which alone moves
    `lifecycle`; signal handlers, the loader and the loops leave it news (`_news`) and wake it."""

    def __init__(self, config: Config, reread_config: Callable[[], Config]) -> None:
        gc.freeze()  # the modules' 35,000 objects: a collection of them held the GIL 26-30 ms
        self.config = config
        if config.classes[0].cpu_affinity:
            # The highest class's loop runs its inline calls: it runs on that class's cores.
            # Pinned before any thread starts (ZeroMQ's I/O threads among them), which inherit it.
            os.sched_setaffinity(0, config.classes[0].cpu_affinity)
        self.lifecycle = Lifecycle()
        # Bound first: nothing else to close if binding fails. The loops wake this thread only once they run.
        self.loops = Loops(config, self.lifecycle, self._wake)
        self.serving = self.loops.serving
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.notifier = Notifier()
        self.trimmer = Trimmer()
        self.contention = Contention()  # written by this thread alone (sample), read by the lanes
        self.exit_code = 0
        self._reread_config = reread_config
        self._news: deque[tuple[str, Any]] = deque()  # ("stop", signum), ("reload", None), ("loaded", result)
        self._loading: threading.Thread | None = None
        self._loaded: Loaded | None = None  # the generation every loop has taken up
        self._generation = 0
        self._switch: Loaded | None = None  # handed to the loops, not yet taken up by all
        self._reload_asked = False
        self._drain_deadline_ns = 0
        self._retiring: list[Lane] = []  # replaced by a reload (or never opened), finishing what they hold
        self._next_status_ns = 0
        self._next_sweep_ns = 0

    @property
    def lanes(self) -> list[Lane]:
        """Every lane that may still hold work: serving, being taken up, or retiring."""
        generations = [loaded for loaded in (self._loaded, self._switch) if loaded is not None]
        return [*(lane for loaded in generations for lane in loaded.lanes.values()), *self._retiring]

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT, then drain; returns the exit code."""
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        log.info("listening on %s; loading models", ", ".join(self.config.endpoints))
        self.loops.start()
        self._start_loading(lambda: self.config)
        poller = select.poll()
        poller.register(self._wake_fd, select.POLLIN)
        try:
            while not (self.lifecycle.stopping and self._can_stop(time.monotonic_ns())):
                if poller.poll(1000 * self._rest_s(time.monotonic_ns())):
                    os.eventfd_read(self._wake_fd)
                self._steer()
        except Exception:
            # Its own state may be half moved: stop as SIGTERM does, every request held answered, and exit 1
            # for systemd to restart it. Refused first: one admitted to lanes the stop has emptied goes unanswered.
            log.exception("the steering thread failed; stopping")
            self.exit_code = 1
            self._refuse_new("the steering thread failed")
            while not self._can_stop(time.monotonic_ns()):
                time.sleep(STEER_WAITING_S)
        finally:
            self._shut_down()
        return self.exit_code

    def _rest_s(self, now: int) -> float:
        """How long this thread may sleep before its next turn, unless news wakes it."""
        if self._switch is not None or self.lifecycle.stopping:
            return STEER_WAITING_S
        if self._reload_asked or self.serving.settling:
            return STEER_EVERY_S
        due = min(
            self.loops.next_check_ns,
            self._next_sweep_ns,
            self._next_status_ns if self.lifecycle.open else math.inf,
            *(lane.crew.next_check_ns(now) for lane in self.lanes),
        )
        return min(max(due - now, 0) / 1e9, STEER_IDLE_S)

    def _on_signal(self, signum: int, _frame: object) -> None:
        # A handler runs on this thread between two bytecodes: it only leaves the news.
        self._news.append(("reload", None) if signum == signal.SIGHUP else ("stop", signum))
        self._wake()

    def _wake(self) -> None:
        os.eventfd_write(self._wake_fd, 1)

    def _steer(self) -> None:
        """One turn: the news, a switch of lanes, housekeeping."""
        self.lifecycle.check_owner()
        while self._news:
            kind, value = self._news.popleft()
            if kind == "stop":
                self._refuse_new(signal.Signals(value).name)
            elif kind == "reload":
                self._reload_asked = True
            else:
                self._take_loaded(value)
        if self._switch is not None and self.loops.fenced():
            self._switched()
        if self._reload_asked and self.lifecycle.state is State.SERVING and not self._busy():
            self._reload_asked = False
            log.info("SIGHUP: re-reading the configuration and the model repository")
            self.notifier.notify(RELOADING="1", STATUS="reloading")
            self.lifecycle.move(State.RELOADING)
            self._start_loading(lambda: reloaded(self.config, self._reread_config()))  # what a reload may take
        self._housekeeping(time.monotonic_ns())
        # No loop spins beside a warm-up (its prices are timed) or lanes finishing their work.
        self.serving.settling = self._busy() or bool(self._retiring) or any(lane.crew.warming for lane in self.lanes)

    # --- loading, at start and on SIGHUP -------------------------------------

    def _busy(self) -> bool:
        return (self._loading is not None and self._loading.is_alive()) or self._switch is not None

    def _start_loading(self, read_config: Callable[[], Config]) -> None:
        # A reloaded lane keeps its class's counters: stats never jump back to zero.
        stats = {name: lane.stats for name, lane in self._loaded.lanes.items()} if self._loaded else {}
        pending, contention = self.serving.pending, self.contention

        def build() -> None:
            try:
                result: Loaded | Exception = load(read_config, stats, pending, contention)
            except Exception as exc:
                result = exc
            self._news.append(("loaded", result))
            self._wake()

        self._loading = NamedThread(target=build, name="loader", daemon=True)
        self._loading.start()

    def _take_loaded(self, result: Loaded | Exception) -> None:
        """Hand what the loader built to the loops, or report why it could not be built."""
        self._loading = None  # its result is in, though its thread may still be returning
        state = self.lifecycle.state
        if isinstance(result, Exception):
            if state is State.RELOADING:
                log.error("reload refused, still serving the previous configuration: %s", result)
                self.notifier.notify(READY="1", STATUS=f"reload refused: {result}")
                self.lifecycle.move(State.SERVING)
            elif state is State.DRAINING:  # systemd heard STOPPING=1: no READY=1 after it
                log.error("the reload failed while the daemon stopped: %s", result)
            else:
                log.error("start-up failed: %s", result)
                self.exit_code = 1
                if state is State.STARTING:
                    self.lifecycle.move(State.STOPPING)
            return
        if self.lifecycle.stopping:  # built, but never opened
            self._retire(result)
            return
        verb = "loaded" if state is State.STARTING else "reload loaded"
        log.info("%s %s (%.1f s)", verb, result.served, result.seconds)
        self._generation += 1
        regions = self.serving.regions
        regions.open_device, regions.backend = result.open_ipc, result.config.backend
        self._switch = result
        number = self._generation
        self.loops.ask(lambda dispatcher: dispatcher.take_up(result, number))

    def _switched(self) -> None:
        """Every loop admits to the new lanes: open inference, retire the old lanes."""
        result, self._switch = self._switch, None
        assert result is not None
        old, self._loaded = self._loaded, result
        self.config = result.config
        # Loading's objects frozen too, its garbage collected first: before inference opens.
        gc.collect()
        gc.freeze()
        if old is not None:  # first: whatever follows, their queued requests are answered
            self._retire(old)
        if not self.lifecycle.stopping:  # from STARTING or RELOADING; a drain already said STOPPING=1
            self.lifecycle.move(State.SERVING)
            self.notifier.notify(READY="1", STATUS=status_line(self.serving))
        if old is None:
            log.info("ready on %s", ", ".join(self.config.endpoints))
        else:
            log.info("reloaded: now serving %s", result.served)

    def _retire(self, loaded: Loaded) -> None:
        """Let a generation's lanes finish what they hold, admitting nothing new, then end."""
        for lane in loaded.lanes.values():
            lane.crew.retire()
            self._retiring.append(lane)

    # --- housekeeping ----------------------------------------------------------

    def _housekeeping(self, now: int) -> None:
        """Stuck calls, systemd's watchdog, retired lanes, memory a burst left, silent clients'
        shared memory, the box's other load, the status line."""
        for lane in self.lanes:
            lane.crew.check_stuck(now, replace=lane not in self._retiring)
        self.loops.check(now, self.notifier)
        ended = [lane for lane in self._retiring if not lane.crew.alive]
        for lane in ended:  # anything queued behind its workers' last job: answered, never lost
            lane.crew.reject_queued("the lanes were replaced while this request waited; retry")
        self._retiring = [lane for lane in self._retiring if lane not in ended]
        if now >= self._next_sweep_ns:
            self.serving.regions.sweep(now)
            self.contention.sample()
            self.trimmer.check()
            self._next_sweep_ns = now + SWEEP_EVERY_NS
        if now >= self._next_status_ns and self.lifecycle.open:
            self.notifier.notify(STATUS=status_line(self.serving))
            self._next_status_ns = now + STATUS_EVERY_NS

    # --- stopping --------------------------------------------------------------

    def _refuse_new(self, why: str) -> None:
        """Refuse new requests: drain the admitted if serving, else stop once start-up is over."""
        if self.lifecycle.stopping:
            return
        self._drain_deadline_ns = time.monotonic_ns() + self.config.drain_timeout_ms * 1_000_000
        self.notifier.notify(STOPPING="1")
        if self.lifecycle.open:
            self.lifecycle.move(State.DRAINING)
            log.info("%s: draining, at most %d ms", why, self.config.drain_timeout_ms)
        else:
            self.lifecycle.move(State.STOPPING)
            log.info("%s: stopping once start-up is over", why)
        # Past the fence, every loop has seen the new state: no request admitted after it.
        self.loops.ask()

    def _can_stop(self, now: int) -> bool:
        # Threads inside a runtime's loader cannot be abandoned safely: let them finish.
        if self._loading is not None and self._loading.is_alive():
            return False
        if now >= self._drain_deadline_ns:
            return True
        # Past the stop's fence, every loop took up any switch asked before it (`lanes` counts both generations).
        if not self.loops.fenced():
            return False
        return self.lifecycle.state is State.STOPPING or all(lane.backlog.depth == 0 for lane in self.lanes)

    def _shut_down(self) -> None:
        """Answer everything still held, then close the loops, each reading its sockets dry."""
        while self._news:  # a loader that ended after the last turn: its lanes never opened
            kind, value = self._news.popleft()
            if kind == "loaded" and isinstance(value, Loaded):
                self._retiring.extend(value.lanes.values())
        end = time.monotonic() + self.config.stop_grace_ms / 1000
        unanswered = stop_lanes(self.lanes, end)
        self.loops.close(self.config.default_class, end)
        self.notifier.close()
        self.trimmer.close()
        os.close(self._wake_fd)
        log.info("stopped (%d queued requests answered UNAVAILABLE)", unanswered)
