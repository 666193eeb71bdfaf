"""The daemon's life: bind, load and warm every lane, serve, reload, drain, stop.

Sockets are bound first, so that a client asking during start-up hears `starting`
rather than nothing; inference opens only once every lane is warm, and only then
is systemd told READY. Loading (at start and on SIGHUP) runs on a thread of its
own; the switch to what it loaded happens on the socket loop, between requests.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from edged.config import Config
from edged.config.classes import loop_work_lines
from edged.daemon.lifecycle import Lifecycle, State
from edged.daemon.loading import Loaded, load
from edged.daemon.systemd import Notifier
from edged.daemon.trimmer import Trimmer
from edged.serve.dispatch import Dispatcher
from edged.serve.fd_intake import FdIntake
from edged.serve.lanes.lane import Lane
from edged.serve.prometheus import PrometheusEndpoint
from edged.serve.stats import ClassStats
from edged.serve.transport.server import Server

log = logging.getLogger("edged")

# Python hands the GIL over every 5 ms by default: a reply ready on a lane
# thread could wait that long behind the socket loop. 0.5 ms bounds that wait
# at a small cost in switches.
GIL_SWITCH_INTERVAL_S = 0.0005
TICK_MS = 250
HOUSEKEEPING_EVERY_NS = 10_000_000
FIGURES_WAIT_S = 5.0
STATUS_EVERY_NS = 5_000_000_000


class Daemon:
    """The daemon's life. Its state is `lifecycle`, moved only here, by the thread that
    runs the socket loop (`tick`; the stand-in's `serve_tick` never steers); signal handlers
    and the loader thread only leave news for it (`_stop_asked`, `_reload_asked`, `_loaded`)."""

    def __init__(self, config: Config, reread_config: Callable[[], Config] | None = None) -> None:
        self.config = config
        if config.classes[0].cpu_affinity:
            # The loop runs the highest class's inline work: it runs on that class's cores.
            # Pinned before any thread starts (ZeroMQ's I/O thread among them), which inherit it.
            os.sched_setaffinity(0, config.classes[0].cpu_affinity)
        self.lifecycle = Lifecycle()
        self.server = Server(
            config.endpoints,
            config.max_message_bytes,
            ipc_mode=config.ipc_mode,
            ipc_group=config.ipc_group,
            security=config.security,
            classes=tuple(c.name for c in config.classes) if config.class_sockets else (),
        )
        self.dispatcher = Dispatcher(config, self.server, self.lifecycle)
        try:
            self.fd_intake = FdIntake(config, self.dispatcher.regions)  # memfd regions ([shm]): a thread of its own
        except BaseException:
            self.server.close()
            raise
        # The socket loop's Steering (edged.serve.transport.server): the dispatcher's own, no call between.
        self.handle, self.spin_deadline_ns = self.dispatcher.handle, self.dispatcher.spin_deadline_ns
        self.prometheus: PrometheusEndpoint | None = None
        if config.metrics.prometheus_port:
            try:
                self.prometheus = PrometheusEndpoint(config.metrics, self._figures_from_another_thread)
            except BaseException:
                self.server.close()
                raise
        self.notifier = Notifier()
        self.trimmer = Trimmer()
        self.exit_code = 0
        self._reread_config = reread_config or (lambda: config)
        self._drain_deadline_ns = 0
        self._loading: threading.Thread | None = None
        self._loaded: Loaded | Exception | None = None  # the loader's result, until the loop takes it
        self._reload_asked = False  # by SIGHUP; started by the loop once it serves
        self._stop_asked = 0  # the number of a stopping signal not yet acted on by the loop
        self._retiring: list[Lane] = []  # replaced by a reload (or never opened), finishing what they hold
        self._next_watchdog_ns = 0
        self._next_housekeeping_ns = 0
        self._next_status_ns = 0

    @property
    def lanes(self) -> list[Lane]:
        return [*self.dispatcher.lanes.values(), *self._retiring]

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT, then drain; returns the exit code."""
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_stop_signal)
        signal.signal(signal.SIGHUP, self._on_reload_signal)
        log.info("listening on %s; loading models", ", ".join(self.config.endpoints))
        for line in loop_work_lines(self.config.classes):
            log.info("%s", line)
        self._start_loading(lambda: self.config)
        tick_ms = TICK_MS
        if self.notifier.watchdog_interval_ns:
            tick_ms = min(TICK_MS, self.notifier.watchdog_interval_ns // 4_000_000 or 1)
        try:
            self.server.run(self, tick_ms)
        finally:
            self._shut_down()
        return self.exit_code

    # --- loading, at start and on SIGHUP -------------------------------------

    def _start_loading(self, read_config: Callable[[], Config]) -> None:
        # A reloaded lane keeps its class's counters: stats never jump back to zero.
        stats = {name: lane.stats for name, lane in self.dispatcher.lanes.items()}
        self._loading = threading.Thread(target=self._load, args=(read_config, stats), name="loader", daemon=True)
        self._loading.start()

    def _load(self, read_config: Callable[[], Config], stats: dict[str, ClassStats]) -> None:
        """The loader thread: build, then hand the result (or the failure) to the loop."""
        try:
            self._loaded = load(read_config, stats, self.server, self.dispatcher.pending)
        except Exception as exc:
            self._loaded = exc
        self.server.wake()

    def _reread(self) -> Config:
        return replace(self._reread_config(), endpoints=self.config.endpoints)

    def _take_loaded(self, result: Loaded | Exception) -> None:
        """Open what the loader built, or report why it could not (on the loop's thread)."""
        state = self.lifecycle.state
        if isinstance(result, Exception):
            if state in (State.STARTING, State.STOPPING):
                log.error("start-up failed: %s", result)
                self.exit_code = 1
                if state is State.STARTING:
                    self.lifecycle.move(State.STOPPING)
                return
            log.error("reload refused, still serving the previous configuration: %s", result)
            self.notifier.notify(READY="1", STATUS=f"reload refused: {result}")
            if state is State.RELOADING:
                self.lifecycle.move(State.SERVING)
            return
        if self.lifecycle.stopping:  # built, but never opened
            for lane in result.lanes.values():
                lane.retire()
            self._retiring.extend(result.lanes.values())
            return
        first = state is State.STARTING
        served = f"{', '.join(m.name for m in result.models)} with classes {', '.join(result.lanes)}"
        loaded = "loaded" if first else "reload loaded"
        log.info("%s %s (%.1f s); warming the loop's own runners", loaded, served, result.seconds)
        old = list(self.dispatcher.lanes.values())

        def warm() -> None:
            for lane in result.lanes.values():
                lane.warm_on_loop()

        # A dear model's warm-up takes a while: the stand-in serves meanwhile, where there is one.
        if not self.server.run_aside(warm):
            warm()
        self.config = result.config
        self.dispatcher.serve(
            result.config,
            result.models,
            result.lanes,
            result.reservations,
            result.memory,
            result.fixed_rows,
            result.failed,
            result.open_ipc,
        )
        self.lifecycle.move(State.SERVING)
        for lane in old:
            lane.retire()
        self._retiring.extend(old)
        # Start-up garbage stays put: the collector never walks it again.
        gc.collect()
        gc.freeze()
        self.notifier.notify(READY="1", STATUS=self.dispatcher.status_line())
        if first:
            log.info("ready on %s", ", ".join(self.config.endpoints))
        else:
            log.info("reloaded: now serving %s", served)

    def _on_reload_signal(self, _signum: int, _frame: object) -> None:
        self._reload_asked = True
        self.server.wake()

    # --- the loop's housekeeping ---------------------------------------------

    def _figures_from_another_thread(self) -> dict[str, Any]:
        """The stats op's figures, for a reader off the loop (the Prometheus endpoint):
        the loop, which owns the lanes and the daemon-wide counts, reads them. A loop that
        does not answer within FIGURES_WAIT_S fails the scrape, which is the truth about
        such a loop."""
        return self.server.ask(self.dispatcher.stats, FIGURES_WAIT_S)

    def tick(self) -> None:
        """The steering thread's turn: serve's housekeeping, then act on the news left
        for it (a stop, a finished load, a reload asked). Only this thread moves the
        daemon's life; the stand-in's turns run `serve_tick`."""
        news = self._loaded is not None or self._reload_asked or self._stop_asked
        if not self._housekeeping() and not news:
            return
        self.lifecycle.check_owner()
        if self._stop_asked:
            signum, self._stop_asked = self._stop_asked, 0
            self._stop(signum)
        if self._loaded is not None:
            result, self._loaded = self._loaded, None
            self._take_loaded(result)
        if self._reload_asked and self.lifecycle.state is State.SERVING and not self._loading_busy():
            self._reload_asked = False
            log.info("SIGHUP: re-reading the configuration and the model repository")
            self.notifier.notify(RELOADING="1", STATUS="reloading")
            self.lifecycle.move(State.RELOADING)
            self._start_loading(self._reread)
        self._retiring = [lane for lane in self._retiring if lane.alive]
        now = time.monotonic_ns()
        if now >= self._next_status_ns and self.lifecycle.open:
            self.notifier.notify(STATUS=self.dispatcher.status_line())
            self._next_status_ns = now + STATUS_EVERY_NS

    def serve_tick(self) -> None:
        """The stand-in's turn: serving's housekeeping alone, for it never steers."""
        self._housekeeping()

    def _housekeeping(self) -> bool:
        """At a cadence, on whichever thread serves: ping the watchdog, look for stuck
        workers, ask for what a burst left resident to be given back, forget the shared
        memory of clients long silent. Whether it ran."""
        now = time.monotonic_ns()
        # The loop wakes for every request; housekeeping needs a cadence, not a per-request cost.
        if now < self._next_housekeeping_ns:
            return False
        self._next_housekeeping_ns = now + HOUSEKEEPING_EVERY_NS
        if self.notifier.watchdog_interval_ns and now >= self._next_watchdog_ns:
            # From the serving loop itself: if the loop hangs, the pings stop and systemd restarts us.
            self.notifier.notify(WATCHDOG="1")
            self._next_watchdog_ns = now + self.notifier.watchdog_interval_ns
        for lane in self.dispatcher.lanes.values():
            lane.check_stuck(now)
        self.trimmer.check(now)
        self.dispatcher.regions.sweep(now)
        return True

    def _loading_busy(self) -> bool:
        return self._loading is not None and self._loading.is_alive()

    # --- stopping ------------------------------------------------------------

    def _on_stop_signal(self, signum: int, _frame: object) -> None:
        # Handlers run on the main thread, which is not always the loop (it may be inside
        # a call, a stand-in serving: edged.serve.transport.server): the loop's tick acts on it.
        self._stop_asked = signum
        self.server.wake()

    def _stop(self, signum: int) -> None:
        """Begin the drain, or the stop if inference never opened (the loop, on a signal)."""
        if self.lifecycle.stopping:
            return
        self._drain_deadline_ns = time.monotonic_ns() + self.config.drain_timeout_ms * 1_000_000
        self.notifier.notify(STOPPING="1")
        # Workers send their replies themselves: while it drains, the loop must hear of each
        # at once, to stop as soon as the lanes are empty.
        self.server.wake_on_reply = True
        if self.lifecycle.open:
            self.lifecycle.move(State.DRAINING)
            log.info("%s: draining, at most %d ms", signal.Signals(signum).name, self.config.drain_timeout_ms)
        else:
            self.lifecycle.move(State.STOPPING)
            log.info("%s: stopping once start-up is over", signal.Signals(signum).name)

    def keep_running(self) -> bool:
        if not self.lifecycle.stopping:
            return True
        # Threads inside a runtime's loader cannot be abandoned safely: let them finish.
        if self._loading_busy():
            return True
        if self.lifecycle.state is State.STOPPING:
            return False
        idle = all(lane.backlog.depth == 0 for lane in self.lanes)
        return not idle and time.monotonic_ns() < self._drain_deadline_ns

    def _shut_down(self) -> None:
        if self._loaded is not None:  # the loader ended after the loop's last tick
            result, self._loaded = self._loaded, None
            self._take_loaded(result)
        lanes = self.lanes
        unanswered = sum(lane.reject_queued("the daemon is shutting down") for lane in lanes)
        # A call already inside the backend cannot be cut short: wait for its reply,
        # so that nothing admitted goes unanswered (systemd's TimeoutStopSec is the backstop).
        end = time.monotonic() + self.config.stop_grace_ms / 1000
        for lane in lanes:
            lane.stop(timeout_s=max(end - time.monotonic(), 0.0))
        message = "the daemon stopped before this backend call returned"
        cut_short = sum(lane.answer_open_calls(message) for lane in lanes)
        if cut_short:
            log.error("%d requests were still inside the backend at exit: answered INTERNAL", cut_short)
        self.server.flush()
        self.server.close()
        self.fd_intake.close()
        if self.prometheus is not None:
            self.prometheus.close()
        self.notifier.close()
        self.trimmer.close()
        log.info("stopped (%d queued requests answered UNAVAILABLE)", unanswered)
