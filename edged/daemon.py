"""The daemon's life: bind, load and warm every lane, serve, drain, stop.

Sockets are bound first, so that a client asking during start-up hears `starting`
rather than nothing; inference opens only once every lane is warm.
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
import threading
import time

from edged.backends import backend_named
from edged.config import Config
from edged.dispatch import DRAINING, SERVING, Dispatcher
from edged.lanes import Lane
from edged.repository import discover
from edged.server import Server

log = logging.getLogger("edged")

# Python hands the GIL over every 5 ms by default: a reply ready on a lane
# thread could wait that long behind the socket loop. 0.5 ms bounds that wait
# at a small cost in switches.
GIL_SWITCH_INTERVAL_S = 0.0005
TICK_MS = 250


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.server = Server(config.endpoints, config.max_message_bytes)
        self.dispatcher = Dispatcher(config, self.server.reply)
        self.lanes: dict[str, Lane] = {}
        self.exit_code = 0
        self._stop_requested = False
        self._drain_deadline_ns = 0

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT, then drain; returns the exit code."""
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_stop_signal)
        log.info("listening on %s; loading models", ", ".join(self.config.endpoints))
        threading.Thread(target=self._load, name="loader", daemon=True).start()
        try:
            self.server.run(self.dispatcher.handle, self._keep_running, TICK_MS)
        finally:
            self._shut_down()
        return self.exit_code

    def _load(self) -> None:
        started = time.monotonic()
        try:
            models = discover(self.config.model_repository, self.config.backend, self.config.models)
            backend = backend_named(self.config.backend)
            for klass in self.config.classes:
                lane = Lane(klass, models, backend, self.server.reply)
                lane.start()
                self.lanes[klass.name] = lane
        except Exception as exc:
            log.error("start-up failed: %s", exc)
            self.exit_code = 1
            self._stop_requested = True
            self.server.wake()
            return
        # Start-up garbage stays put: the collector never walks it again.
        gc.collect()
        gc.freeze()
        self.dispatcher.serve(models, self.lanes)
        log.info(
            "ready: serving %s on %s with classes %s (%.1f s)",
            ", ".join(m.name for m in models),
            ", ".join(self.config.endpoints),
            ", ".join(self.lanes),
            time.monotonic() - started,
        )

    def _on_stop_signal(self, signum: int, _frame: object) -> None:
        if self._stop_requested:
            return
        self._stop_requested = True
        self._drain_deadline_ns = time.monotonic_ns() + self.config.drain_timeout_ms * 1_000_000
        if self.dispatcher.state == SERVING:
            self.dispatcher.state = DRAINING
        log.info("%s: draining, at most %d ms", signal.Signals(signum).name, self.config.drain_timeout_ms)
        self.server.wake()

    def _keep_running(self) -> bool:
        if not self._stop_requested:
            return True
        if self.dispatcher.state != DRAINING:
            return False
        idle = all(lane.backlog.depth == 0 for lane in self.lanes.values())
        return not idle and time.monotonic_ns() < self._drain_deadline_ns

    def _shut_down(self) -> None:
        lanes = list(self.lanes.values())  # the loader may still be adding lanes
        unanswered = sum(lane.reject_queued("the daemon is shutting down") for lane in lanes)
        for lane in lanes:
            lane.stop(timeout_s=1.0)
        self.server.flush()
        self.server.close()
        log.info("stopped (%d queued requests answered UNAVAILABLE)", unanswered)
